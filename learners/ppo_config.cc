#include "learners/ppo_config.h"

#include <string>

namespace agentrt {

void PpoConfig::Read(Params& p) {
  PpoConfig& out = *this;
  AGENTRT_PPO_SETTINGS(AGENTRT_PARAM_READ)
}

Result<PpoConfig> PpoConfig::FromJson(const nlohmann::json& args) {
  Params p(args, "ppo");
  PpoConfig c;
  c.Read(p);
  AGENTRT_RETURN_IF_ERROR(p.Finish());
  AGENTRT_RETURN_IF_ERROR(c.Validate());
  return c;
}

nlohmann::json PpoConfig::ToJson() const {
  nlohmann::json j = nlohmann::json::object();
#define AGENTRT_PPO_WRITE(type, name, default_value, doc) j[#name] = name;
  AGENTRT_PPO_SETTINGS(AGENTRT_PPO_WRITE)
#undef AGENTRT_PPO_WRITE
  return j;
}

Status PpoConfig::Validate() const {
  auto bad = [](const char* key, const std::string& what) {
    return InvalidArgument("ppo: parameter '" + std::string(key) + "' " + what);
  };
  if (num_envs < 1) return bad("num_envs", "must be >= 1");
  if (rollout_steps < 1) return bad("rollout_steps", "must be >= 1");
  if (epochs < 1) return bad("epochs", "must be >= 1");
  if (minibatches < 1 || minibatches > num_envs * rollout_steps) {
    return bad("minibatches", "must be between 1 and num_envs * rollout_steps (" +
                                  std::to_string(num_envs * rollout_steps) + ")");
  }
  if (!(lr > 0.0f)) return bad("lr", "must be > 0");
  if (steps < 0) return bad("steps", "must be >= 0");
  if (!(gamma >= 0.0f && gamma <= 1.0f)) return bad("gamma", "must be in [0, 1]");
  if (!(gae_lambda >= 0.0f && gae_lambda <= 1.0f)) return bad("gae_lambda", "must be in [0, 1]");
  if (!(clip_coef > 0.0f)) return bad("clip_coef", "must be > 0");
  if (hidden < 1) return bad("hidden", "must be >= 1");
  if (hidden_layers < 0) return bad("hidden_layers", "must be >= 0");
  if (max_grad_norm < 0.0f) return bad("max_grad_norm", "must be >= 0 (0: no clipping)");
  return Status::Ok();
}

void PpoTrainerConfig::Read(Params& p) {
  PpoTrainerConfig& out = *this;
  AGENTRT_PPO_TRAINER_SETTINGS(AGENTRT_PARAM_READ)
  if (env_threads < 1) p.Invalid("env_threads", "must be >= 1");
  if (episode_window < 1) p.Invalid("episode_window", "must be >= 1");
  ppo.Read(p);
}

Result<PpoTrainerConfig> PpoTrainerConfig::FromJson(const nlohmann::json& args) {
  Params p(args, "ppo");
  PpoTrainerConfig c;
  c.Read(p);
  AGENTRT_RETURN_IF_ERROR(p.Finish());
  AGENTRT_RETURN_IF_ERROR(c.ppo.Validate());
  return c;
}

}  // namespace agentrt
