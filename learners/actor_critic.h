// agentrt::ActorCritic — the PPO networks: an MLP policy (categorical over
// discrete actions) and an MLP value function, with forward and backward
// written by hand (Eigen), over ONE flat parameter buffer and ONE flat
// gradient buffer of the same layout, so an optimizer (ShardedAdam) steps
// them as one vector and a device implementation can follow the same layout.
//
// Parameter layout (floats, in this order, no padding):
//   policy MLP: obs_size -> hidden x layers -> num_actions
//   value  MLP: obs_size -> hidden x layers -> 1
// Each MLP is its layers in order; a layer with `in` inputs and `out` outputs
// stores W (out x in, row-major: W[o][i] at o * in + i) then b (out).
// y = x W^T + b; hidden layers apply tanh, the output layer is linear.
// layers() lists every layer's offsets, so nothing else needs to know this.
//
// Initialisation (as in the PPO implementations people compare against):
// orthogonal weights with gain sqrt(2) for hidden layers, 0.01 for the policy
// output and 1 for the value output; zero biases.
//
// Not thread-safe: the workspaces are members. Use one per thread.
#pragma once

#include <Eigen/Core>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "envs/rng.h"

namespace agentrt {

using RowMatrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

struct DenseLayer {
  size_t w_offset = 0;  // W: out x in, row-major
  size_t b_offset = 0;  // b: out
  int in = 0;
  int out = 0;
};

// A tanh MLP over a slice of a flat buffer.
class Mlp {
 public:
  // sizes = {in, hidden..., out}; the MLP's parameters start at `offset`.
  Mlp(std::vector<int> sizes, size_t offset);

  size_t num_params() const { return num_params_; }
  const std::vector<DenseLayer>& layers() const { return layers_; }
  int in() const { return layers_.front().in; }
  int out() const { return layers_.back().out; }

  void Init(float* params, Rng& rng, float hidden_gain, float output_gain) const;

  // Activations of each layer for one batch (kept for Backward).
  struct Workspace {
    std::vector<RowMatrix> acts;  // acts[0] = input, acts[l + 1] = output of layer l
    RowMatrix delta;
    RowMatrix scratch;
  };
  // Runs x (batch x in) through the net; the output is ws.acts.back().
  void Forward(const float* params, const Eigen::Ref<const RowMatrix>& x, Workspace& ws) const;
  // Given d loss / d output (batch x out), ADDS d loss / d params into grads.
  // ws must hold this batch's Forward.
  void Backward(const float* params, float* grads, const RowMatrix& d_out, Workspace& ws) const;

 private:
  std::vector<DenseLayer> layers_;
  size_t num_params_ = 0;
};

// What the PPO loss weighs: L = pg_loss - ent_coef * entropy + vf_coef * v_loss.
struct PpoLossCoefs {
  float clip_coef = 0.2f;
  float ent_coef = 0.0f;
  float vf_coef = 0.5f;
};

// The loss terms of one minibatch (means over it).
struct PpoLossTerms {
  float loss = 0.0f;
  float pg_loss = 0.0f;        // -mean(min(r * A, clip(r, 1 - c, 1 + c) * A))
  float v_loss = 0.0f;         // 0.5 * mean((V - return)^2)
  float entropy = 0.0f;        // mean policy entropy (nats)
  float approx_kl = 0.0f;      // mean((r - 1) - log r), Schulman's low-variance estimator
  float clip_fraction = 0.0f;  // fraction of samples with |r - 1| > c
};

class ActorCritic {
 public:
  ActorCritic(int obs_size, int num_actions, int hidden, int hidden_layers);

  int obs_size() const { return policy_.in(); }
  int num_actions() const { return policy_.out(); }
  size_t num_params() const { return policy_.num_params() + value_.num_params(); }
  const Mlp& policy() const { return policy_; }
  const Mlp& value() const { return value_; }

  void Init(float* params, Rng& rng) const;

  // Policy logits (batch x num_actions) and values (batch) of `obs` (batch x
  // obs_size). Valid until the next call on the same workspace kind.
  void Forward(const float* params, const Eigen::Ref<const RowMatrix>& obs);
  const RowMatrix& logits() const { return pol_ws_.acts.back(); }
  const RowMatrix& values() const { return val_ws_.acts.back(); }

  // The PPO loss of the batch last given to Forward, for `actions` (indices),
  // the behaviour policy's `old_logp`, advantages and returns; ADDS its
  // gradient into `grads` (num_params floats).
  PpoLossTerms LossAndGradient(const float* params, float* grads, std::span<const float> actions,
                               std::span<const float> old_logp, std::span<const float> advantages,
                               std::span<const float> returns, const PpoLossCoefs& coefs);

 private:
  Mlp policy_;
  Mlp value_;
  Mlp::Workspace pol_ws_;
  Mlp::Workspace val_ws_;
  RowMatrix d_logits_;
  RowMatrix d_values_;
};

// log-softmax of one row of logits into `out`; returns nothing, no allocation.
void LogSoftmax(const float* logits, int n, float* out);

}  // namespace agentrt
