#include "learners/actor_critic.h"

#include <Eigen/QR>
#include <algorithm>
#include <cassert>
#include <cmath>

namespace agentrt {
namespace {

using ConstRowMap = Eigen::Map<const RowMatrix>;
using RowMap = Eigen::Map<RowMatrix>;
using ConstVecMap = Eigen::Map<const Eigen::VectorXf>;
using VecMap = Eigen::Map<Eigen::VectorXf>;

// An orthogonal out x in matrix scaled by gain (Saxe et al.), via QR of a
// Gaussian matrix with the signs of R's diagonal folded in.
void Orthogonal(float* w, int out, int in, float gain, Rng& rng) {
  const int rows = std::max(out, in);
  const int cols = std::min(out, in);
  Eigen::MatrixXd g(rows, cols);
  for (int i = 0; i < rows; ++i) {
    for (int j = 0; j < cols; ++j) g(i, j) = rng.Normal();
  }
  Eigen::HouseholderQR<Eigen::MatrixXd> qr(g);
  Eigen::MatrixXd q = qr.householderQ() * Eigen::MatrixXd::Identity(rows, cols);
  const Eigen::MatrixXd r = qr.matrixQR().topRows(cols).triangularView<Eigen::Upper>();
  for (int j = 0; j < cols; ++j) {
    if (r(j, j) < 0) q.col(j) *= -1.0;
  }
  RowMap wm(w, out, in);
  if (out >= in) {
    wm = (gain * q).cast<float>();
  } else {
    wm = (gain * q.transpose()).cast<float>();
  }
}

}  // namespace

Mlp::Mlp(std::vector<int> sizes, size_t offset) {
  assert(sizes.size() >= 2);
  size_t at = offset;
  for (size_t l = 0; l + 1 < sizes.size(); ++l) {
    DenseLayer layer;
    layer.in = sizes[l];
    layer.out = sizes[l + 1];
    layer.w_offset = at;
    at += static_cast<size_t>(layer.in) * static_cast<size_t>(layer.out);
    layer.b_offset = at;
    at += static_cast<size_t>(layer.out);
    layers_.push_back(layer);
  }
  num_params_ = at - offset;
}

void Mlp::Init(float* params, Rng& rng, float hidden_gain, float output_gain) const {
  for (size_t l = 0; l < layers_.size(); ++l) {
    const DenseLayer& d = layers_[l];
    const float gain = l + 1 == layers_.size() ? output_gain : hidden_gain;
    Orthogonal(params + d.w_offset, d.out, d.in, gain, rng);
    std::fill(params + d.b_offset, params + d.b_offset + d.out, 0.0f);
  }
}

void Mlp::Forward(const float* params, const Eigen::Ref<const RowMatrix>& x, Workspace& ws) const {
  ws.acts.resize(layers_.size() + 1);
  ws.acts[0] = x;
  for (size_t l = 0; l < layers_.size(); ++l) {
    const DenseLayer& d = layers_[l];
    const ConstRowMap w(params + d.w_offset, d.out, d.in);
    const ConstVecMap b(params + d.b_offset, d.out);
    RowMatrix& y = ws.acts[l + 1];
    y.noalias() = ws.acts[l] * w.transpose();
    y.rowwise() += b.transpose();
    if (l + 1 < layers_.size()) y = y.array().tanh();
  }
}

void Mlp::Backward(const float* params, float* grads, const RowMatrix& d_out, Workspace& ws) const {
  ws.delta = d_out;  // d loss / d pre-activation of the current layer
  for (size_t l = layers_.size(); l-- > 0;) {
    const DenseLayer& d = layers_[l];
    RowMap gw(grads + d.w_offset, d.out, d.in);
    VecMap gb(grads + d.b_offset, d.out);
    gw.noalias() += ws.delta.transpose() * ws.acts[l];
    gb += ws.delta.colwise().sum().transpose();
    if (l == 0) break;
    const ConstRowMap w(params + d.w_offset, d.out, d.in);
    ws.scratch.noalias() = ws.delta * w;
    // tanh'(z) = 1 - tanh(z)^2, and acts[l] holds tanh(z) of layer l - 1.
    ws.delta = ws.scratch.array() * (1.0f - ws.acts[l].array().square());
  }
}

ActorCritic::ActorCritic(int obs_size, int num_actions, int hidden, int hidden_layers)
    : policy_(
          [&] {
            std::vector<int> s{obs_size};
            for (int i = 0; i < hidden_layers; ++i) s.push_back(hidden);
            s.push_back(num_actions);
            return s;
          }(),
          0),
      value_(
          [&] {
            std::vector<int> s{obs_size};
            for (int i = 0; i < hidden_layers; ++i) s.push_back(hidden);
            s.push_back(1);
            return s;
          }(),
          policy_.num_params()) {}

void ActorCritic::Init(float* params, Rng& rng) const {
  policy_.Init(params, rng, std::sqrt(2.0f), 0.01f);
  value_.Init(params, rng, std::sqrt(2.0f), 1.0f);
}

void ActorCritic::Forward(const float* params, const Eigen::Ref<const RowMatrix>& obs) {
  policy_.Forward(params, obs, pol_ws_);
  value_.Forward(params, obs, val_ws_);
}

void LogSoftmax(const float* logits, int n, float* out) {
  float max = logits[0];
  for (int j = 1; j < n; ++j) max = std::max(max, logits[j]);
  float sum = 0.0f;
  for (int j = 0; j < n; ++j) sum += std::exp(logits[j] - max);
  const float log_sum = max + std::log(sum);
  for (int j = 0; j < n; ++j) out[j] = logits[j] - log_sum;
}

PpoLossTerms ActorCritic::LossAndGradient(const float* params, float* grads,
                                          std::span<const float> actions,
                                          std::span<const float> old_logp,
                                          std::span<const float> advantages,
                                          std::span<const float> returns,
                                          const PpoLossCoefs& coefs) {
  const RowMatrix& logits = pol_ws_.acts.back();
  const auto batch = static_cast<int>(logits.rows());
  const int n = static_cast<int>(logits.cols());
  const float inv_b = 1.0f / static_cast<float>(batch);
  d_logits_.resize(batch, n);
  d_values_.resize(batch, 1);
  PpoLossTerms t;
  constexpr int kMaxActions = 256;
  assert(n <= kMaxActions);
  float logp[kMaxActions];
  for (int i = 0; i < batch; ++i) {
    LogSoftmax(logits.row(i).data(), n, logp);
    const int a = std::clamp(static_cast<int>(actions[static_cast<size_t>(i)]), 0, n - 1);
    const auto k = static_cast<size_t>(i);
    float entropy = 0.0f;
    for (int j = 0; j < n; ++j) entropy -= std::exp(logp[j]) * logp[j];
    const float log_ratio = logp[a] - old_logp[k];
    const float ratio = std::exp(log_ratio);
    const float adv = advantages[k];
    const float clipped = std::clamp(ratio, 1.0f - coefs.clip_coef, 1.0f + coefs.clip_coef);
    const float unclipped_obj = ratio * adv;
    const float clipped_obj = clipped * adv;
    t.pg_loss -= std::min(unclipped_obj, clipped_obj);
    t.entropy += entropy;
    t.approx_kl += (ratio - 1.0f) - log_ratio;
    t.clip_fraction += std::abs(ratio - 1.0f) > coefs.clip_coef ? 1.0f : 0.0f;
    // d(-min(rA, clip(r)A))/d logp_a: the unclipped term is the active one
    // when it is the smaller, or when r is inside the clip range (then equal).
    const bool inside = ratio >= 1.0f - coefs.clip_coef && ratio <= 1.0f + coefs.clip_coef;
    const float d_logp_a = (unclipped_obj <= clipped_obj || inside) ? -adv * ratio * inv_b : 0.0f;
    for (int j = 0; j < n; ++j) {
      const float p = std::exp(logp[j]);
      // d logp_a / d logit_j = [j == a] - p_j;  dH / d logit_j = -p_j (logp_j + H).
      const float d_pg = d_logp_a * ((j == a ? 1.0f : 0.0f) - p);
      const float d_ent = coefs.ent_coef * inv_b * p * (logp[j] + entropy);
      d_logits_(i, j) = d_pg + d_ent;
    }
    const float v = val_ws_.acts.back()(i, 0);
    const float err = v - returns[k];
    t.v_loss += 0.5f * err * err;
    d_values_(i, 0) = coefs.vf_coef * err * inv_b;
  }
  t.pg_loss *= inv_b;
  t.v_loss *= inv_b;
  t.entropy *= inv_b;
  t.approx_kl *= inv_b;
  t.clip_fraction *= inv_b;
  t.loss = t.pg_loss - coefs.ent_coef * t.entropy + coefs.vf_coef * t.v_loss;
  policy_.Backward(params, grads, d_logits_, pol_ws_);
  value_.Backward(params, grads, d_values_, val_ws_);
  return t;
}

}  // namespace agentrt
