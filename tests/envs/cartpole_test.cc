// CartPole matches Gymnasium's CartPole-v1. The reference trajectories below
// were computed with CPython floats (IEEE double, as Gymnasium's float64 numpy
// state) from Gymnasium's equations:
//   temp = (force + polemass_length * theta_dot**2 * sin) / total_mass
//   thetaacc = (g * sin - cos * temp) / (length * (4/3 - masspole * cos**2 / total_mass))
//   xacc = temp - polemass_length * thetaacc * cos / total_mass
//   x += tau * x_dot; x_dot += tau * xacc; theta += tau * theta_dot; theta_dot += tau * thetaacc
#include "envs/cartpole.h"

#include <array>
#include <catch2/catch.hpp>
#include <vector>

using agentrt::CartPole;

namespace {

void RequireStateNear(const CartPole::State& got, const CartPole::State& want) {
  for (size_t i = 0; i < 4; ++i) {
    INFO("state component " << i);
    REQUIRE(got[i] == Approx(want[i]).margin(1e-12).epsilon(1e-12));
  }
}

}  // namespace

TEST_CASE("cartpole constants are Gymnasium's CartPole-v1") {
  CHECK(CartPole::kGravity == 9.8);
  CHECK(CartPole::kMassCart == 1.0);
  CHECK(CartPole::kMassPole == 0.1);
  CHECK(CartPole::kLength == 0.5);
  CHECK(CartPole::kForceMag == 10.0);
  CHECK(CartPole::kTau == 0.02);
  CHECK(CartPole::kXThreshold == 2.4);
  CHECK(CartPole::kThetaThreshold == Approx(0.20943951023931953).epsilon(1e-15));
  CartPole env;
  CHECK(env.action_space().is_discrete());
  CHECK(env.action_space().n() == 2);
  CHECK(env.observation_space().size() == 4);
  CHECK(env.observation_space().high()[0] == Approx(4.8f));
  CHECK(env.observation_space().high()[2] == Approx(0.41887903f));
}

TEST_CASE("cartpole steps follow the hand-computed Gymnasium trajectory") {
  CartPole env;
  std::array<float, 4> obs{};
  env.Reset(1, obs);
  env.set_state({0.01, -0.02, 0.03, 0.04});
  const std::array<int, 8> actions = {1, 1, 0, 1, 0, 0, 1, 0};
  const std::array<CartPole::State, 8> want = {{
      {0.009600000000000001, 0.17467919574755525, 0.030799999999999998, -0.2430687179600081},
      {0.013093583914951107, 0.3693479760579556, 0.025938625640799837, -0.5258796280501483},
      {0.02048054343611022, 0.17387081260481596, 0.01542103307979687, -0.22513741609237464},
      {0.02395795968820654, 0.3687690101747617, 0.010918284757949377, -0.5129163478026587},
      {0.03133333989170178, 0.17349499275068458, 0.0006599578018962032, -0.21681286835696195},
      {0.03480323974671547, -0.021636386741578473, -0.0036762995652430356, 0.07607816471983775},
      {0.034370512011883896, 0.17353807374944197, -0.0021547362708462803, -0.21776237729324466},
      {0.03784127348687273, -0.021553008903725218, -0.006509983816711174, 0.07424007537375293},
  }};
  for (size_t t = 0; t < actions.size(); ++t) {
    INFO("step " << t);
    const float action = static_cast<float>(actions[t]);
    const agentrt::StepResult r = env.Step({&action, 1}, obs);
    RequireStateNear(env.state(), want[t]);
    for (size_t i = 0; i < 4; ++i) CHECK(obs[i] == static_cast<float>(want[t][i]));
    CHECK(r.reward == 1.0f);
    CHECK_FALSE(r.terminated);
    CHECK_FALSE(r.truncated);
  }
}

