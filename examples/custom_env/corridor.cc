#include "corridor.h"

#include <algorithm>
#include <chrono>
#include <thread>

#include "envs/params.h"

Corridor::Corridor(int length, int max_steps, float step_cost, int step_us)
    : length_(length),
      max_steps_(max_steps),
      step_cost_(step_cost),
      step_us_(step_us),
      observation_space_(agentrt::Space::Box({length}, 0.0f, 1.0f)),
      action_space_(agentrt::Space::Discrete(2)) {}

void Corridor::Reset(std::optional<uint64_t> /*seed*/, std::span<float> obs) {
  // Deterministic start: the seed has nothing to randomise here.
  position_ = 0;
  elapsed_ = 0;
  Observe(obs);
}

agentrt::StepResult Corridor::Step(std::span<const float> action, std::span<float> obs) {
  if (step_us_ > 0) std::this_thread::sleep_for(std::chrono::microseconds(step_us_));
  const int move = action[0] >= 0.5f ? 1 : -1;
  position_ = std::clamp(position_ + move, 0, length_ - 1);
  ++elapsed_;
  Observe(obs);
  agentrt::StepResult result;
  result.reward = -step_cost_;
  if (position_ == length_ - 1) {
    result.reward += 1.0f;
    result.terminated = true;
  } else if (elapsed_ >= max_steps_) {
    result.truncated = true;
  }
  return result;
}

void Corridor::Observe(std::span<float> obs) const {
  std::fill(obs.begin(), obs.end(), 0.0f);
  obs[static_cast<size_t>(position_)] = 1.0f;
}

agentrt::Result<std::unique_ptr<agentrt::Env>> MakeCorridor(const nlohmann::json& params) {
  agentrt::Params p(params, "env corridor");
  const int length = p.Get("length", 16);
  const int max_steps = p.Get("max_steps", 64);
  const float step_cost = p.Get("step_cost", 0.01f);
  const int step_us = p.Get("step_us", 0);
  if (length < 2) p.Invalid("length", "must be at least 2");
  if (max_steps < 1) p.Invalid("max_steps", "must be positive");
  if (step_us < 0) p.Invalid("step_us", "must not be negative");
  AGENTRT_RETURN_IF_ERROR(p.Finish());
  return std::unique_ptr<agentrt::Env>(
      std::make_unique<Corridor>(length, max_steps, step_cost, step_us));
}
