// agentrt::PpoTrainer — PPO on an env from the registry: this rank's EnvPool
// plus a PpoLearner over the agent's Group. What agent-worker drives:
//
//   auto cfg = PpoTrainerConfig::FromJson(plan_args);       // names below
//   auto trainer = PpoTrainer::Make(*cfg, group);
//   while (trainer->env_steps() < cfg->ppo.steps) {
//     TrainerMetrics m;
//     AGENTRT_RETURN_IF_ERROR(trainer->Iterate(&m));        // one rollout + update
//     report(m);  // and checkpoint trainer->SaveState() on schedule
//   }
//
// args: {"env": "cartpole", "env_args": {...}, "env_threads": 1,
//        "episode_window": 20, ...every PpoConfig key (learners/ppo.h)}.
// Each rank seeds its envs differently (seed, rank), so N ranks collect N
// times the experience; env_steps() counts the whole group's steps.
// Every rank must call Iterate the same number of times (collectives).
// Not thread-safe.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <vector>

#include "agent_runtime/group.h"
#include "common/status.h"
#include "envs/env_pool.h"
#include "envs/registry.h"
#include "learners/ppo.h"

namespace agentrt {

struct PpoTrainerConfig {
  std::string env = "cartpole";       // registry name
  nlohmann::json env_args = nullptr;  // the env's parameters
  int env_threads = 1;                // EnvPool threads per rank (caller included)
  int episode_window = 20;            // episodes averaged into episode_return_mean
  PpoConfig ppo;

  void Read(Params& p);
  static Result<PpoTrainerConfig> FromJson(const nlohmann::json& args);
};

struct TrainerMetrics {
  int64_t env_steps = 0;             // the group's env steps so far
  int64_t episodes = 0;              // episodes finished on this rank
  float episode_return_mean = 0.0f;  // last `episode_window` episodes, averaged over ranks
  float episode_length_mean = 0.0f;
  int window_episodes = 0;   // episodes in this rank's window (< window early on)
  double steps_per_s = 0.0;  // the group's env steps per second, last iteration
  PpoMetrics ppo;

  nlohmann::json ToJson() const;
};

class PpoTrainer {
 public:
  static Result<std::unique_ptr<PpoTrainer>> Make(
      const PpoTrainerConfig& config, Group& group,
      const EnvRegistry& registry = GlobalEnvRegistry());

  const PpoTrainerConfig& config() const { return config_; }
  PpoLearner& learner() { return *learner_; }
  EnvPool& pool() { return *pool_; }
  int64_t env_steps() const { return env_steps_; }

  // One rollout of rollout_steps x num_envs steps on this rank, then one update.
  Status Iterate(TrainerMetrics* metrics);

  // Learner state plus env-step count and episode window, as bytes. The envs
  // themselves restart fresh (seeded from the step count) after LoadState.
  std::vector<uint8_t> SaveState() const;
  Status LoadState(std::span<const uint8_t> state);

 private:
  PpoTrainer(const PpoTrainerConfig& config, Group& group) : config_(config), group_(group) {}

  PpoTrainerConfig config_;
  Group& group_;
  std::unique_ptr<EnvPool> pool_;
  std::unique_ptr<PpoLearner> learner_;
  int64_t env_steps_ = 0;
  int64_t episodes_ = 0;
  std::deque<std::pair<float, int32_t>> window_;  // (return, length)
};

}  // namespace agentrt
