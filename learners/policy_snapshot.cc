#include "learners/policy_snapshot.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <nlohmann/json.hpp>

namespace agentrt {
namespace {

// The tensor `name` of `version` as `n` values of T (dtype `dtype`).
template <typename T>
Status Take(const WeightSet& version, std::string_view name, std::string_view dtype, size_t n,
            std::vector<T>& out, const std::string& who) {
  const WeightSet::Entry* e = version.Find(name);
  if (e == nullptr) return InvalidArgument(who + ": no tensor \"" + std::string(name) + "\"");
  if (e->dtype != dtype || e->bytes != n * sizeof(T)) {
    return InvalidArgument(who + ": tensor \"" + std::string(name) + "\" is " + e->dtype + ", " +
                           std::to_string(e->bytes) + " bytes; the shape needs " +
                           std::string(dtype) + ", " + std::to_string(n * sizeof(T)) + " bytes");
  }
  out.resize(n);
  std::memcpy(out.data(), version.Data(*e), e->bytes);
  return Status::Ok();
}

// The policy MLP's layer sizes of snapshot `s`'s shape.
std::vector<int> LayerSizes(const PolicySnapshot& s) {
  std::vector<int> sizes{s.obs_size};
  for (int l = 0; l < s.hidden_layers; ++l) sizes.push_back(s.hidden);
  sizes.push_back(s.num_actions);
  return sizes;
}

}  // namespace

PolicySnapshot SnapshotOf(const PpoLearner& learner, std::string agent, int64_t env_steps) {
  const PpoConfig& config = learner.config();
  const ActorCritic& net = learner.network();
  PolicySnapshot s;
  s.agent = std::move(agent);
  s.update = learner.updates();
  s.env_steps = env_steps;
  s.obs_size = net.obs_size();
  s.num_actions = net.num_actions();
  s.hidden = config.hidden;
  s.hidden_layers = config.hidden_layers;
  s.norm_obs = config.norm_obs;
  s.obs_clip = config.obs_clip;
  // The policy MLP comes first in the flat layout (learners/actor_critic.h).
  const auto params = learner.parameters();
  s.policy_params.assign(params.begin(),
                         params.begin() + static_cast<ptrdiff_t>(net.policy().num_params()));
  if (s.norm_obs) {
    s.obs_mean = learner.normalizer().mean();
    s.obs_var = learner.normalizer().var();
  }
  return s;
}

std::string EncodeSnapshot(const PolicySnapshot& s, int64_t incarnation) {
  const std::string description = nlohmann::json{
      {"format", 1},
      {"agent", s.agent},
      {"update", s.update},
      {"env_steps", s.env_steps},
      {"obs_size", s.obs_size},
      {"num_actions", s.num_actions},
      {"hidden", s.hidden},
      {"hidden_layers", s.hidden_layers},
      {"norm_obs", s.norm_obs},
      {"obs_clip", s.obs_clip},
      {"policy_params",
       s.policy_params.size()}}.dump();
  auto tensor = [](const char* name, const char* dtype, const auto& values) {
    using T = typename std::decay_t<decltype(values)>::value_type;
    return WeightTensor{name,
                        dtype,
                        {static_cast<int64_t>(values.size())},
                        values.data(),
                        values.size() * sizeof(T)};
  };
  std::vector<WeightTensor> tensors = {tensor("snapshot", "uint8", description),
                                       tensor("policy", "float32", s.policy_params)};
  if (s.norm_obs) {
    tensors.push_back(tensor("obs_mean", "float64", s.obs_mean));
    tensors.push_back(tensor("obs_var", "float64", s.obs_var));
  }
  return EncodeWeights(s.agent, s.agent, s.env_steps, incarnation, tensors);
}

Result<PolicySnapshot> DecodeSnapshot(const WeightSet& version) {
  const std::string where = "policy snapshot (weights \"" + version.stream() + "\" version " +
                            std::to_string(version.version()) + ")";
  const WeightSet::Entry* d = version.Find("snapshot");
  if (d == nullptr || d->dtype != "uint8")
    return InvalidArgument(where + ": no \"snapshot\" tensor (uint8) describing the network");
  const nlohmann::json header = nlohmann::json::parse(
      std::string_view(static_cast<const char*>(version.Data(*d)), d->bytes), nullptr,
      /*allow_exceptions=*/false);
  if (!header.is_object()) return InvalidArgument(where + ": its description is not a JSON object");
  PolicySnapshot s;
  try {
    if (header.at("format").get<int>() != 1)
      return InvalidArgument(where + ": unknown format " + header.at("format").dump());
    s.agent = header.at("agent").get<std::string>();
    s.update = header.at("update").get<int64_t>();
    s.env_steps = header.at("env_steps").get<int64_t>();
    s.obs_size = header.at("obs_size").get<int>();
    s.num_actions = header.at("num_actions").get<int>();
    s.hidden = header.at("hidden").get<int>();
    s.hidden_layers = header.at("hidden_layers").get<int>();
    s.norm_obs = header.at("norm_obs").get<bool>();
    s.obs_clip = header.at("obs_clip").get<float>();
    const auto n = header.at("policy_params").get<size_t>();
    const std::string who = "policy snapshot of " + s.agent;
    if (!version.agent().empty() && version.agent() != s.agent) {
      return InvalidArgument(who + " was published by agent " + version.agent() +
                             ": a snapshot is its own agent's");
    }
    if (s.obs_size <= 0 || s.num_actions <= 0 || s.num_actions > 256 || s.hidden <= 0 ||
        s.hidden_layers < 0) {
      return InvalidArgument(who + ": bad network shape " + header.dump());
    }
    const size_t expected = Mlp(LayerSizes(s), 0).num_params();
    if (n != expected) {
      return InvalidArgument(who + ": " + std::to_string(n) +
                             " policy parameters, the shape needs " + std::to_string(expected));
    }
    AGENTRT_RETURN_IF_ERROR(Take(version, "policy", "float32", n, s.policy_params, who));
    if (s.norm_obs) {
      const auto obs = static_cast<size_t>(s.obs_size);
      AGENTRT_RETURN_IF_ERROR(Take(version, "obs_mean", "float64", obs, s.obs_mean, who));
      AGENTRT_RETURN_IF_ERROR(Take(version, "obs_var", "float64", obs, s.obs_var, who));
    }
  } catch (const nlohmann::json::exception& e) {
    return InvalidArgument(where + ": bad description: " + e.what());
  }
  return s;
}

Result<PolicySnapshot> DecodeSnapshot(const BusMessage& message) {
  auto version = WeightSet::FromMessage(message, message.offset() + 1);
  if (!version.ok()) return version.status().WithContext("policy snapshot");
  return DecodeSnapshot(**version);
}

Status PolicyPlayer::Load(const PolicySnapshot& s) {
  const bool same_shape = net_ != nullptr && net_->in() == s.obs_size &&
                          net_->out() == s.num_actions &&
                          net_->num_params() == s.policy_params.size();
  if (!same_shape) {
    auto net = std::make_unique<Mlp>(LayerSizes(s), 0);
    if (net->num_params() != s.policy_params.size()) {
      return InvalidArgument("policy snapshot of " + s.agent +
                             ": parameter count does not match its shape");
    }
    net_ = std::move(net);
    input_.resize(1, s.obs_size);
    logp_.resize(static_cast<size_t>(s.num_actions));
  }
  params_.assign(s.policy_params.begin(), s.policy_params.end());  // same size: no reallocation
  if (s.norm_obs) {
    if (!normalizer_ || normalizer_->size() != static_cast<size_t>(s.obs_size)) {
      normalizer_.emplace(static_cast<size_t>(s.obs_size), s.obs_clip);
    }
    normalizer_->SetState(1.0, s.obs_mean, s.obs_var);
  } else {
    normalizer_.reset();
  }
  update_ = s.update;
  return Status::Ok();
}

int PolicyPlayer::Act(std::span<const float> obs, Rng& rng, bool deterministic) {
  if (normalizer_) {
    normalizer_->Normalize(obs.data(), 1, input_.data());
  } else {
    std::copy_n(obs.data(), input_.cols(), input_.data());
  }
  net_->Forward(params_.data(), input_, ws_);
  const int n = net_->out();
  LogSoftmax(ws_.acts.back().data(), n, logp_.data());
  if (deterministic)
    return static_cast<int>(std::max_element(logp_.begin(), logp_.end()) - logp_.begin());
  double u = rng.Uniform();
  for (int j = 0; j < n; ++j) {
    u -= std::exp(static_cast<double>(logp_[static_cast<size_t>(j)]));
    if (u < 0.0) return j;
  }
  return n - 1;
}

}  // namespace agentrt
