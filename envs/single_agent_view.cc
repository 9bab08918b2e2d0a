#include "envs/single_agent_view.h"

#include <algorithm>
#include <cmath>

namespace agentrt {

SingleAgentView::SingleAgentView(std::unique_ptr<MultiAgentEnv> env, int controlled)
    : env_(std::move(env)), controlled_(controlled) {
  const auto n = static_cast<size_t>(env_->num_agents());
  all_obs_.assign(n * env_->observation_space().size(), 0.0f);
  all_actions_.assign(n * env_->action_space().size(), 0.0f);
  all_rewards_.assign(n, 0.0f);
}

void SingleAgentView::Reset(std::optional<uint64_t> seed, std::span<float> obs) {
  // The others' random stream is derived from the same seed, so a seeded reset
  // replays the whole episode, others included.
  if (seed) rng_.Seed(*seed ^ 0x5bd1e9955bd1e995ULL);
  env_->Reset(seed, all_obs_);
  const size_t o = env_->observation_space().size();
  std::copy_n(all_obs_.begin() + static_cast<std::ptrdiff_t>(controlled_ * o), o, obs.begin());
}

void SingleAgentView::RandomAction(std::span<float> action) {
  const Space& space = env_->action_space();
  if (space.is_discrete()) {
    action[0] = static_cast<float>(rng_.Below(static_cast<uint64_t>(space.n())));
    return;
  }
  for (size_t k = 0; k < space.size(); ++k) {
    const float lo = space.low()[k];
    const float hi = space.high()[k];
    action[k] =
        std::isfinite(lo) && std::isfinite(hi) ? static_cast<float>(rng_.Uniform(lo, hi)) : 0.0f;
  }
}

StepResult SingleAgentView::Step(std::span<const float> action, std::span<float> obs) {
  const size_t o = env_->observation_space().size();
  const size_t a = env_->action_space().size();
  const std::span<float> actions(all_actions_);
  const std::span<const float> observations(all_obs_);
  for (int i = 0; i < env_->num_agents(); ++i) {
    const std::span<float> act = actions.subspan(static_cast<size_t>(i) * a, a);
    if (i == controlled_) {
      std::copy_n(action.begin(), a, act.begin());
    } else if (!env_->active(i)) {
      std::fill(act.begin(), act.end(), 0.0f);
    } else if (others_) {
      others_(i, observations.subspan(static_cast<size_t>(i) * o, o), act, rng_);
    } else {
      RandomAction(act);
    }
  }
  const MultiAgentEnv::StepOutcome out = env_->Step(all_actions_, all_obs_, all_rewards_);
  std::copy_n(all_obs_.begin() + static_cast<std::ptrdiff_t>(static_cast<size_t>(controlled_) * o),
              o, obs.begin());
  StepResult r;
  r.reward = all_rewards_[static_cast<size_t>(controlled_)];
  r.terminated = out.terminated || !env_->active(controlled_);
  r.truncated = !r.terminated && out.truncated;
  return r;
}

}  // namespace agentrt
