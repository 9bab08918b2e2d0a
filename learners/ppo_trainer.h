// agentrt::PpoTrainer — the one PPO training loop: this rank's EnvPool plus a
// PpoLearner over the agent's Group. agent-worker drives it (with the league's
// env factory and its save/stop agreement), and so do the acceptance tests:
//
//   auto cfg = PpoTrainerConfig::FromJson(plan_args);       // names below
//   auto trainer = PpoTrainer::Make(*cfg, group);
//   while (trainer->env_steps() < cfg->ppo.steps) {
//     TrainerMetrics m;
//     float agree[2] = {save_due, stop};                    // summed over the group
//     AGENTRT_RETURN_IF_ERROR(trainer->Iterate(&m, agree)); // one rollout + update
//     report(m.ToJson());  // and checkpoint trainer->SaveState() on schedule
//   }
//
// args: {"env": "cartpole", "env_args": {...}, "env_threads": 1,
//        "episode_window": 20, ...every PpoConfig key (learners/ppo_config.h)}.
// Each rank seeds its envs differently (seed, rank), and afresh after a resume
// (seed, rank, env step), so N ranks collect N times the experience;
// env_steps() counts the whole group's steps. Every rank must call Iterate the
// same number of times with the same number of `agree` values (collectives).
// Not thread-safe.
#pragma once

#include <array>
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
#include "learners/ppo_config.h"

namespace agentrt {

struct TrainerMetrics {
  int64_t env_steps = 0;           // the group's env steps so far
  int64_t episodes = 0;            // episodes the group has finished so far
  int64_t iteration_episodes = 0;  // ... in the last iteration
  // Of the last iteration's episodes, the share that terminated (rather than
  // being truncated at max_steps); in pursuit, the capture rate. 0 when none ended.
  float terminated_fraction = 0.0f;
  float episode_return_mean = 0.0f;  // last `episode_window` episodes, averaged over ranks
  float episode_length_mean = 0.0f;
  int window_episodes = 0;   // episodes in this rank's window (< window early on)
  double steps_per_s = 0.0;  // the group's env steps per second, last iteration
  PpoMetrics ppo;

  // The metric names every PPO agent reports (agentctl status, metrics.jsonl):
  // env_steps, episodes, episode_return_mean, episode_length_mean, steps_per_s,
  // updates, lr, pg_loss, v_loss, entropy, approx_kl, clip_fraction,
  // explained_variance, grad_norm.
  nlohmann::json ToJson() const;
};

struct PpoTrainerOptions {
  // Builds one env copy of this rank's pool; empty: config.env from `registry`.
  EnvPool::Factory env_factory;
  const EnvRegistry* registry = nullptr;  // nullptr: GlobalEnvRegistry()
  // false: play the initial policy and never learn (PpoLearner::Skip), e.g. a
  // league anchor.
  bool learn = true;
};

class PpoTrainer {
 public:
  static Result<std::unique_ptr<PpoTrainer>> Make(const PpoTrainerConfig& config, Group& group,
                                                  PpoTrainerOptions options = {});

  const PpoTrainerConfig& config() const { return config_; }
  PpoLearner& learner() { return *learner_; }
  EnvPool& pool() { return *pool_; }
  int64_t env_steps() const { return env_steps_; }
  int64_t episodes() const { return episodes_; }  // the group's, so far

  // One rollout of rollout_steps x num_envs steps on this rank, then one
  // update. `agree` (optional): values of this rank that come back summed over
  // the group, in the same all-reduce as the episode statistics — how ranks
  // agree on collective decisions (save now, stop now).
  Status Iterate(TrainerMetrics* metrics, std::span<float> agree = {});

  // The episode statistics as they stand (this rank's window: e.g. right
  // after LoadState, before any iteration), without stepping.
  TrainerMetrics WindowMetrics() const;

  // Learner state plus env-step count and episode window, as bytes. The envs
  // themselves restart fresh (seeded from the step count) after LoadState.
  std::vector<uint8_t> SaveState() const;
  Status LoadState(std::span<const uint8_t> state);

  // The same state as slices of global arrays, which restore at any world
  // size: the learner's under "ppo.", "trainer.common" (rank 0: env steps and
  // episodes, the group's) and "trainer.window" (one row per rank: its
  // episode window). What it points at stays valid until the next AddTo.
  void AddTo(CheckpointState& state);
  // True when `saved` holds a state saved by AddTo.
  static bool SavedIn(const SavedStep& saved);
  // Loads this rank's part of a state saved by AddTo with any world size. A
  // rank the saving group did not have starts with an empty episode window;
  // the envs restart fresh, seeded from the rank and step count, as after LoadState.
  Status LoadFrom(const SavedStep& saved);

 private:
  PpoTrainer(const PpoTrainerConfig& config, Group& group, bool learn)
      : config_(config), group_(group), learn_(learn) {}

  PpoTrainerConfig config_;
  Group& group_;
  bool learn_ = true;
  std::unique_ptr<EnvPool> pool_;
  std::unique_ptr<PpoLearner> learner_;
  int64_t env_steps_ = 0;
  int64_t episodes_ = 0;                          // the group's
  std::vector<float> stats_;                      // all-reduce scratch, reused
  std::deque<std::pair<float, int32_t>> window_;  // (return, length)
  std::array<int64_t, 2> saved_common_{};         // AddTo's (env steps, episodes)
  std::vector<uint8_t> saved_window_;             // and this rank's window row
};

}  // namespace agentrt
