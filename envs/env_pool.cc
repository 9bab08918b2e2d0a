#include "envs/env_pool.h"

#include <algorithm>
#include <string>

namespace agentrt {

void PoolBuffers::Assign(size_t envs, size_t seats, size_t obs_size, size_t act_size,
                         bool with_active) {
  const size_t slots = envs * seats;
  obs.assign(slots * obs_size, 0.0f);
  final_obs.assign(slots * obs_size, 0.0f);
  actions.assign(slots * act_size, 0.0f);
  rewards.assign(slots, 0.0f);
  episode_returns.assign(slots, 0.0f);
  running_returns.assign(slots, 0.0f);
  active.assign(with_active ? slots : 0, 1);
  terminated.assign(envs, 0);
  truncated.assign(envs, 0);
  episode_lengths.assign(envs, 0);
  running_lengths.assign(envs, 0);
}

Status CheckPoolOptions(const EnvPoolOptions& options, std::string_view pool) {
  if (options.num_envs < 1) {
    return InvalidArgument(std::string(pool) + ": num_envs must be >= 1, got " +
                           std::to_string(options.num_envs));
  }
  if (options.num_threads < 1) {
    return InvalidArgument(std::string(pool) + ": num_threads must be >= 1, got " +
                           std::to_string(options.num_threads));
  }
  return Status::Ok();
}

Result<std::unique_ptr<EnvPool>> EnvPool::Make(const Factory& factory,
                                               const EnvPoolOptions& options) {
  AGENTRT_RETURN_IF_ERROR(CheckPoolOptions(options, "env pool"));
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
    : PoolBase(std::move(envs), options) {
  buf_.Assign(static_cast<size_t>(num_envs_), 1, obs_size_, act_size_, /*with_active=*/false);
  runner_ = std::make_unique<ChunkRunner>(num_envs_, options.num_threads,
                                          [this](int begin, int end) { StepRange(begin, end); });
}

void EnvPool::Reset(std::optional<uint64_t> seed) {
  const uint64_t base = seed.value_or(seed_);
  for (int i = 0; i < num_envs_; ++i) {
    const auto k = static_cast<size_t>(i);
    envs_[k]->Reset(base + static_cast<uint64_t>(i),
                    std::span<float>(buf_.obs).subspan(k * obs_size_, obs_size_));
    buf_.running_returns[k] = 0.0f;
    buf_.running_lengths[k] = 0;
    buf_.terminated[k] = buf_.truncated[k] = 0;
    buf_.rewards[k] = 0.0f;
  }
}

void EnvPool::StepRange(int begin, int end) {
  for (int i = begin; i < end; ++i) {
    const auto k = static_cast<size_t>(i);
    const std::span<float> obs = std::span<float>(buf_.obs).subspan(k * obs_size_, obs_size_);
    const StepResult r =
        envs_[k]->Step(std::span<const float>(buf_.actions).subspan(k * act_size_, act_size_), obs);
    buf_.rewards[k] = r.reward;
    buf_.terminated[k] = r.terminated;
    buf_.truncated[k] = r.truncated;
    buf_.running_returns[k] += r.reward;
    buf_.running_lengths[k] += 1;
    if (r.terminated || r.truncated) {
      std::copy(obs.begin(), obs.end(),
                buf_.final_obs.begin() + static_cast<ptrdiff_t>(k * obs_size_));
      buf_.episode_returns[k] = buf_.running_returns[k];
      buf_.episode_lengths[k] = buf_.running_lengths[k];
      buf_.running_returns[k] = 0.0f;
      buf_.running_lengths[k] = 0;
      envs_[k]->Reset(std::nullopt, obs);
    }
  }
}

void EnvPool::Step() { runner_->Run(); }

}  // namespace agentrt
