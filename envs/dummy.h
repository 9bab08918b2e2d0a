// The dummy env: the tutorial for writing an environment (cf. EnvPool's dummy/).
//
// The task is tiny on purpose: every step shows the agent one of `n` lights
// (a one-hot observation) and pays 1.0 when the agent names that light
// (action == lit index), 0.0 otherwise. An episode lasts `length` steps and
// then is truncated. A learner that works solves it in a few updates, so it
// doubles as a smoke test for learners.
//
// To write your own env:
//   1. Derive from agentrt::Env (envs/env.h) and build your Spaces once, in the
//      constructor: observation_space() and action_space() return references.
//   2. Reset(seed, obs): reseed your Rng when a seed is given (so the same seed
//      replays the same episode), set up the episode, write the first
//      observation into `obs`.
//   3. Step(action, obs): read the action, advance the world, write the next
//      observation, return {reward, terminated, truncated}. Step runs in the
//      hot loop of EnvPool on worker threads: no allocation, no logging, no
//      locks; keep everything it touches preallocated in the object.
//   4. Write a factory `Result<std::unique_ptr<Env>> Make...(const json&)` that
//      reads parameters with agentrt::Params (envs/params.h) so typos and bad
//      values fail with a message naming the key.
//   5. Register it: `GlobalEnvRegistry().RegisterEnv("name", factory)` (see
//      envs/registry.h); then agent-worker builds it from the plan's args:
//      `args: {env: name, env_args: {...}}`.
// The implementation, in dummy.cc, is commented line by line.
//
// Parameters: {"n": 4, "length": 16}.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>

#include "common/status.h"
#include "envs/env.h"
#include "envs/rng.h"

namespace agentrt {

class DummyEnv final : public Env {
 public:
  DummyEnv(int n, int length);

  const Space& observation_space() const override { return observation_space_; }
  const Space& action_space() const override { return action_space_; }
  void Reset(std::optional<uint64_t> seed, std::span<float> obs) override;
  StepResult Step(std::span<const float> action, std::span<float> obs) override;

  int lit() const { return lit_; }

 private:
  // Lights a new random index and writes the one-hot observation.
  void LightAndObserve(std::span<float> obs);

  int n_;
  int length_;
  Space observation_space_;  // Box({n}, 0, 1): one-hot
  Space action_space_;       // Discrete(n)
  Rng rng_;                  // the env's own random stream; reseeded by Reset(seed)
  int lit_ = 0;              // the index the agent should name this step
  int elapsed_ = 0;          // steps taken in the current episode
};

Result<std::unique_ptr<Env>> MakeDummyEnv(const nlohmann::json& params);

}  // namespace agentrt
