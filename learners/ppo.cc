#include "learners/ppo.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <numeric>

namespace agentrt {
namespace {

constexpr char kStateMagic[8] = {'A', 'G', 'P', 'P', 'O', 'S', 'T', '1'};
constexpr int kMaxActions = 256;

template <typename T>
void Put(std::vector<uint8_t>& out, const T& v) {
  const auto* p = reinterpret_cast<const uint8_t*>(&v);
  out.insert(out.end(), p, p + sizeof(T));
}
template <typename T>
void PutArray(std::vector<uint8_t>& out, const T* v, size_t n) {
  const auto* p = reinterpret_cast<const uint8_t*>(v);
  out.insert(out.end(), p, p + n * sizeof(T));
}

// Reads fixed-size values from a byte span, remembering whether it ran short.
class Reader {
 public:
  explicit Reader(std::span<const uint8_t> in) : in_(in) {}
  template <typename T>
  bool Get(T& v) {
    return GetArray(&v, 1);
  }
  template <typename T>
  bool GetArray(T* v, size_t n) {
    if (in_.size() - at_ < n * sizeof(T)) return false;
    std::memcpy(v, in_.data() + at_, n * sizeof(T));
    at_ += n * sizeof(T);
    return true;
  }
  std::span<const uint8_t> Rest() const { return in_.subspan(at_); }

