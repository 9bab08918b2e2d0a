// pursuit — a predator–prey gridworld (multi-agent, parallel stepping).
//
// World: a width x height grid with walls around it. Agents 0..P-1 are
// predators ("predator_0"...), agents P..P+Q-1 are prey ("prey_0"...). Every
// step each active agent picks one of 5 moves (Discrete(5)): 0 stay, 1 up,
// 2 down, 3 left, 4 right; a move into the wall leaves it in place. Agents may
// share a cell. All move at once; then the capture rule is applied:
//
//   capture: a prey is caught when at least `capture_k` predators are within
//   Manhattan distance `capture_range` of it (range 1: on it or adjacent).
//   Each of those predators earns `capture_reward`; the prey gets
//   -capture_reward and leaves the episode (zero observations, ignored actions).
//
// The episode terminates when every prey is caught and is truncated after
// `max_steps` steps.
//
// Reward shaping (so a policy learns within a few thousand updates, not
// millions of steps): a potential-based term `shaping * (d_before - d_after)`
// for a predator, d = Manhattan distance to the nearest active prey; the
// mirror image `shaping * (d_after - d_before)` for a prey, d = distance to the
// nearest predator; and a per-step `-step_penalty` for predators (hurry) and
// `+step_penalty` for prey still free (survive).
//
// Observation (partial): a (2r+1)x(2r+1) window centred on the agent, r =
// `obs_radius`, with 3 channels stored channel-major — [outside the grid,
// predators in cell (count), active prey in cell (count)] — followed by 3
// scalars: x / (width-1), y / (height-1), and 1 for a predator / 0 for a prey.
// Box({3*(2r+1)^2 + 3}).
//
// Parameters: AGENTRT_PURSUIT_SETTINGS below, with their defaults.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/status.h"
#include "envs/env.h"
#include "envs/params.h"
#include "envs/rng.h"
#include "envs/world_sides.h"

namespace agentrt {

#define AGENTRT_PURSUIT_SETTINGS(X)                                                          \
  X(int, width, 7, "grid width")                                                             \
  X(int, height, 7, "grid height; default: the width")                                       \
  X(int, predators, 2, "predators (agents 0..P-1)")                                          \
  X(int, prey, 1, "prey (agents P..P+Q-1)")                                                  \
  X(int, obs_radius, 2, "r of the (2r+1)x(2r+1) observation window")                         \
  X(int, capture_k, 2, "predators within capture_range that catch a prey")                   \
  X(int, capture_range, 1, "Manhattan distance a catching predator is within")               \
  X(int, max_steps, 60, "steps before the episode is truncated")                             \
  X(float, capture_reward, 1.0f, "reward of each catching predator; the prey's is minus it") \
  X(float, shaping, 0.05f, "weight of the potential-based distance term")                    \
  X(float, step_penalty, 0.01f, "per-step cost of predators and bonus of free prey")

struct PursuitConfig {
  AGENTRT_PURSUIT_SETTINGS(AGENTRT_PARAM_FIELD)

  // Reads the parameters above by name; errors name the key.
  static Result<PursuitConfig> FromJson(const nlohmann::json& params);
};

class Pursuit final : public MultiAgentEnv {
 public:
  enum Move { kStay = 0, kUp = 1, kDown = 2, kLeft = 3, kRight = 4 };
  struct Cell {
    int x = 0;
    int y = 0;
  };

  explicit Pursuit(const PursuitConfig& config);

  int num_agents() const override { return config_.predators + config_.prey; }
  std::string_view agent_name(int agent) const override { return names_[agent]; }
  const Space& observation_space() const override { return observation_space_; }
  const Space& action_space() const override { return action_space_; }
  void Reset(std::optional<uint64_t> seed, std::span<float> obs) override;
  StepOutcome Step(std::span<const float> actions, std::span<float> obs,
                   std::span<float> rewards) override;
  bool active(int agent) const override { return active_[agent] != 0; }
  // Predators, then prey.
  std::vector<int> side_seats() const override { return {config_.predators, config_.prey}; }
  // Prey caught in the episode.
  double episode_score() const override { return captures_; }

  const PursuitConfig& config() const { return config_; }
  bool is_predator(int agent) const { return agent < config_.predators; }
  // Prey caught so far in the current episode.
  int captures() const { return captures_; }
  int elapsed_steps() const { return elapsed_; }
  // Positions, for tests and renderers; set_position is for tests that build a
  // scene (observations are refreshed by the next Step or by Observe()).
  Cell position(int agent) const { return pos_[agent]; }
  void set_position(int agent, Cell cell) { pos_[agent] = cell; }
  void Observe(std::span<float> obs);

 private:
  int Distance(Cell a, Cell b) const;
  int NearestPreyDistance(int predator) const;
  int NearestPredatorDistance(int prey) const;
  void RebuildGrid();

  PursuitConfig config_;
  Space observation_space_;
  Space action_space_;
  std::vector<std::string> names_;
  std::vector<Cell> pos_;
  std::vector<unsigned char> active_;
  std::vector<int> before_;  // shaping distances before the move, per agent
  std::vector<float> predator_grid_;
  std::vector<float> prey_grid_;
  std::vector<int> catchers_;  // scratch: predators in range of one prey
  Rng rng_;
  int captures_ = 0;
  int elapsed_ = 0;
};

Result<std::unique_ptr<MultiAgentEnv>> MakePursuit(const nlohmann::json& params);

// Pursuit's sides: "predator" (the scoring side: it catches) and "prey". A
// world for the plan's agents has as many predators as agents play them (at
// least capture_k) and as many prey (at least 1), unless env_args says;
// a league match is one predator against one prey with capture_k 1.
WorldSides PursuitSides();

}  // namespace agentrt
