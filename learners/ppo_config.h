// The settings of the reference PPO learner and of its trainer, by the names a
// plan's `args` uses: what agent-worker reads at start-up and `agentctl
// validate` checks. Apart from the learner so that reading them needs neither
// the agent runtime nor a collective library.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "common/status.h"
#include "envs/params.h"

namespace agentrt {

// The hyperparameters, by the names a plan's `args` uses (defaults solve
// cartpole), declared once: X(type, name, default, doc).
#define AGENTRT_PPO_SETTINGS(X)                                                             \
  X(int, num_envs, 8, "env copies per rank")                                                \
  X(int, rollout_steps, 128, "steps per env per update")                                    \
  X(int, epochs, 4, "passes over each rollout")                                             \
  X(int, minibatches, 4, "minibatches per epoch (each num_envs*rollout_steps/minibatches)") \
  X(float, lr, 1e-3f, "Adam learning rate")                                                 \
  X(bool, anneal_lr, true, "decay lr linearly over `steps` (floor: lr / 1000)")             \
  X(int64_t, steps, 150000, "env-step budget of the whole group (for annealing)")           \
  X(float, gamma, 0.99f, "discount")                                                        \
  X(float, gae_lambda, 0.95f, "GAE lambda")                                                 \
  X(float, clip_coef, 0.2f, "PPO clip range")                                               \
  X(float, ent_coef, 0.0f, "entropy bonus weight")                                          \
  X(float, vf_coef, 0.5f, "value loss weight")                                              \
  X(float, max_grad_norm, 0.5f, "global gradient-norm clip (0: off)")                       \
  X(float, adam_eps, 1e-5f, "Adam epsilon")                                                 \
  X(float, target_kl, 0.0f, "stop an update's epochs early past this approx KL (0: off)")   \
  X(int, hidden, 64, "hidden units per layer")                                              \
  X(int, hidden_layers, 2, "hidden layers per network")                                     \
  X(bool, norm_obs, true, "running observation normalisation")                              \
  X(bool, norm_adv, true, "per-minibatch advantage normalisation")                          \
  X(float, obs_clip, 10.0f, "clip of normalised observations")                              \
  X(uint64_t, seed, 1, "parameters, sampling and shuffling (rank r uses seed + 1000 r)")

struct PpoConfig {
  AGENTRT_PPO_SETTINGS(AGENTRT_PARAM_FIELD)

  // Reads the keys above from `p` (the caller may read its own keys from the
  // same Params and then calls p.Finish()).
  void Read(Params& p);
  // All keys from `args`; unknown keys are errors.
  static Result<PpoConfig> FromJson(const nlohmann::json& args);
  nlohmann::json ToJson() const;
  // Range checks; the message names the key.
  Status Validate() const;
};

// The trainer's own settings, beside PpoConfig's.
#define AGENTRT_PPO_TRAINER_SETTINGS(X)                                \
  X(std::string, env, "cartpole", "registry name")                     \
  X(nlohmann::json, env_args, nullptr, "the env's parameters")         \
  X(int, env_threads, 1, "EnvPool threads per rank (caller included)") \
  X(int, episode_window, 20, "episodes averaged into episode_return_mean")

struct PpoTrainerConfig {
  AGENTRT_PPO_TRAINER_SETTINGS(AGENTRT_PARAM_FIELD)
  PpoConfig ppo;

  void Read(Params& p);
  static Result<PpoTrainerConfig> FromJson(const nlohmann::json& args);
};

}  // namespace agentrt
