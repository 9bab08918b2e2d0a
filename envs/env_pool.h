// agentrt::EnvPool — N copies of an env stepped as one batch by worker threads
// (EnvPool's design: preallocated batch buffers, auto-reset, no allocation on
// the step path).
//
//   auto pool = EnvPool::Make([&] { return MakeCartPole({}); }, {.num_envs = 8,
//                                                                 .num_threads = 2});
//   pool->Reset();                               // obs of every env
//   loop: fill pool->actions(); pool->Step();    // obs, rewards, flags of every env
//
// Buffers are flat, env i at [i * size, (i + 1) * size):
//   observations()       the observation to act on next. For an env whose
//                        episode just ended, this is already the first
//                        observation of its next episode (auto-reset)...
//   final_observations() ...and this holds the last observation of the ended
//                        one (for bootstrapping a truncated episode). Only
//                        meaningful where terminated or truncated is set.
//   rewards(), terminated(), truncated()  of the step just taken
//   episode_returns(), episode_lengths()  of the episode that just ended, where
//                        terminated or truncated is set
//
// Determinism: Reset() resets env i with seed `options.seed + i`; later
// auto-resets continue each env's own stream. The results depend on neither
// the number of threads nor their timing.
//
// Threads: `num_threads` threads step the envs, the calling thread included
// (envs/chunk_runner.h: chunks claimed from a shared counter, so a descheduled
// worker does not stall the batch). Step() blocks until every env has
// stepped. Not thread-safe: one caller at a time.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "common/status.h"
#include "envs/chunk_runner.h"
#include "envs/env.h"

namespace agentrt {

struct EnvPoolOptions {
  int num_envs = 8;
  int num_threads = 1;  // the caller counts as one; capped at num_envs
  uint64_t seed = 0;    // env i is first reset with seed + i
};

class EnvPool {
 public:
  // Called num_envs times, on the calling thread, to build the copies.
  using Factory = std::function<Result<std::unique_ptr<Env>>()>;

  static Result<std::unique_ptr<EnvPool>> Make(const Factory& factory,
                                               const EnvPoolOptions& options);
  ~EnvPool();
  EnvPool(const EnvPool&) = delete;
  EnvPool& operator=(const EnvPool&) = delete;

  int num_envs() const { return num_envs_; }
  int num_threads() const { return runner_->threads(); }
  const Space& observation_space() const { return envs_.front()->observation_space(); }
  const Space& action_space() const { return envs_.front()->action_space(); }
  size_t obs_size() const { return obs_size_; }
  size_t act_size() const { return act_size_; }

  // Resets every env with its seed (options.seed + i, or `seed` + i when given).
  void Reset(std::optional<uint64_t> seed = std::nullopt);
  // Steps every env with actions(); auto-resets the ones whose episode ended.
  // Does not allocate.
  void Step();

  std::span<float> actions() { return actions_; }
  std::span<const float> observations() const { return obs_; }
  std::span<const float> final_observations() const { return final_obs_; }
  std::span<const float> rewards() const { return rewards_; }
  std::span<const uint8_t> terminated() const { return terminated_; }
  std::span<const uint8_t> truncated() const { return truncated_; }
  std::span<const float> episode_returns() const { return episode_returns_; }
  std::span<const int32_t> episode_lengths() const { return episode_lengths_; }
  // Direct access to env i (not while Step() runs).
  Env& env(int i) { return *envs_[static_cast<size_t>(i)]; }

 private:
  EnvPool(std::vector<std::unique_ptr<Env>> envs, const EnvPoolOptions& options);
  void StepRange(int begin, int end);

  int num_envs_;
  uint64_t seed_;
  size_t obs_size_;
  size_t act_size_;
  std::vector<std::unique_ptr<Env>> envs_;
  std::vector<float> obs_, final_obs_, actions_, rewards_, episode_returns_, running_returns_;
  std::vector<uint8_t> terminated_, truncated_;
  std::vector<int32_t> episode_lengths_, running_lengths_;
  std::unique_ptr<ChunkRunner> runner_;  // last: its threads stop before the buffers go
};

}  // namespace agentrt
