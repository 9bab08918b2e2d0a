// agentrt::PpoLearner — PPO (Schulman et al. 2017) as the reference
// implementations run it: clipped surrogate objective, GAE(lambda), value
// loss, entropy bonus, several epochs of shuffled minibatches, running
// observation normalisation, per-minibatch advantage normalisation, optional
// linear learning-rate annealing. Networks: learners/actor_critic.h (one flat
// parameter buffer, one flat gradient buffer). Optimiser: agentrt::ShardedAdam
// over the agent's Group, gradients averaged over the ranks — so with N ranks
// each update learns from N times the samples, each rank having collected its
// own share in its own env copies.
//
// A driver (PpoTrainer, or your own loop) fills a rollout of `rollout_steps`
// steps of `num_envs` envs, then calls Update:
//
//   for t in [0, rollout_steps):
//     learner.ActAndRecord(obs, actions);        // policy picks, rollout records
//     ...step the envs with `actions`...
//     learner.RecordStep(rewards, terminated, truncated, final_obs);
//   learner.Update(obs_after_last_step, &metrics);  // collective over the group
//
// Every rank of the group must call Update the same number of times (it runs
// collectives). Discrete action spaces only (a categorical policy).
// Not thread-safe.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <vector>

#include "agent_runtime/group.h"
#include "agent_runtime/sharded_adam.h"
#include "common/status.h"
#include "envs/rng.h"
#include "envs/space.h"
#include "learners/actor_critic.h"
#include "learners/obs_normalizer.h"
#include "learners/ppo_config.h"

namespace agentrt {

struct PpoMetrics {
  int64_t updates = 0;   // updates done so far
  float lr = 0.0f;       // learning rate of the last update
  float pg_loss = 0.0f;  // means over the last update's minibatches
  float v_loss = 0.0f;
  float entropy = 0.0f;
  float approx_kl = 0.0f;
  float clip_fraction = 0.0f;
  float grad_norm = 0.0f;           // global gradient norm before clipping (last minibatch)
  float explained_variance = 0.0f;  // 1 - Var(returns - values) / Var(returns)
  int epochs_run = 0;               // < config.epochs when target_kl stopped early
};

// Generalised advantage estimation over a rollout stored [t][env] row-major
// (T x N): delta_t = r_t + gamma V_{t+1} (1 - done_t) - V_t,
// A_t = delta_t + gamma lambda (1 - done_t) A_{t+1}; returns = A + V.
// done_t means the step t ended its episode; V_T = last_values (N).
void ComputeGae(std::span<const float> rewards, std::span<const float> values,
                std::span<const float> dones, std::span<const float> last_values, float gamma,
                float lambda, std::span<float> advantages, std::span<float> returns);

class PpoLearner {
 public:
  // `group` must outlive the learner; every rank builds its learner with the
  // same config and spaces (parameters start equal: rank 0's are broadcast).
  static Result<std::unique_ptr<PpoLearner>> Make(const PpoConfig& config,
                                                  const Space& observation_space,
                                                  const Space& action_space, Group& group);
  ~PpoLearner();

  const PpoConfig& config() const { return config_; }
  const ActorCritic& network() const { return train_net_; }
  Group& group() { return group_; }
  // The flat parameter buffer (layout: learners/actor_critic.h).
  std::span<const float> parameters() const { return params_; }
  const ObsNormalizer& normalizer() const { return normalizer_; }
  int64_t updates() const { return updates_; }

  // Rollout step t (0-based, in order): samples actions for the num_envs raw
  // observations `obs` (num_envs x obs_size) into `actions` (num_envs), and
  // records them with their log-probabilities and values.
  void ActAndRecord(std::span<const float> obs, std::span<float> actions);
  // The outcome of rollout step t. `final_obs` (raw) is read only for envs
  // with truncated && !terminated: their value is bootstrapped into the reward.
  void RecordStep(std::span<const float> rewards, std::span<const uint8_t> terminated,
                  std::span<const uint8_t> truncated, std::span<const float> final_obs);
  bool rollout_full() const { return step_ == config_.rollout_steps; }

