// agentrt::SingleAgentView — one agent's view of a MultiAgentEnv, as an Env,
// so single-agent learners and EnvPool can train that agent while the other
// agents are played by a given policy (e.g. the latest snapshots of other
// agents' policies received over the bus — the league / self-play pattern).
//
// The view's reward is the controlled agent's; its episode ends (terminated)
// when the world's episode terminates or the controlled agent leaves it (a
// caught prey), and is truncated when the world's is.
//
// Thread-safety: like any Env, one thread at a time. The others-policy runs on
// the thread that steps the view (an EnvPool worker): it must not allocate on
// the hot path and must be safe to call concurrently with other views' calls.
#pragma once

#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "envs/env.h"
#include "envs/rng.h"

namespace agentrt {

class SingleAgentView final : public Env {
 public:
  // Writes the action (action_space().size() floats) of `agent` given its
  // observation. `rng` is the view's own stream, for stochastic policies.
  using OthersPolicy =
      std::function<void(int agent, std::span<const float> obs, std::span<float> action, Rng& rng)>;

  SingleAgentView(std::unique_ptr<MultiAgentEnv> env, int controlled);

  const Space& observation_space() const override { return env_->observation_space(); }
  const Space& action_space() const override { return env_->action_space(); }
  void Reset(std::optional<uint64_t> seed, std::span<float> obs) override;
  StepResult Step(std::span<const float> action, std::span<float> obs) override;

  // Null restores the default: uniformly random discrete actions (Box: uniform
  // in [low, high] where finite, else 0).
  void set_others_policy(OthersPolicy policy) { others_ = std::move(policy); }
  int controlled() const { return controlled_; }
  MultiAgentEnv& world() { return *env_; }

 private:
  void RandomAction(std::span<float> action);

  std::unique_ptr<MultiAgentEnv> env_;
  int controlled_;
  OthersPolicy others_;
  Rng rng_;
  std::vector<float> all_obs_;
  std::vector<float> all_actions_;
  std::vector<float> all_rewards_;
};

}  // namespace agentrt
