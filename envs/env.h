// agentrt::Env and agentrt::MultiAgentEnv — the environment interfaces.
//
// The shape of Gymnasium's API (reset(seed) / step -> obs, reward, terminated,
// truncated) with caller-owned flat float buffers, so that stepping does not
// allocate: the caller passes the spans, the env writes into them.
//
//   terminated  the episode reached a terminal state of the MDP (no bootstrap)
//   truncated   the episode was cut short (time limit); the value of the final
//               observation should be bootstrapped
// After either, the caller must Reset before stepping again.
//
// Actions: a Discrete action is one float holding the index (0.0f, 1.0f, ...);
// a Box action is action_space().size() floats.
//
// Thread-safety: an env instance is used by one thread at a time; distinct
// instances are independent (EnvPool steps them on different threads).
// See envs/dummy.h for a commented walk-through of writing one.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "envs/space.h"

namespace agentrt {

struct StepResult {
  float reward = 0.0f;
  bool terminated = false;
  bool truncated = false;
};

class Env {
 public:
  virtual ~Env() = default;

  virtual const Space& observation_space() const = 0;
  virtual const Space& action_space() const = 0;

  // Starts a new episode and writes its first observation into `obs`
  // (observation_space().size() floats). With a seed, the env's random stream
  // restarts from it (same seed, same episode); without, it continues.
  virtual void Reset(std::optional<uint64_t> seed, std::span<float> obs) = 0;

  // Applies `action` (action_space().size() floats) and writes the next
  // observation into `obs`. Must not allocate. Out-of-range discrete actions
  // are clamped into range (programmer error in debug builds).
  virtual StepResult Step(std::span<const float> action, std::span<float> obs) = 0;
};

// Several agents acting at once in one world (PettingZoo's parallel API).
// Agent i's observation lives at obs[i * obs_size, (i + 1) * obs_size) where
// obs_size = observation_space().size(); actions likewise with action_space();
// rewards[i] is agent i's reward. Every agent has the same spaces.
// `terminated`/`truncated` are for the whole episode; an agent that is out of
// the game earlier (e.g. a caught prey) sees zero observations and rewards and
// its actions are ignored (see active()).
class MultiAgentEnv {
 public:
  virtual ~MultiAgentEnv() = default;

  virtual int num_agents() const = 0;
  // E.g. "predator_0", "prey_1".
  virtual std::string_view agent_name(int agent) const = 0;
  virtual const Space& observation_space() const = 0;
  virtual const Space& action_space() const = 0;

  // `obs` holds num_agents() * observation_space().size() floats.
  virtual void Reset(std::optional<uint64_t> seed, std::span<float> obs) = 0;

  struct StepOutcome {
    bool terminated = false;
    bool truncated = false;
  };
  // `actions`: num_agents() * action_space().size() floats; `rewards`:
  // num_agents() floats. Must not allocate.
  virtual StepOutcome Step(std::span<const float> actions, std::span<float> obs,
                           std::span<float> rewards) = 0;

  // False once agent `agent` has left the current episode.
  virtual bool active(int agent) const = 0;

  // A world of sides (envs/world_sides.h): the number of seats of each side,
  // in seat order; empty for a world without sides.
  virtual std::vector<int> side_seats() const { return {}; }
  // What the current (or just ended) episode scored for the scoring side
  // (WorldSides::score; pursuit: prey caught); 0 in a world that counts nothing.
  virtual double episode_score() const { return 0; }
};

}  // namespace agentrt