  // GAE over the full rollout, then epochs of minibatch updates through
  // ShardedAdam, then merges the rollout's observation statistics (all-reduced
  // over the group). `last_obs`: raw observations after the last step.
  Status Update(std::span<const float> last_obs, PpoMetrics* metrics);
  // Drops a full rollout without learning from it (a frozen policy, e.g. a
  // league anchor): counted as an update, parameters and statistics unchanged.
  Status Skip(PpoMetrics* metrics);

  // The policy for evaluation/play: actions for `batch` raw observations;
  // deterministic picks the most likely action, otherwise samples with `rng`.
  void Act(std::span<const float> obs, int batch, std::span<float> actions, bool deterministic,
           Rng& rng);

  // The learner's state as bytes: parameters, normaliser statistics, RNG
  // state, update count and this rank's optimiser shard. LoadState checks the
  // layout (parameter count, observation size, world size).
  std::vector<uint8_t> SaveState() const;
  Status LoadState(std::span<const uint8_t> state);

  // The same state as slices of global arrays, which restore at any world
  // size: "<prefix>params" (each rank its optimiser block of the replicated
  // parameters), "<prefix>adam.*" (ShardedAdam::AddTo), "<prefix>common"
  // (rank 0: layout, update count, normaliser statistics) and "<prefix>rng"
  // (one row per rank). What it points at stays valid until the next AddTo.
  void AddTo(CheckpointState& state, const std::string& prefix);
  // Loads this rank's part of a state saved by AddTo with any world size. A
  // rank the saving group did not have draws from the stream
  // Rng::FromParts({seed, rank, updates}): defined, and unlike a fresh run's.
  Status LoadFrom(const SavedStep& saved, const std::string& prefix);

 private:
  PpoLearner(const PpoConfig& config, int obs_size, int num_actions, Group& group);
  void Sample(const RowMatrix& logits, std::span<float> actions, float* logp, bool deterministic,
              Rng& rng);
  Status MergeObservationStats();
  // A loaded state, checked, becomes the learner's (LoadState, LoadFrom).
  void Install(std::vector<float> params, double count, std::vector<double> mean,
               std::vector<double> var, const Rng::State& rng, int64_t updates);
  // Update's parts: GAE with the values after the rollout's last step; the
  // learning rate of this update; one minibatch (its advantages normalised);
  // the epochs of minibatch steps (sums of pg, v, entropy, kl, clipfrac and
  // their count into `acc`); the rollout's explained variance.
  void Bootstrap(std::span<const float> last_obs);
  float AnnealedLr() const;
  void GatherMinibatch(int b, size_t mb);
  Status RunEpochs(std::array<float, 6>* acc, float* grad_norm, int* epochs_run);
  double ExplainedVariance() const;

  PpoConfig config_;
  Group& group_;
  int obs_size_;
  int num_actions_;
  ActorCritic act_net_;    // workspace sized num_envs
  ActorCritic train_net_;  // workspace sized one minibatch
  ActorCritic eval_net_;   // workspace for Act()
  std::vector<float> params_;
  std::vector<float> grads_;
  std::unique_ptr<ShardedAdam> adam_;
  ObsNormalizer normalizer_;
  Rng rng_;
  int64_t updates_ = 0;
  std::vector<uint8_t> saved_common_;  // AddTo's "common" bytes
  Rng::State saved_rng_{};             // and this rank's RNG row

  // Rollout, [t][env] row-major.
  int step_ = 0;
  RowMatrix act_obs_;           // num_envs x obs (normalised), scratch
  std::vector<float> raw_obs_;  // T*N x obs
  RowMatrix norm_obs_;          // T*N x obs
  std::vector<float> actions_, logp_, values_, rewards_, dones_, advantages_, returns_;
  // Minibatch scratch.
  RowMatrix mb_obs_;
  std::vector<float> mb_actions_, mb_logp_, mb_adv_, mb_returns_;
  std::vector<int> order_;
  RowMatrix eval_obs_;
};

}  // namespace agentrt
