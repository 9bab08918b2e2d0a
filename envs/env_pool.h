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
#include <string_view>
#include <utility>
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

// The step buffers of a pool, seat-major within an env (one seat for EnvPool):
// what EnvPool and MultiAgentEnvPool hand out, in one place.
struct PoolBuffers {
  std::vector<float> obs, final_obs, actions, rewards, episode_returns, running_returns;
  std::vector<uint8_t> active, terminated, truncated;  // active: per seat (multi-agent only)
  std::vector<int32_t> episode_lengths, running_lengths;

  // Zeroed buffers for `envs` envs of `seats` seats each; `active` when seats > 0
  // is asked for (a multi-agent pool), every seat active.
  void Assign(size_t envs, size_t seats, size_t obs_size, size_t act_size, bool with_active);
};

// What both pools share: their copies and sizes, the step buffers and the
// spans over them, and the threads that step them (declared last, so they
// stop before the buffers and the copies go). A pool adds its own Reset, Step
// and extra spans (the multi-agent pool's active()).
template <typename EnvT>
class PoolBase {
 public:
  PoolBase(const PoolBase&) = delete;
  PoolBase& operator=(const PoolBase&) = delete;

  int num_envs() const { return num_envs_; }
  int num_threads() const { return runner_->threads(); }
  const Space& observation_space() const { return envs_.front()->observation_space(); }
  const Space& action_space() const { return envs_.front()->action_space(); }
  size_t obs_size() const { return obs_size_; }
  size_t act_size() const { return act_size_; }
  // Direct access to copy i (not while Step() runs).
  EnvT& env(int i) { return *envs_[static_cast<size_t>(i)]; }

  std::span<float> actions() { return buf_.actions; }
  std::span<const float> observations() const { return buf_.obs; }
  std::span<const float> final_observations() const { return buf_.final_obs; }
  std::span<const float> rewards() const { return buf_.rewards; }
  std::span<const uint8_t> terminated() const { return buf_.terminated; }
  std::span<const uint8_t> truncated() const { return buf_.truncated; }
  std::span<const float> episode_returns() const { return buf_.episode_returns; }
  std::span<const int32_t> episode_lengths() const { return buf_.episode_lengths; }

 protected:
  PoolBase(std::vector<std::unique_ptr<EnvT>> envs, const EnvPoolOptions& options)
      : num_envs_(options.num_envs),
        seed_(options.seed),
        obs_size_(envs.front()->observation_space().size()),
        act_size_(envs.front()->action_space().size()),
        envs_(std::move(envs)) {}
  ~PoolBase() = default;

  int num_envs_;
  uint64_t seed_;
  size_t obs_size_;
  size_t act_size_;
  std::vector<std::unique_ptr<EnvT>> envs_;
  PoolBuffers buf_;
  std::unique_ptr<ChunkRunner> runner_;
};

// InvalidArgument, naming `pool`, when options ask for no envs or no threads.
Status CheckPoolOptions(const EnvPoolOptions& options, std::string_view pool);

class EnvPool : public PoolBase<Env> {
 public:
  // Called num_envs times, on the calling thread, to build the copies.
  using Factory = std::function<Result<std::unique_ptr<Env>>()>;

  static Result<std::unique_ptr<EnvPool>> Make(const Factory& factory,
                                               const EnvPoolOptions& options);

  // Resets every env with its seed (options.seed + i, or `seed` + i when given).
  void Reset(std::optional<uint64_t> seed = std::nullopt);
  // Steps every env with actions(); auto-resets the ones whose episode ended.
  // Does not allocate.
  void Step();

 private:
  EnvPool(std::vector<std::unique_ptr<Env>> envs, const EnvPoolOptions& options);
  void StepRange(int begin, int end);
};

}  // namespace agentrt
