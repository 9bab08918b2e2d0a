#include "learners/policy_snapshot.h"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace agentrt {
namespace {

constexpr char kMagic[8] = {'A', 'G', 'P', 'O', 'L', 'I', 'C', '1'};

struct Header {
  char magic[8];
  int32_t obs_size;
  int32_t num_actions;
  int32_t hidden;
  int32_t hidden_layers;
  int64_t updates;
  int32_t norm_obs;
  float obs_clip;
  uint64_t num_params;
};

std::vector<int> Sizes(int obs_size, int num_actions, int hidden, int hidden_layers) {
  std::vector<int> s{obs_size};
  for (int i = 0; i < hidden_layers; ++i) s.push_back(hidden);
  s.push_back(num_actions);
  return s;
}

}  // namespace

PolicySnapshot::PolicySnapshot(int obs_size, int num_actions, int hidden, int hidden_layers)
    : obs_size_(obs_size),
      num_actions_(num_actions),
      hidden_(hidden),
      mlp_(Sizes(obs_size, num_actions, hidden, hidden_layers), 0) {}

std::vector<uint8_t> PolicySnapshot::Serialize(int obs_size, int num_actions, int hidden,
                                               int hidden_layers, int64_t updates, bool norm_obs,
                                               float obs_clip, std::span<const double> mean,
                                               std::span<const double> var,
                                               std::span<const float> policy_params) {
  Header h{};
  std::memcpy(h.magic, kMagic, 8);
  h.obs_size = obs_size;
  h.num_actions = num_actions;
  h.hidden = hidden;
  h.hidden_layers = hidden_layers;
  h.updates = updates;
  h.norm_obs = norm_obs ? 1 : 0;
  h.obs_clip = obs_clip;
  h.num_params = policy_params.size();
  std::vector<uint8_t> out(sizeof h);
  std::memcpy(out.data(), &h, sizeof h);
  auto put = [&out](const void* p, size_t n) {
    const auto* b = static_cast<const uint8_t*>(p);
    out.insert(out.end(), b, b + n);
  };
  put(mean.data(), mean.size_bytes());
  put(var.data(), var.size_bytes());
  put(policy_params.data(), policy_params.size_bytes());
  return out;
}

Result<std::shared_ptr<const PolicySnapshot>> PolicySnapshot::FromBytes(
    std::span<const uint8_t> bytes) {
  Header h{};
  if (bytes.size() < sizeof h) return DataLoss("policy snapshot: shorter than its header");
  std::memcpy(&h, bytes.data(), sizeof h);
  if (std::memcmp(h.magic, kMagic, 8) != 0) {
    return DataLoss("policy snapshot: bad magic (not written by PpoLearner::SnapshotPolicy)");
  }
  if (h.obs_size < 1 || h.num_actions < 1 || h.num_actions > 256 || h.hidden < 1 ||
      h.hidden_layers < 0 || h.hidden > 1 << 16 || h.hidden_layers > 64 || h.obs_size > 1 << 24) {
    return DataLoss("policy snapshot: implausible network shape");
  }
  std::shared_ptr<PolicySnapshot> s(
      new PolicySnapshot(h.obs_size, h.num_actions, h.hidden, h.hidden_layers));
  const auto d = static_cast<size_t>(h.obs_size);
  const size_t want = sizeof h + 2 * d * sizeof(double) + s->mlp_.num_params() * sizeof(float);
  if (h.num_params != s->mlp_.num_params() || bytes.size() != want) {
    return DataLoss("policy snapshot: " + std::to_string(bytes.size()) + " bytes, expected " +
                    std::to_string(want) + " for its network shape");
  }
  s->updates_ = h.updates;
  s->norm_obs_ = h.norm_obs != 0;
  s->obs_clip_ = h.obs_clip;
  std::vector<double> mean(d), var(d);
  const uint8_t* p = bytes.data() + sizeof h;
  std::memcpy(mean.data(), p, d * sizeof(double));
  std::memcpy(var.data(), p + d * sizeof(double), d * sizeof(double));
  s->params_.resize(s->mlp_.num_params());
  std::memcpy(s->params_.data(), p + 2 * d * sizeof(double), s->params_.size() * sizeof(float));
  s->shift_.resize(d);
  s->scale_.resize(d);
  for (size_t k = 0; k < d; ++k) {
    s->shift_[k] = static_cast<float>(mean[k]);
    s->scale_[k] = static_cast<float>(
        1.0 / std::sqrt(var[k] + static_cast<double>(1e-8f)));  // as ObsNormalizer
  }
  return std::shared_ptr<const PolicySnapshot>(std::move(s));
}

void PolicySnapshot::Act(std::span<const float> obs, std::span<float> action, Rng& rng,
                         bool deterministic) const {
  // Per-thread scratch: a snapshot is played from several pool workers at once.
  thread_local std::vector<float> a, b;
  const size_t widest = static_cast<size_t>(std::max({obs_size_, hidden_, num_actions_}));
  if (a.size() < widest) a.resize(widest);
  if (b.size() < widest) b.resize(widest);
  for (size_t k = 0; k < static_cast<size_t>(obs_size_); ++k) {
    const float x = norm_obs_ ? (obs[k] - shift_[k]) * scale_[k] : obs[k];
    a[k] = std::clamp(x, -obs_clip_, obs_clip_);
  }
  const auto& layers = mlp_.layers();
  for (size_t l = 0; l < layers.size(); ++l) {
    const DenseLayer& d = layers[l];
    const float* w = params_.data() + d.w_offset;
    const float* bias = params_.data() + d.b_offset;
    for (int o = 0; o < d.out; ++o) {
      float z = bias[o];
      const float* row = w + static_cast<size_t>(o) * static_cast<size_t>(d.in);
      for (int i = 0; i < d.in; ++i) z += row[i] * a[static_cast<size_t>(i)];
      b[static_cast<size_t>(o)] = l + 1 < layers.size() ? std::tanh(z) : z;
    }
    std::swap(a, b);
  }
  float logp[256];
  LogSoftmax(a.data(), num_actions_, logp);
  int choice = num_actions_ - 1;
  if (deterministic) {
    choice = static_cast<int>(std::max_element(logp, logp + num_actions_) - logp);
  } else {
    double u = rng.Uniform();
    for (int j = 0; j < num_actions_; ++j) {
      u -= std::exp(static_cast<double>(logp[j]));
      if (u < 0.0) {
        choice = j;
        break;
      }
    }
  }
  action[0] = static_cast<float>(choice);
}

SingleAgentView::OthersPolicy PolicySnapshot::AsOthersPolicy(
    std::shared_ptr<const PolicySnapshot> self) {
  return [self = std::move(self)](int, std::span<const float> obs, std::span<float> action,
                                  Rng& rng) { self->Act(obs, action, rng); };
}

}  // namespace agentrt
