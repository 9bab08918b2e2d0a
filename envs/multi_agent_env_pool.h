// agentrt::MultiAgentEnvPool — N copies of a MultiAgentEnv stepped as one batch
// (EnvPool's engine and contract, with every seat of every world exposed), so
// that one caller can act for all seats at once: its own learner's and the
// opponents' (e.g. policies received over the bus, run batched on a GPU).
//
//   auto pool = MultiAgentEnvPool::Make([&] { return MakePursuit({}); }, {.num_envs = 64});
//   pool->Reset();
//   loop: fill pool->actions(); pool->Step();
//
// Buffers are flat, world i seat a at [(i * A + a) * size, ... + size), A = num_agents():
//   observations(), final_observations()  as in EnvPool, per seat
//   actions()                             per seat (a seat that is not active() is ignored)
//   rewards()                             [i * A + a]: seat a's reward of the step just taken
//   active()                              [i * A + a]: 1 while seat a is in world i's episode;
//                                         like observations(), it describes the episode to act
//                                         in next (after an auto-reset: the new episode's seats)
//   terminated(), truncated()             [i]: world i's episode ended in this step
//   episode_returns()                     [i * A + a], where world i's episode ended
//   episode_lengths()                     [i], where world i's episode ended
//
// Determinism and threads as in EnvPool (envs/env_pool.h). Not thread-safe.
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
#include "envs/env_pool.h"

namespace agentrt {

class MultiAgentEnvPool : public PoolBase<MultiAgentEnv> {
 public:
  using Factory = std::function<Result<std::unique_ptr<MultiAgentEnv>>()>;

  static Result<std::unique_ptr<MultiAgentEnvPool>> Make(const Factory& factory,
                                                         const EnvPoolOptions& options);

  int num_agents() const { return num_agents_; }

  void Reset(std::optional<uint64_t> seed = std::nullopt);
  // Steps every world with actions(); auto-resets the ones whose episode ended.
  // Does not allocate.
  void Step();

  std::span<const uint8_t> active() const { return buf_.active; }

 private:
  MultiAgentEnvPool(std::vector<std::unique_ptr<MultiAgentEnv>> envs,
                    const EnvPoolOptions& options);
  void StepRange(int begin, int end);

  int num_agents_;
};

}  // namespace agentrt
