#include "envs/multi_agent_env_pool.h"

#include <algorithm>
#include <string>

namespace agentrt {

Result<std::unique_ptr<MultiAgentEnvPool>> MultiAgentEnvPool::Make(const Factory& factory,
                                                                   const EnvPoolOptions& options) {
  AGENTRT_RETURN_IF_ERROR(CheckPoolOptions(options, "multi-agent env pool"));
  std::vector<std::unique_ptr<MultiAgentEnv>> envs;
  for (int i = 0; i < options.num_envs; ++i) {
    Result<std::unique_ptr<MultiAgentEnv>> env = factory();
    if (!env.ok()) {
      return env.status().WithContext("multi-agent env pool: building world " + std::to_string(i));
    }
    const MultiAgentEnv& first = i == 0 ? **env : *envs.front();
    if ((*env)->num_agents() < 1 || (*env)->num_agents() != first.num_agents() ||
        (*env)->observation_space() != first.observation_space() ||
        (*env)->action_space() != first.action_space()) {
      return InvalidArgument("multi-agent env pool: world " + std::to_string(i) +
                             " has other seats or spaces than world 0; every copy must be alike");
    }
    envs.push_back(std::move(env).value());
  }
  return std::unique_ptr<MultiAgentEnvPool>(new MultiAgentEnvPool(std::move(envs), options));
}

MultiAgentEnvPool::MultiAgentEnvPool(std::vector<std::unique_ptr<MultiAgentEnv>> envs,
                                     const EnvPoolOptions& options)
    : PoolBase(std::move(envs), options), num_agents_(envs_.front()->num_agents()) {
  buf_.Assign(static_cast<size_t>(num_envs_), static_cast<size_t>(num_agents_), obs_size_,
              act_size_, /*with_active=*/true);
  runner_ = std::make_unique<ChunkRunner>(num_envs_, options.num_threads,
                                          [this](int begin, int end) { StepRange(begin, end); });
}

void MultiAgentEnvPool::Reset(std::optional<uint64_t> seed) {
  const uint64_t base = seed.value_or(seed_);
  const auto a = static_cast<size_t>(num_agents_);
  for (int i = 0; i < num_envs_; ++i) {
    const auto k = static_cast<size_t>(i);
    envs_[k]->Reset(base + static_cast<uint64_t>(i),
                    std::span<float>(buf_.obs).subspan(k * a * obs_size_, a * obs_size_));
    for (size_t s = k * a; s < (k + 1) * a; ++s) {
      buf_.running_returns[s] = 0.0f;
      buf_.rewards[s] = 0.0f;
      buf_.active[s] = 1;
    }
    buf_.running_lengths[k] = 0;
    buf_.terminated[k] = buf_.truncated[k] = 0;
  }
}

void MultiAgentEnvPool::StepRange(int begin, int end) {
  const auto a = static_cast<size_t>(num_agents_);
  for (int i = begin; i < end; ++i) {
    const auto k = static_cast<size_t>(i);
    const std::span<float> obs =
        std::span<float>(buf_.obs).subspan(k * a * obs_size_, a * obs_size_);
    const std::span<float> rewards = std::span<float>(buf_.rewards).subspan(k * a, a);
    const MultiAgentEnv::StepOutcome r = envs_[k]->Step(
        std::span<const float>(buf_.actions).subspan(k * a * act_size_, a * act_size_), obs,
        rewards);
    buf_.terminated[k] = r.terminated;
    buf_.truncated[k] = r.truncated;
    buf_.running_lengths[k] += 1;
    for (size_t s = 0; s < a; ++s) {
      buf_.running_returns[k * a + s] += rewards[s];
      buf_.active[k * a + s] = envs_[k]->active(static_cast<int>(s)) ? 1 : 0;
    }
    if (r.terminated || r.truncated) {
      std::copy(obs.begin(), obs.end(),
                buf_.final_obs.begin() + static_cast<ptrdiff_t>(k * a * obs_size_));
      for (size_t s = k * a; s < (k + 1) * a; ++s) {
        buf_.episode_returns[s] = buf_.running_returns[s];
        buf_.running_returns[s] = 0.0f;
      }
      buf_.episode_lengths[k] = buf_.running_lengths[k];
      buf_.running_lengths[k] = 0;
      envs_[k]->Reset(std::nullopt, obs);
      // Like the observations, `active` now describes the new episode.
      for (size_t s = 0; s < a; ++s)
        buf_.active[k * a + s] = envs_[k]->active(static_cast<int>(s)) ? 1 : 0;
    }
  }
}

void MultiAgentEnvPool::Step() { runner_->Run(); }

}  // namespace agentrt
