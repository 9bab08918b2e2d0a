// Policy snapshots: the one format of a frozen PPO policy — what an agent
// publishes as a version of its weight stream (comms/weight_stream.h, topic
// `weights/<agent>`) so that other agents can play against (or with) its
// latest policy (the league / self-play pattern), and what the league's
// catalogue refers to by version. A snapshot is self-describing: the network
// shape, the policy MLP's parameters and the observation normaliser's
// statistics, enough to act without the learner (no value net, no optimizer).
//
// A version's tensors (host byte order):
//   "snapshot"  uint8[n]   one line of JSON, the network's shape:
//     {"format": 1, "agent": "predator-0", "update": 12, "env_steps": 24576,
//      "obs_size": 78, "num_actions": 5, "hidden": 64, "hidden_layers": 2,
//      "norm_obs": true, "obs_clip": 10.0, "policy_params": 9413}
//   "policy"    float32[policy_params]   the policy MLP (learners/actor_critic.h layout)
//   "obs_mean"  float64[obs_size]        normaliser mean     (only when norm_obs)
//   "obs_var"   float64[obs_size]        normaliser variance (only when norm_obs)
// The version's step is env_steps; its agent (the authenticated publisher)
// must be the snapshot's.
//
// PolicyPlayer acts with a snapshot. Thread-safety: one PolicyPlayer per
// thread (its workspace is a member); Act does not allocate once the player
// has acted once with its current snapshot shape.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "comms/bus_client.h"
#include "comms/weight_stream.h"
#include "envs/rng.h"
#include "learners/actor_critic.h"
#include "learners/obs_normalizer.h"
#include "learners/ppo.h"

namespace agentrt {

struct PolicySnapshot {
  std::string agent;
  int64_t update = 0;
  int64_t env_steps = 0;
  int obs_size = 0;
  int num_actions = 0;
  int hidden = 0;
  int hidden_layers = 0;
  bool norm_obs = false;
  float obs_clip = 10.0f;
  std::vector<float> policy_params;
  std::vector<double> obs_mean;  // empty unless norm_obs
  std::vector<double> obs_var;
};

// The learner's current policy as a snapshot.
PolicySnapshot SnapshotOf(const PpoLearner& learner, std::string agent, int64_t env_steps);

// The snapshot as the payload of a version of stream `snapshot.agent`
// (EncodeWeights; publish it with content type kWeightsContentType on
// WeightStreamTopic(snapshot.agent)); `incarnation`: the publisher's restart count.
std::string EncodeSnapshot(const PolicySnapshot& snapshot, int64_t incarnation = 0);
// Errors say what is wrong with the version (its tensors, sizes, JSON, format
// version, an agent that is not its publisher).
Result<PolicySnapshot> DecodeSnapshot(const WeightSet& version);
// A message of a weight stream's topic (received or fetched) as a snapshot.
Result<PolicySnapshot> DecodeSnapshot(const BusMessage& message);

class PolicyPlayer {
 public:
  PolicyPlayer() = default;

  // Takes over the snapshot (its network shape may differ from the previous one).
  Status Load(const PolicySnapshot& snapshot);
  bool loaded() const { return net_ != nullptr; }
  // The snapshot's `update` (-1 before the first Load).
  int64_t update() const { return update_; }

  // The action (index) for one raw observation: sampled from the policy with
  // `rng`, or its most likely action when `deterministic`.
  int Act(std::span<const float> obs, Rng& rng, bool deterministic = false);

 private:
  std::unique_ptr<Mlp> net_;
  Mlp::Workspace ws_;
  std::vector<float> params_;
  std::optional<ObsNormalizer> normalizer_;
  RowMatrix input_;
  std::vector<float> logp_;
  int64_t update_ = -1;
};

}  // namespace agentrt
