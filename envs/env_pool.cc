#include "envs/env_pool.h"

#include <algorithm>
#include <string>

namespace agentrt {
Result<std::unique_ptr<EnvPool>> EnvPool::Make(const Factory& factory,
                                               const EnvPoolOptions& options) {
  if (options.num_envs < 1) {
    return InvalidArgument("env pool: num_envs must be >= 1, got " +
                           std::to_string(options.num_envs));
  }
  if (options.num_threads < 1) {
    return InvalidArgument("env pool: num_threads must be >= 1, got " +
                           std::to_string(options.num_threads));
  }
  std::vector<std::unique_ptr<Env>> envs;
  for (int i = 0; i < options.num_envs; ++i) {
    Result<std::unique_ptr<Env>> env = factory();
    if (!env.ok()) return env.status().WithContext("env pool: building env " + std::to_string(i));
    if (i > 0 && ((*env)->observation_space() != envs.front()->observation_space() ||
                  (*env)->action_space() != envs.front()->action_space())) {
      return InvalidArgument("env pool: env " + std::to_string(i) +
                             " has other spaces than env 0; every copy must be alike");
    }
    envs.push_back(std::move(env).value());
  }
  return std::unique_ptr<EnvPool>(new EnvPool(std::move(envs), options));
}

EnvPool::EnvPool(std::vector<std::unique_ptr<Env>> envs, const EnvPoolOptions& options)
    : num_envs_(options.num_envs),
      seed_(options.seed),
      obs_size_(envs.front()->observation_space().size()),
      act_size_(envs.front()->action_space().size()),
      envs_(std::move(envs)) {
  const auto n = static_cast<size_t>(num_envs_);
  obs_.assign(n * obs_size_, 0.0f);
  final_obs_.assign(n * obs_size_, 0.0f);
  actions_.assign(n * act_size_, 0.0f);
  rewards_.assign(n, 0.0f);
  episode_returns_.assign(n, 0.0f);
  running_returns_.assign(n, 0.0f);
  terminated_.assign(n, 0);
  truncated_.assign(n, 0);
  episode_lengths_.assign(n, 0);
  running_lengths_.assign(n, 0);
  runner_ = std::make_unique<ChunkRunner>(num_envs_, options.num_threads,
                                          [this](int begin, int end) { StepRange(begin, end); });
}

EnvPool::~EnvPool() = default;

void EnvPool::Reset(std::optional<uint64_t> seed) {
  const uint64_t base = seed.value_or(seed_);
  for (int i = 0; i < num_envs_; ++i) {
    const auto k = static_cast<size_t>(i);
    envs_[k]->Reset(base + static_cast<uint64_t>(i),
                    std::span<float>(obs_).subspan(k * obs_size_, obs_size_));
    running_returns_[k] = 0.0f;
    running_lengths_[k] = 0;
    terminated_[k] = truncated_[k] = 0;
    rewards_[k] = 0.0f;
  }
}

void EnvPool::StepRange(int begin, int end) {
  for (int i = begin; i < end; ++i) {
    const auto k = static_cast<size_t>(i);
    const std::span<float> obs = std::span<float>(obs_).subspan(k * obs_size_, obs_size_);
    const StepResult r =
        envs_[k]->Step(std::span<const float>(actions_).subspan(k * act_size_, act_size_), obs);
    rewards_[k] = r.reward;
    terminated_[k] = r.terminated;
    truncated_[k] = r.truncated;
    running_returns_[k] += r.reward;
    running_lengths_[k] += 1;
    if (r.terminated || r.truncated) {
      std::copy(obs.begin(), obs.end(), final_obs_.begin() + static_cast<ptrdiff_t>(k * obs_size_));
      episode_returns_[k] = running_returns_[k];
      episode_lengths_[k] = running_lengths_[k];
      running_returns_[k] = 0.0f;
      running_lengths_[k] = 0;
      envs_[k]->Reset(std::nullopt, obs);
    }
  }
}

void EnvPool::Step() { runner_->Run(); }

}  // namespace agentrt