 private:
  std::span<const uint8_t> in_;
  size_t at_ = 0;
};

}  // namespace

void ComputeGae(std::span<const float> rewards, std::span<const float> values,
                std::span<const float> dones, std::span<const float> last_values, float gamma,
                float lambda, std::span<float> advantages, std::span<float> returns) {
  const size_t n = last_values.size();
  const size_t steps = rewards.size() / n;
  for (size_t i = 0; i < n; ++i) {
    float gae = 0.0f;
    for (size_t t = steps; t-- > 0;) {
      const size_t k = t * n + i;
      const float next_value = t + 1 == steps ? last_values[i] : values[k + n];
      const float not_done = 1.0f - dones[k];
      const float delta = rewards[k] + gamma * next_value * not_done - values[k];
      gae = delta + gamma * lambda * not_done * gae;
      advantages[k] = gae;
      returns[k] = gae + values[k];
    }
  }
}

Result<std::unique_ptr<PpoLearner>> PpoLearner::Make(const PpoConfig& config,
                                                     const Space& observation_space,
                                                     const Space& action_space, Group& group) {
  AGENTRT_RETURN_IF_ERROR(config.Validate());
  if (!action_space.is_discrete()) {
    return Status(
        StatusCode::kUnimplemented,
        "ppo: action space " + action_space.ToString() +
            " is not supported; this learner has a categorical policy (Discrete actions)");
  }
  if (action_space.n() > kMaxActions) {
    return InvalidArgument("ppo: at most " + std::to_string(kMaxActions) +
                           " discrete actions, got " + std::to_string(action_space.n()));
  }
  if (group.device_buffers()) {
    return Status(StatusCode::kUnimplemented,
                  "ppo: the CPU learner needs a host-buffer group (mpi or single), got '" +
                      std::string(group.backend()) + "'");
  }
  std::unique_ptr<PpoLearner> learner(new PpoLearner(config,
                                                     static_cast<int>(observation_space.size()),
                                                     static_cast<int>(action_space.n()), group));
  // Same seed gives the same init everywhere; the broadcast makes it a contract.
  AGENTRT_RETURN_IF_ERROR(
      group.Broadcast(learner->params_.data(), learner->params_.size(), DataType::kFloat32, 0)
          .WithContext("ppo: broadcasting initial parameters"));
  return learner;
}

PpoLearner::PpoLearner(const PpoConfig& config, int obs_size, int num_actions, Group& group)
    : config_(config),
      group_(group),
      obs_size_(obs_size),
      num_actions_(num_actions),
      act_net_(obs_size, num_actions, config.hidden, config.hidden_layers),
      train_net_(obs_size, num_actions, config.hidden, config.hidden_layers),
      eval_net_(obs_size, num_actions, config.hidden, config.hidden_layers),
      params_(train_net_.num_params()),
      grads_(train_net_.num_params()),
      normalizer_(static_cast<size_t>(obs_size), config.obs_clip),
      rng_(config.seed * 0x9e3779b97f4a7c15ULL + 1000 * static_cast<uint64_t>(group.rank()) + 1) {
  Rng init(config.seed);
  train_net_.Init(params_.data(), init);
  AdamWOptions adam;
  adam.lr = config.lr;
  adam.eps = config.adam_eps;
  adam.max_grad_norm = config.max_grad_norm;
  adam.average_grads = true;
  adam_ = std::make_unique<ShardedAdam>(group, params_.size(), adam);

  const auto n = static_cast<size_t>(config.num_envs);
  const size_t total = n * static_cast<size_t>(config.rollout_steps);
  act_obs_.resize(config.num_envs, obs_size);
  raw_obs_.resize(total * static_cast<size_t>(obs_size));
  norm_obs_.resize(static_cast<Eigen::Index>(total), obs_size);
  for (auto* v : {&actions_, &logp_, &values_, &rewards_, &dones_, &advantages_, &returns_}) {
    v->assign(total, 0.0f);
  }
  const auto mb = static_cast<Eigen::Index>(total / static_cast<size_t>(config.minibatches));
  mb_obs_.resize(mb, obs_size);
  for (auto* v : {&mb_actions_, &mb_logp_, &mb_adv_, &mb_returns_}) {
    v->assign(static_cast<size_t>(mb), 0.0f);
  }
  order_.resize(total);
}

PpoLearner::~PpoLearner() = default;

void PpoLearner::Sample(const RowMatrix& logits, std::span<float> actions, float* logp,
                        bool deterministic, Rng& rng) {
  float lp[kMaxActions];
  for (Eigen::Index i = 0; i < logits.rows(); ++i) {
    LogSoftmax(logits.row(i).data(), num_actions_, lp);
    int a = 0;
    if (deterministic) {
      a = static_cast<int>(std::max_element(lp, lp + num_actions_) - lp);
    } else {
      double u = rng.Uniform();
      a = num_actions_ - 1;
      for (int j = 0; j < num_actions_; ++j) {
        u -= std::exp(static_cast<double>(lp[j]));
        if (u < 0.0) {
          a = j;
          break;
        }
      }
    }
    actions[static_cast<size_t>(i)] = static_cast<float>(a);
    if (logp != nullptr) logp[i] = lp[a];
  }
}

void PpoLearner::ActAndRecord(std::span<const float> obs, std::span<float> actions) {
  const auto n = static_cast<size_t>(config_.num_envs);
  const auto d = static_cast<size_t>(obs_size_);
  const size_t row = static_cast<size_t>(step_) * n;
  std::copy_n(obs.begin(), n * d, raw_obs_.begin() + static_cast<ptrdiff_t>(row * d));
  if (config_.norm_obs) {
    normalizer_.Normalize(obs.data(), n, act_obs_.data());
  } else {
    std::copy_n(obs.begin(), n * d, act_obs_.data());
  }
  norm_obs_.middleRows(static_cast<Eigen::Index>(row), config_.num_envs) = act_obs_;
  act_net_.Forward(params_.data(), act_obs_);
  Sample(act_net_.logits(), actions, logp_.data() + row, false, rng_);
  for (size_t i = 0; i < n; ++i) {
    actions_[row + i] = actions[i];
    values_[row + i] = act_net_.values()(static_cast<Eigen::Index>(i), 0);
  }
}

void PpoLearner::RecordStep(std::span<const float> rewards, std::span<const uint8_t> terminated,
                            std::span<const uint8_t> truncated, std::span<const float> final_obs) {
  const auto n = static_cast<size_t>(config_.num_envs);
  const auto d = static_cast<size_t>(obs_size_);
  const size_t row = static_cast<size_t>(step_) * n;
  for (size_t i = 0; i < n; ++i) {
    float r = rewards[i];
    if (truncated[i] && !terminated[i]) {
      // Cut by a time limit, not ended: the future it lost is worth V(final).
      eval_obs_.resize(1, obs_size_);
      if (config_.norm_obs) {
        normalizer_.Normalize(final_obs.data() + i * d, 1, eval_obs_.data());
      } else {
        std::copy_n(final_obs.begin() + static_cast<ptrdiff_t>(i * d), d, eval_obs_.data());
      }
      eval_net_.Forward(params_.data(), eval_obs_);
      r += config_.gamma * eval_net_.values()(0, 0);
    }
    rewards_[row + i] = r;
    dones_[row + i] = (terminated[i] || truncated[i]) ? 1.0f : 0.0f;
  }
  ++step_;
}

Status PpoLearner::MergeObservationStats() {
  const auto d = static_cast<size_t>(obs_size_);
  const size_t rows = raw_obs_.size() / d;
  // Sums centred on the current mean keep float32 all-reduce accurate.
  std::vector<double> sum(d, 0.0), sumsq(d, 0.0);
  for (size_t r = 0; r < rows; ++r) {
    for (size_t k = 0; k < d; ++k) {
      const double x = raw_obs_[r * d + k] - normalizer_.mean()[k];
      sum[k] += x;
      sumsq[k] += x * x;
    }
  }
  std::vector<float> buf(1 + 2 * d);
  buf[0] = static_cast<float>(rows);
  for (size_t k = 0; k < d; ++k) {
    buf[1 + k] = static_cast<float>(sum[k]);
    buf[1 + d + k] = static_cast<float>(sumsq[k]);
  }
  if (group_.size() > 1) {
    AGENTRT_RETURN_IF_ERROR(
        group_.AllReduce(buf.data(), buf.size(), DataType::kFloat32, ReduceOp::kSum)
            .WithContext("ppo: all-reducing observation statistics"));
  }
  const double count = buf[0];
  std::vector<double> mean(d), var(d);
  for (size_t k = 0; k < d; ++k) {
    const double m = buf[1 + k] / count;
    mean[k] = normalizer_.mean()[k] + m;
    var[k] = std::max(0.0, buf[1 + d + k] / count - m * m);
  }
  normalizer_.Merge(count, mean, var);
  return Status::Ok();
}

Status PpoLearner::Skip(PpoMetrics* metrics) {
  if (step_ != config_.rollout_steps) {
    return FailedPrecondition("ppo: Skip after " + std::to_string(step_) + " of " +
                              std::to_string(config_.rollout_steps) + " rollout steps");
  }
  ++updates_;
  step_ = 0;
  if (metrics != nullptr) {
    *metrics = PpoMetrics{};
    metrics->updates = updates_;
  }
  return Status::Ok();
}

void PpoLearner::Bootstrap(std::span<const float> last_obs) {
  const auto n = static_cast<size_t>(config_.num_envs);
  if (config_.norm_obs) {
    normalizer_.Normalize(last_obs.data(), n, act_obs_.data());
  } else {
    std::copy_n(last_obs.begin(), n * static_cast<size_t>(obs_size_), act_obs_.data());
  }
  act_net_.Forward(params_.data(), act_obs_);
  std::vector<float> last_values(n);
  for (size_t i = 0; i < n; ++i)
    last_values[i] = act_net_.values()(static_cast<Eigen::Index>(i), 0);
  ComputeGae(rewards_, values_, dones_, last_values, config_.gamma, config_.gae_lambda, advantages_,
             returns_);
}

float PpoLearner::AnnealedLr() const {
  if (!config_.anneal_lr || config_.steps <= 0) return config_.lr;
  const double total = static_cast<double>(config_.num_envs) * config_.rollout_steps;
  const double done_steps = static_cast<double>(updates_) * total * group_.size();
  const auto lr = static_cast<float>(
      config_.lr * std::max(0.0, 1.0 - done_steps / static_cast<double>(config_.steps)));
  return std::max(lr, config_.lr * 1e-3f);
}

void PpoLearner::GatherMinibatch(int b, size_t mb) {
  for (size_t j = 0; j < mb; ++j) {
    const auto k = static_cast<size_t>(order_[static_cast<size_t>(b) * mb + j]);
    mb_obs_.row(static_cast<Eigen::Index>(j)) = norm_obs_.row(static_cast<Eigen::Index>(k));
    mb_actions_[j] = actions_[k];
    mb_logp_[j] = logp_[k];
    mb_adv_[j] = advantages_[k];
    mb_returns_[j] = returns_[k];
  }
  if (config_.norm_adv && mb > 1) {
    double mean = 0.0, sq = 0.0;
    for (float a : mb_adv_) mean += a;
    mean /= static_cast<double>(mb);
    for (float a : mb_adv_) sq += (a - mean) * (a - mean);
    const double std = std::sqrt(sq / static_cast<double>(mb - 1));
    for (float& a : mb_adv_) a = static_cast<float>((a - mean) / (std + 1e-8));
  }
}

Status PpoLearner::RunEpochs(std::array<float, 6>* acc, float* grad_norm, int* epochs_run) {
  const PpoLossCoefs coefs{config_.clip_coef, config_.ent_coef, config_.vf_coef};
  const size_t mb = order_.size() / static_cast<size_t>(config_.minibatches);
  std::iota(order_.begin(), order_.end(), 0);
  for (int epoch = 0; epoch < config_.epochs; ++epoch) {
    for (size_t i = order_.size(); i > 1; --i) {
      std::swap(order_[i - 1], order_[rng_.Below(i)]);
    }
    float epoch_kl = 0.0f;
    for (int b = 0; b < config_.minibatches; ++b) {
      GatherMinibatch(b, mb);
      std::fill(grads_.begin(), grads_.end(), 0.0f);
      train_net_.Forward(params_.data(), mb_obs_);
      const PpoLossTerms terms = train_net_.LossAndGradient(
          params_.data(), grads_.data(), mb_actions_, mb_logp_, mb_adv_, mb_returns_, coefs);
      AGENTRT_RETURN_IF_ERROR(
          adam_->Step(params_.data(), grads_.data(), grad_norm)
              .WithContext("ppo: optimizer step of update " + std::to_string(updates_ + 1)));
      (*acc)[0] += terms.pg_loss;
      (*acc)[1] += terms.v_loss;
      (*acc)[2] += terms.entropy;
      (*acc)[3] += terms.approx_kl;
      (*acc)[4] += terms.clip_fraction;
      (*acc)[5] += 1.0f;
      epoch_kl += terms.approx_kl / static_cast<float>(config_.minibatches);
    }
    ++*epochs_run;
    if (config_.target_kl > 0.0f) {
      // Every rank must stop after the same epoch: decide on the group mean.
      if (group_.size() > 1) {
        AGENTRT_RETURN_IF_ERROR(group_.AllReduce(&epoch_kl, 1, DataType::kFloat32, ReduceOp::kAvg)
                                    .WithContext("ppo: all-reducing approx KL"));
      }
      if (epoch_kl > config_.target_kl) break;
    }
  }
  return Status::Ok();
}

double PpoLearner::ExplainedVariance() const {
  const size_t total = returns_.size();
  double rm = 0.0, rv = 0.0, em = 0.0, ev = 0.0;
  for (size_t k = 0; k < total; ++k) {
    rm += returns_[k];
    em += returns_[k] - values_[k];
  }
  rm /= static_cast<double>(total);
  em /= static_cast<double>(total);
  for (size_t k = 0; k < total; ++k) {
    rv += (returns_[k] - rm) * (returns_[k] - rm);
    const double e = returns_[k] - values_[k] - em;
    ev += e * e;
  }
  return rv > 0.0 ? 1.0 - ev / rv : 0.0;
}

Status PpoLearner::Update(std::span<const float> last_obs, PpoMetrics* metrics) {
  if (step_ != config_.rollout_steps) {
    return FailedPrecondition("ppo: Update after " + std::to_string(step_) + " of " +
                              std::to_string(config_.rollout_steps) + " rollout steps");
  }
  Bootstrap(last_obs);  // the values of the observations after the last step
  const float lr = AnnealedLr();
  adam_->options().lr = lr;
  // sums over minibatches: pg, v, entropy, kl, clipfrac; then count
  std::array<float, 6> acc{};
  float grad_norm = 0.0f;
  int epochs_run = 0;
  AGENTRT_RETURN_IF_ERROR(RunEpochs(&acc, &grad_norm, &epochs_run));
  AGENTRT_RETURN_IF_ERROR(MergeObservationStats());
  const double explained = ExplainedVariance();
  ++updates_;
  step_ = 0;
  if (metrics != nullptr) {
    std::array<float, 6> means{};
    for (size_t i = 0; i < 5; ++i) means[i] = acc[i] / acc[5];
    means[5] = static_cast<float>(explained);
    if (group_.size() > 1) {
      AGENTRT_RETURN_IF_ERROR(
          group_.AllReduce(means.data(), means.size(), DataType::kFloat32, ReduceOp::kAvg)
              .WithContext("ppo: all-reducing update metrics"));
    }
    metrics->updates = updates_;
    metrics->lr = lr;
    metrics->pg_loss = means[0];
    metrics->v_loss = means[1];
    metrics->entropy = means[2];
    metrics->approx_kl = means[3];
    metrics->clip_fraction = means[4];
    metrics->explained_variance = means[5];
    metrics->grad_norm = grad_norm;
    metrics->epochs_run = epochs_run;
  }
  return Status::Ok();
}

void PpoLearner::Act(std::span<const float> obs, int batch, std::span<float> actions,
                     bool deterministic, Rng& rng) {
  eval_obs_.resize(batch, obs_size_);
  if (config_.norm_obs) {
    normalizer_.Normalize(obs.data(), static_cast<size_t>(batch), eval_obs_.data());
  } else {
    std::copy_n(obs.begin(), static_cast<size_t>(batch) * static_cast<size_t>(obs_size_),
                eval_obs_.data());
  }
  eval_net_.Forward(params_.data(), eval_obs_);
  Sample(eval_net_.logits(), actions, nullptr, deterministic, rng);
}

std::vector<uint8_t> PpoLearner::SaveState() const {
  std::vector<uint8_t> out;
  PutArray(out, kStateMagic, sizeof kStateMagic);
  Put(out, static_cast<uint32_t>(1));  // version
  Put(out, static_cast<int32_t>(obs_size_));
  Put(out, static_cast<int32_t>(num_actions_));
  Put(out, static_cast<int32_t>(group_.size()));
  Put(out, static_cast<uint64_t>(params_.size()));
  Put(out, static_cast<int64_t>(updates_));
  PutArray(out, rng_.state().data(), rng_.state().size());
  Put(out, normalizer_.count());
  PutArray(out, normalizer_.mean().data(), normalizer_.size());
  PutArray(out, normalizer_.var().data(), normalizer_.size());
  PutArray(out, params_.data(), params_.size());
  const std::vector<uint8_t> adam = adam_->SaveState();
  Put(out, static_cast<uint64_t>(adam.size()));
  out.insert(out.end(), adam.begin(), adam.end());
  return out;
}

Status PpoLearner::LoadState(std::span<const uint8_t> state) {
  Reader in(state);
  char magic[8];
  uint32_t version = 0;
  int32_t obs_size = 0, num_actions = 0, world = 0;
  uint64_t num_params = 0, adam_size = 0;
  int64_t updates = 0;
  Rng::State rng{};
  double count = 0.0;
  if (!in.GetArray(magic, 8) || std::memcmp(magic, kStateMagic, 8) != 0) {
    return DataLoss("ppo: learner state does not start with the PPO state magic");
  }
  if (!in.Get(version) || version != 1) {
    return DataLoss("ppo: learner state version " + std::to_string(version) + " is not 1");
  }
  if (!in.Get(obs_size) || !in.Get(num_actions) || !in.Get(world) || !in.Get(num_params) ||
      !in.Get(updates) || !in.GetArray(rng.data(), rng.size()) || !in.Get(count)) {
    return DataLoss("ppo: learner state is truncated (header)");
  }
  if (obs_size != obs_size_ || num_actions != num_actions_ || num_params != params_.size()) {
    return FailedPrecondition("ppo: learner state is for obs_size " + std::to_string(obs_size) +
                              ", " + std::to_string(num_actions) + " actions, " +
                              std::to_string(num_params) + " parameters; this learner has " +
                              std::to_string(obs_size_) + ", " + std::to_string(num_actions_) +
                              ", " + std::to_string(params_.size()));
  }
  if (world != group_.size()) {
    return FailedPrecondition("ppo: learner state was saved by a group of " +
                              std::to_string(world) + " ranks; this group has " +
                              std::to_string(group_.size()));
  }
  std::vector<double> mean(static_cast<size_t>(obs_size)), var(static_cast<size_t>(obs_size));
  std::vector<float> params(params_.size());
  if (!in.GetArray(mean.data(), mean.size()) || !in.GetArray(var.data(), var.size()) ||
      !in.GetArray(params.data(), params.size()) || !in.Get(adam_size) ||
      in.Rest().size() != adam_size) {
    return DataLoss("ppo: learner state is truncated or has trailing bytes (body)");
  }
  AGENTRT_RETURN_IF_ERROR(adam_->LoadState(in.Rest()).WithContext("ppo: optimizer state"));
  Install(std::move(params), count, std::move(mean), std::move(var), rng, updates);
  return Status::Ok();
}

void PpoLearner::Install(std::vector<float> params, double count, std::vector<double> mean,
                         std::vector<double> var, const Rng::State& rng, int64_t updates) {
  params_ = std::move(params);
  normalizer_.SetState(count, std::move(mean), std::move(var));
  rng_.set_state(rng);
  updates_ = updates;
  step_ = 0;
}

void PpoLearner::AddTo(CheckpointState& state, const std::string& prefix) {
  const bool last = group_.rank() == group_.size() - 1;
  const uint64_t count = adam_->shard_size() + (last ? adam_->tail_size() : 0);
  state.AddSlice(prefix + "params", params_.data() + adam_->shard_offset(), "float32",
                 sizeof(float), {static_cast<int64_t>(params_.size())}, adam_->shard_offset(),
                 count);
  adam_->AddTo(state, prefix + "adam.");
  if (group_.rank() == 0) {
    saved_common_.clear();
    PutArray(saved_common_, kStateMagic, sizeof kStateMagic);
    Put(saved_common_, static_cast<uint32_t>(2));  // version: the global layout
    Put(saved_common_, static_cast<int32_t>(obs_size_));
    Put(saved_common_, static_cast<int32_t>(num_actions_));
    Put(saved_common_, static_cast<uint64_t>(params_.size()));
    Put(saved_common_, static_cast<int64_t>(updates_));
    Put(saved_common_, normalizer_.count());
    PutArray(saved_common_, normalizer_.mean().data(), normalizer_.size());
    PutArray(saved_common_, normalizer_.var().data(), normalizer_.size());
    state.AddSlice(prefix + "common", saved_common_.data(), "bytes", 1,
                   {static_cast<int64_t>(saved_common_.size())}, 0, saved_common_.size());
  }
  saved_rng_ = rng_.state();
  state.AddRankRow(prefix + "rng", saved_rng_.data(), sizeof saved_rng_, group_.rank(),
                   group_.size());
}

Status PpoLearner::LoadFrom(const SavedStep& saved, const std::string& prefix) {
  const std::string where = "ppo: restore from " + saved.path();
  const SavedStep::Array* common = saved.Find(prefix + "common");
  if (common == nullptr) return NotFound(where + ": no \"" + prefix + "common\"");
  std::vector<uint8_t> bytes(common->elements);
  AGENTRT_RETURN_IF_ERROR(saved.Read(prefix + "common", 0, bytes.size(), bytes.data()));
  Reader in(bytes);
  char magic[8];
  uint32_t version = 0;
  int32_t obs_size = 0, num_actions = 0;
  uint64_t num_params = 0;
  int64_t updates = 0;
  double count = 0.0;
  if (!in.GetArray(magic, 8) || std::memcmp(magic, kStateMagic, 8) != 0 || !in.Get(version) ||
      version != 2) {
    return DataLoss(where + ": \"" + prefix + "common\" is not a PPO state of version 2");
  }
  if (!in.Get(obs_size) || !in.Get(num_actions) || !in.Get(num_params) || !in.Get(updates) ||
      !in.Get(count)) {
    return DataLoss(where + ": \"" + prefix + "common\" is truncated");
  }
  if (obs_size != obs_size_ || num_actions != num_actions_ || num_params != params_.size()) {
    return FailedPrecondition(where + ": the state is for obs_size " + std::to_string(obs_size) +
                              ", " + std::to_string(num_actions) + " actions, " +
                              std::to_string(num_params) + " parameters; this learner has " +
                              std::to_string(obs_size_) + ", " + std::to_string(num_actions_) +
                              ", " + std::to_string(params_.size()));
  }
  std::vector<double> mean(static_cast<size_t>(obs_size)), var(static_cast<size_t>(obs_size));
  if (!in.GetArray(mean.data(), mean.size()) || !in.GetArray(var.data(), var.size()) ||
      !in.Rest().empty()) {
    return DataLoss(where + ": \"" + prefix + "common\" is truncated or has trailing bytes");
  }
  std::vector<float> params(params_.size());
  AGENTRT_RETURN_IF_ERROR(saved.Read(prefix + "params", 0, params.size(), params.data()));
  AGENTRT_RETURN_IF_ERROR(adam_->LoadFrom(saved, prefix + "adam."));
  std::vector<std::byte> row;
  AGENTRT_ASSIGN_OR_RETURN(const bool had_rank,
                           saved.ReadRankRow(prefix + "rng", group_.rank(), &row));
  Rng::State rng{};
  if (had_rank && row.size() != sizeof rng) {
    return DataLoss(where + ": \"" + prefix + "rng\" rows are " + std::to_string(row.size()) +
                    " bytes, not " + std::to_string(sizeof rng));
  }
  if (had_rank) {
    std::memcpy(rng.data(), row.data(), sizeof rng);
  } else {
    rng = Rng::FromParts(
              {config_.seed, static_cast<uint64_t>(group_.rank()), static_cast<uint64_t>(updates)})
              .state();
  }
  Install(std::move(params), count, std::move(mean), std::move(var), rng, updates);
  return Status::Ok();
}

}  // namespace agentrt
