#include "envs/cartpole.h"

#include <cassert>
#include <limits>

#include "envs/params.h"

namespace agentrt {
namespace {

Space CartPoleObservationSpace() {
  const float big = std::numeric_limits<float>::max();  // Gymnasium: finfo(float32).max
  const float x = static_cast<float>(CartPole::kXThreshold * 2);
  const float theta = static_cast<float>(CartPole::kThetaThreshold * 2);
  return Space::Box({4}, {-x, -big, -theta, -big}, {x, big, theta, big});
}

void Observe(const CartPole::State& s, std::span<float> obs) {
  assert(obs.size() >= 4);
  for (size_t i = 0; i < 4; ++i) obs[i] = static_cast<float>(s[i]);
}

}  // namespace

CartPole::CartPole(int max_episode_steps)
    : observation_space_(CartPoleObservationSpace()),
      action_space_(Space::Discrete(2)),
      max_episode_steps_(max_episode_steps) {}

void CartPole::Reset(std::optional<uint64_t> seed, std::span<float> obs) {
  if (seed) rng_.Seed(*seed);
  for (double& v : state_) v = rng_.Uniform(-0.05, 0.05);
  elapsed_ = 0;
  Observe(state_, obs);
}

StepResult CartPole::Step(std::span<const float> action, std::span<float> obs) {
  assert(!action.empty());
  const int a = action[0] >= 0.5f ? 1 : 0;
  StepResult r;
  r.terminated = Dynamics(state_, a);
  r.reward = 1.0f;  // sutton_barto_reward=False: 1 per step, terminating one included
  ++elapsed_;
  r.truncated = max_episode_steps_ > 0 && elapsed_ >= max_episode_steps_;
  Observe(state_, obs);
  return r;
}

Result<std::unique_ptr<Env>> MakeCartPole(const nlohmann::json& params) {
  Params p(params, "env cartpole");
  const int max_steps = p.Get("max_episode_steps", 500);
  if (max_steps < 0) p.Invalid("max_episode_steps", "must be >= 0 (0: no time limit)");
  AGENTRT_RETURN_IF_ERROR(p.Finish());
  return std::unique_ptr<Env>(std::make_unique<CartPole>(max_steps));
}

}  // namespace agentrt
