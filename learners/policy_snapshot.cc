#include "learners/policy_snapshot.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <nlohmann/json.hpp>

namespace agentrt {
namespace {

template <typename T>
void Append(std::string& out, const std::vector<T>& v) {
  out.append(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
}

template <typename T>
Status Take(std::string_view& body, size_t n, std::vector<T>& out, std::string_view what) {
  const size_t bytes = n * sizeof(T);
  if (body.size() < bytes) {
    return InvalidArgument("policy snapshot: " + std::string(what) + " needs " +
                           std::to_string(bytes) + " bytes, only " + std::to_string(body.size()) +
                           " left");
  }
  out.resize(n);
  std::memcpy(out.data(), body.data(), bytes);
  body.remove_prefix(bytes);
  return Status::Ok();
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

std::string EncodeSnapshot(const PolicySnapshot& s) {
  nlohmann::json header = {{"format", 1},
                           {"agent", s.agent},
                           {"update", s.update},
                           {"env_steps", s.env_steps},
                           {"obs_size", s.obs_size},
                           {"num_actions", s.num_actions},
                           {"hidden", s.hidden},
                           {"hidden_layers", s.hidden_layers},
                           {"norm_obs", s.norm_obs},
                           {"obs_clip", s.obs_clip},
                           {"policy_params", s.policy_params.size()}};
  std::string out = header.dump();
  out.push_back('\n');
  Append(out, s.policy_params);
  if (s.norm_obs) {
    Append(out, s.obs_mean);
    Append(out, s.obs_var);
  }
  return out;
}

Result<PolicySnapshot> DecodeSnapshot(std::string_view payload) {
  const size_t eol = payload.find('\n');
  if (eol == std::string_view::npos) return InvalidArgument("policy snapshot: no header line");
  const nlohmann::json header =
      nlohmann::json::parse(payload.substr(0, eol), nullptr, /*allow_exceptions=*/false);
  if (!header.is_object())
    return InvalidArgument("policy snapshot: the header is not a JSON object");
  PolicySnapshot s;
  try {
    if (header.at("format").get<int>() != 1) {
      return InvalidArgument("policy snapshot: unknown format " + header.at("format").dump());
    }
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
    if (s.obs_size <= 0 || s.num_actions <= 0 || s.num_actions > 256 || s.hidden <= 0 ||
        s.hidden_layers < 0) {
      return InvalidArgument("policy snapshot of " + s.agent + ": bad network shape " +
                             header.dump());
    }
    const size_t expected = Mlp(
                                [&] {
                                  std::vector<int> sizes{s.obs_size};
                                  for (int l = 0; l < s.hidden_layers; ++l)
                                    sizes.push_back(s.hidden);
                                  sizes.push_back(s.num_actions);
                                  return sizes;
                                }(),
                                0)
                                .num_params();
    if (n != expected) {
      return InvalidArgument("policy snapshot of " + s.agent + ": " + std::to_string(n) +
                             " policy parameters, the shape needs " + std::to_string(expected));
    }
    std::string_view body = payload.substr(eol + 1);
    AGENTRT_RETURN_IF_ERROR(Take(body, n, s.policy_params, "the policy parameters"));
    if (s.norm_obs) {
      AGENTRT_RETURN_IF_ERROR(
          Take(body, static_cast<size_t>(s.obs_size), s.obs_mean, "the normaliser mean"));
      AGENTRT_RETURN_IF_ERROR(
          Take(body, static_cast<size_t>(s.obs_size), s.obs_var, "the normaliser variance"));
    }
    if (!body.empty()) {
      return InvalidArgument("policy snapshot of " + s.agent + ": " + std::to_string(body.size()) +
                             " trailing bytes");
    }
  } catch (const nlohmann::json::exception& e) {
    return InvalidArgument(std::string("policy snapshot: bad header: ") + e.what());
  }
  return s;
}

Status PolicyPlayer::Load(const PolicySnapshot& s) {
  std::vector<int> sizes{s.obs_size};
  for (int l = 0; l < s.hidden_layers; ++l) sizes.push_back(s.hidden);
  sizes.push_back(s.num_actions);
  const bool same_shape = net_ != nullptr && net_->in() == s.obs_size &&
                          net_->out() == s.num_actions &&
                          net_->num_params() == s.policy_params.size();
  if (!same_shape) {
    auto net = std::make_unique<Mlp>(sizes, 0);
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
