// CartPole-v1, exactly as Gymnasium defines it (classic_control/cartpole.py
// plus the TimeLimit(500) wrapper of its registration):
//   gravity 9.8, masscart 1.0, masspole 0.1, length 0.5 (half the pole),
//   force_mag 10.0, tau 0.02 s, explicit Euler integration,
//   terminated when |x| > 2.4 or |theta| > 12 degrees (12 * 2 * pi / 360 rad),
//   reward 1.0 for every step, including the terminating one,
//   truncated after 500 steps, reset state uniform in [-0.05, 0.05]^4.
// The state is integrated in double (as Gymnasium's float64 numpy state) and
// observed as float32. Action: Discrete(2), 0 pushes left, 1 pushes right.
//
// Parameters: {"max_episode_steps": 500}.
#pragma once

#include <array>
#include <cmath>
#include <memory>
#include <nlohmann/json.hpp>

#include "common/status.h"
#include "envs/env.h"
#include "envs/rng.h"

namespace agentrt {

class CartPole final : public Env {
 public:
  static constexpr double kGravity = 9.8;
  static constexpr double kMassCart = 1.0;
  static constexpr double kMassPole = 0.1;
  static constexpr double kTotalMass = kMassPole + kMassCart;
  static constexpr double kLength = 0.5;
  static constexpr double kPoleMassLength = kMassPole * kLength;
  static constexpr double kForceMag = 10.0;
  static constexpr double kTau = 0.02;
  static constexpr double kThetaThreshold = 12 * 2 * 3.141592653589793 / 360;
  static constexpr double kXThreshold = 2.4;

  explicit CartPole(int max_episode_steps = 500);

  const Space& observation_space() const override { return observation_space_; }
  const Space& action_space() const override { return action_space_; }
  void Reset(std::optional<uint64_t> seed, std::span<float> obs) override;
  StepResult Step(std::span<const float> action, std::span<float> obs) override;

  // (x, x_dot, theta, theta_dot); for tests and tools.
  using State = std::array<double, 4>;
  const State& state() const { return state_; }
  void set_state(const State& state) { state_ = state; }
  int elapsed_steps() const { return elapsed_; }

  // The dynamics alone: one Euler step of `state` under action 0/1. Returns
  // whether the new state is terminal. Inline so benchmarks see the raw cost.
  static bool Dynamics(State& state, int action);

 private:
  Space observation_space_;
  Space action_space_;
  int max_episode_steps_;
  State state_{};
  int elapsed_ = 0;
  Rng rng_;
};

Result<std::unique_ptr<Env>> MakeCartPole(const nlohmann::json& params);

inline bool CartPole::Dynamics(State& s, int action) {
  const double force = action == 1 ? kForceMag : -kForceMag;
  const double costheta = std::cos(s[2]);
  const double sintheta = std::sin(s[2]);
  const double temp = (force + kPoleMassLength * s[3] * s[3] * sintheta) / kTotalMass;
  const double thetaacc = (kGravity * sintheta - costheta * temp) /
                          (kLength * (4.0 / 3.0 - kMassPole * costheta * costheta / kTotalMass));
  const double xacc = temp - kPoleMassLength * thetaacc * costheta / kTotalMass;
  s[0] = s[0] + kTau * s[1];
  s[1] = s[1] + kTau * xacc;
  s[2] = s[2] + kTau * s[3];
  s[3] = s[3] + kTau * thetaacc;
  return s[0] < -kXThreshold || s[0] > kXThreshold || s[2] < -kThetaThreshold ||
         s[2] > kThetaThreshold;
}

}  // namespace agentrt
