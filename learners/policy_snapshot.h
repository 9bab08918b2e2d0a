// agentrt::PolicySnapshot — a frozen copy of a PPO policy (policy MLP weights
// plus the observation normaliser), small enough to publish on the bus
// (`policies/<agent>`) and cheap to play: the league / self-play pattern, where
// an agent's opponents are the latest snapshots of the other agents.
//
//   bytes = learner.SnapshotPolicy();                          // publisher
//   auto snap = PolicySnapshot::FromBytes(bytes);              // subscriber
//   view.set_others_policy(snap->AsOthersPolicy());            // envs/single_agent_view.h
//
// Thread-safety: Act is const and keeps its scratch in thread_local buffers,
// so one snapshot can be played from every EnvPool worker at once. Act does
// not allocate after a thread's first call.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "common/status.h"
#include "envs/rng.h"
#include "envs/single_agent_view.h"
#include "learners/actor_critic.h"

namespace agentrt {

class PolicySnapshot {
 public:
  // Parses bytes written by PpoLearner::SnapshotPolicy (DATA_LOSS if malformed).
  static Result<std::shared_ptr<const PolicySnapshot>> FromBytes(std::span<const uint8_t> bytes);

  int obs_size() const { return obs_size_; }
  int num_actions() const { return num_actions_; }
  // The update count of the learner when it was taken.
  int64_t updates() const { return updates_; }

  // One observation in, one action out (sampled, or the most likely one).
  void Act(std::span<const float> obs, std::span<float> action, Rng& rng,
           bool deterministic = false) const;

  // An OthersPolicy for SingleAgentView that plays this snapshot for every
  // other agent. Keeps the snapshot alive.
  static SingleAgentView::OthersPolicy AsOthersPolicy(std::shared_ptr<const PolicySnapshot> self);

  // Writes a snapshot (used by PpoLearner::SnapshotPolicy).
  static std::vector<uint8_t> Serialize(int obs_size, int num_actions, int hidden,
                                        int hidden_layers, int64_t updates, bool norm_obs,
                                        float obs_clip, std::span<const double> mean,
                                        std::span<const double> var,
                                        std::span<const float> policy_params);

 private:
  PolicySnapshot(int obs_size, int num_actions, int hidden, int hidden_layers);

  int obs_size_;
  int num_actions_;
  int hidden_;
  int64_t updates_ = 0;
  bool norm_obs_ = true;
  float obs_clip_ = 10.0f;
  Mlp mlp_;
  std::vector<float> shift_, scale_;
  std::vector<float> params_;  // the policy MLP only, offsets from 0
};

}  // namespace agentrt