TEST_CASE("cartpole terminates past 12 degrees and pays 1 for the terminating step") {
  CartPole env;
  std::array<float, 4> obs{};
  env.Reset(1, obs);
  env.set_state({0.01, -0.02, 0.03, 0.04});
  const float right = 1.0f;
  agentrt::StepResult r;
  int steps = 0;
  do {
    r = env.Step({&right, 1}, obs);
    ++steps;
    REQUIRE(steps <= 10);
  } while (!r.terminated);
  // Reference: always pushing right from that state, theta leaves [-12deg, 12deg]
  // at step 10 (theta = -0.2236 rad < -0.2094 rad).
  CHECK(steps == 10);
  RequireStateNear(env.state(), {0.18148412486073115, 1.9330643896994748, -0.2235691808247548,
                                 -2.984082745435586});
  CHECK(r.reward == 1.0f);
  CHECK_FALSE(r.truncated);
}

TEST_CASE("cartpole terminates when the cart leaves |x| <= 2.4") {
  CartPole env;
  std::array<float, 4> obs{};
  env.Reset(3, obs);
  env.set_state({2.39, 1.0, 0.0, 0.0});  // x + tau * x_dot = 2.41 > 2.4
  const float left = 0.0f;
  const agentrt::StepResult r = env.Step({&left, 1}, obs);
  CHECK(r.terminated);
  CHECK(env.state()[0] == Approx(2.41));
}

TEST_CASE("cartpole is truncated after 500 steps") {
  CartPole env;
  std::array<float, 4> obs{};
  env.Reset(5, obs);
  agentrt::StepResult r;
  for (int t = 0; t < 500; ++t) {
    env.set_state({0.0, 0.0, 0.0, 0.0});  // hold it upright: never terminal
    const float action = static_cast<float>(t % 2);
    r = env.Step({&action, 1}, obs);
    REQUIRE_FALSE(r.terminated);
    if (t < 499) REQUIRE_FALSE(r.truncated);
  }
  CHECK(r.truncated);
  CHECK(env.elapsed_steps() == 500);
}

TEST_CASE("cartpole reset draws each state component uniformly from [-0.05, 0.05]") {
  CartPole env;
  std::array<float, 4> obs{};
  std::array<double, 4> lo{1, 1, 1, 1}, hi{-1, -1, -1, -1};
  for (uint64_t seed = 0; seed < 2000; ++seed) {
    env.Reset(seed, obs);
    for (size_t i = 0; i < 4; ++i) {
      REQUIRE(env.state()[i] >= -0.05);
      REQUIRE(env.state()[i] < 0.05);
      lo[i] = std::min(lo[i], env.state()[i]);
      hi[i] = std::max(hi[i], env.state()[i]);
    }
  }
  for (size_t i = 0; i < 4; ++i) {
    CHECK(lo[i] < -0.049);
    CHECK(hi[i] > 0.049);
  }
  // Same seed, same start; no seed continues the stream.
  env.Reset(42, obs);
  const CartPole::State first = env.state();
  env.Reset(std::nullopt, obs);
  CHECK(env.state() != first);
  env.Reset(42, obs);
  CHECK(env.state() == first);
}

TEST_CASE("cartpole factory reads max_episode_steps and rejects unknown parameters") {
  auto env = agentrt::MakeCartPole({{"max_episode_steps", 3}});
  REQUIRE(env.ok());
  std::array<float, 4> obs{};
  (*env)->Reset(0, obs);
  const float a = 0.0f;
  CHECK_FALSE((*env)->Step({&a, 1}, obs).truncated);
  CHECK_FALSE((*env)->Step({&a, 1}, obs).truncated);
  CHECK((*env)->Step({&a, 1}, obs).truncated);

  auto bad = agentrt::MakeCartPole({{"max_episode_step", 3}});
  REQUIRE_FALSE(bad.ok());
  CHECK_THAT(bad.status().message(), Catch::Contains("unknown parameter 'max_episode_step'"));
  auto wrong_type = agentrt::MakeCartPole({{"max_episode_steps", "long"}});
  REQUIRE_FALSE(wrong_type.ok());
  CHECK_THAT(wrong_type.status().message(), Catch::Contains("must be an integer"));
}
