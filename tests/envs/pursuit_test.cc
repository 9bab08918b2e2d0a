#include "envs/pursuit.h"

#include <catch2/catch.hpp>
#include <vector>

#include "envs/registry.h"
#include "envs/single_agent_view.h"

using agentrt::Pursuit;
using agentrt::PursuitConfig;

namespace {

struct Scene {
  explicit Scene(PursuitConfig config) : env(config) {
    obs.resize(static_cast<size_t>(env.num_agents()) * env.observation_space().size());
    rewards.resize(static_cast<size_t>(env.num_agents()));
    actions.resize(static_cast<size_t>(env.num_agents()));
    env.Reset(1, obs);
  }
  // Puts agent i at cells[i].
  void Place(const std::vector<Pursuit::Cell>& cells) {
    for (size_t i = 0; i < cells.size(); ++i) env.set_position(static_cast<int>(i), cells[i]);
  }
  agentrt::MultiAgentEnv::StepOutcome Step(std::vector<float> a) {
    actions = std::move(a);
    return env.Step(actions, obs, rewards);
  }
  Pursuit env;
  std::vector<float> obs, rewards, actions;
};

PursuitConfig Config(int predators, int prey, int k) {
  PursuitConfig c;
  c.width = c.height = 7;
  c.predators = predators;
  c.prey = prey;
  c.capture_k = k;
  return c;
}

}  // namespace

TEST_CASE("pursuit moves agents one cell and walls stop them") {
  Scene s(Config(1, 1, 1));
  s.Place({{0, 0}, {6, 6}});
  s.Step({Pursuit::kUp, Pursuit::kLeft});  // both into walls
  CHECK(s.env.position(0).x == 0);
  CHECK(s.env.position(0).y == 0);
  CHECK(s.env.position(1).x == 5);
  s.Step({Pursuit::kDown, Pursuit::kStay});
  CHECK(s.env.position(0).y == 1);
  s.Step({Pursuit::kRight, Pursuit::kUp});
  CHECK(s.env.position(0).x == 1);
  CHECK(s.env.position(1).y == 5);
}

TEST_CASE("pursuit catches a prey only when capture_k predators are adjacent or on it") {
  Scene s(Config(2, 1, 2));
  s.Place({{2, 3}, {6, 0}, {3, 3}});
  // One predator adjacent is not enough with k = 2.
  auto out = s.Step({Pursuit::kStay, Pursuit::kStay, Pursuit::kStay});
  CHECK(s.env.active(2));
  CHECK_FALSE(out.terminated);
  CHECK(s.env.captures() == 0);
  // Second predator steps onto the prey's cell: caught.
  s.env.set_position(1, {3, 2});
  out = s.Step({Pursuit::kStay, Pursuit::kDown, Pursuit::kStay});
  CHECK_FALSE(s.env.active(2));
  CHECK(s.env.captures() == 1);
  CHECK(out.terminated);
  CHECK(s.rewards[0] > 0.9f);
  CHECK(s.rewards[1] > 0.9f);
  CHECK(s.rewards[2] < -0.9f);
}

TEST_CASE("pursuit does not count a predator two cells away") {
  Scene s(Config(2, 1, 2));
  // Predator 0 is two cells from the prey at (3, 3), predator 1 one cell.
  s.Place({{1, 3}, {3, 4}, {3, 3}});
  s.Step({Pursuit::kStay, Pursuit::kStay, Pursuit::kStay});
  CHECK(s.env.active(2));
  s.Step({Pursuit::kRight, Pursuit::kStay, Pursuit::kStay});
  CHECK_FALSE(s.env.active(2));
}

TEST_CASE("pursuit removes caught prey: zero observation, ignored actions, episode goes on") {
  Scene s(Config(1, 2, 1));
  s.Place({{3, 3}, {3, 4}, {0, 0}});
  auto out = s.Step({Pursuit::kStay, Pursuit::kStay, Pursuit::kStay});
  CHECK_FALSE(s.env.active(1));
  CHECK(s.env.active(2));
  CHECK_FALSE(out.terminated);
  const size_t o = s.env.observation_space().size();
  for (size_t k = 0; k < o; ++k) REQUIRE(s.obs[o + k] == 0.0f);
  const auto before = s.env.position(1);
  out = s.Step({Pursuit::kStay, Pursuit::kRight, Pursuit::kStay});
  CHECK(s.env.position(1).x == before.x);
  CHECK(s.rewards[1] == 0.0f);
}

TEST_CASE("pursuit truncates after max_steps") {
  PursuitConfig c = Config(2, 1, 2);
  c.max_steps = 5;
  Scene s(c);
  s.Place({{0, 0}, {0, 1}, {6, 6}});
  agentrt::MultiAgentEnv::StepOutcome out;
  for (int t = 0; t < 5; ++t) {
    REQUIRE_FALSE(out.truncated);
    out = s.Step({Pursuit::kStay, Pursuit::kStay, Pursuit::kStay});
  }
  CHECK(out.truncated);
  CHECK_FALSE(out.terminated);
}

TEST_CASE("pursuit shaping rewards a predator for closing in and a prey for getting away") {
  Scene s(Config(2, 1, 2));
  s.Place({{0, 3}, {0, 0}, {4, 3}});
  s.Step({Pursuit::kRight, Pursuit::kLeft, Pursuit::kRight});  // pred 0 closes 1, prey flees 1
  // predator 0: distance 4 -> 4 (it moved right, prey moved right): no gain
  CHECK(s.rewards[0] == Approx(-0.01f));
  s.Step({Pursuit::kRight, Pursuit::kStay, Pursuit::kStay});
  CHECK(s.rewards[0] == Approx(0.05f - 0.01f));
  CHECK(s.rewards[2] == Approx(-0.05f + 0.01f));
}

TEST_CASE("pursuit observation window shows walls, predators and prey around the agent") {
  PursuitConfig c = Config(2, 1, 2);
  c.obs_radius = 1;
  Scene s(c);
  s.Place({{0, 0}, {1, 0}, {0, 1}});
  s.env.Observe(s.obs);
  const size_t o = s.env.observation_space().size();
  REQUIRE(o == 3 * 9 + 3);
  const float* me = s.obs.data();  // predator 0 at the top-left corner
  // Window row-major (dy, dx) from (-1,-1); index 4 is the agent's own cell.
  CHECK(me[0] == 1.0f);              // (-1,-1) outside
  CHECK(me[4] == 0.0f);              // own cell inside
  CHECK(me[9 + 4] == 1.0f);          // itself, a predator, on its cell
  CHECK(me[9 + 5] == 1.0f);          // predator 1 to the right
  CHECK(me[18 + 7] == 1.0f);         // the prey below
  CHECK(me[27] == 0.0f);             // x / (w-1)
  CHECK(me[29] == 1.0f);             // is a predator
  CHECK(s.obs[2 * o + 29] == 0.0f);  // the prey's flag
}

TEST_CASE("pursuit with the same seed replays the same episode") {
  auto run = [](uint64_t seed) {
    Scene s(Config(2, 2, 2));
    s.env.Reset(seed, s.obs);
    std::vector<float> trace = s.obs;
    for (int t = 0; t < 20; ++t) {
      s.Step({static_cast<float>(t % 5), static_cast<float>((t + 2) % 5),
              static_cast<float>((t + 1) % 5), static_cast<float>((t + 3) % 5)});
      trace.insert(trace.end(), s.obs.begin(), s.obs.end());
      trace.insert(trace.end(), s.rewards.begin(), s.rewards.end());
    }
    return trace;
  };
  CHECK(run(9) == run(9));
  CHECK(run(9) != run(10));
}

TEST_CASE("pursuit parameters are validated by name") {
  auto bad = agentrt::MakePursuit({{"capture_k", 3}, {"predators", 2}});
  REQUIRE_FALSE(bad.ok());
  CHECK_THAT(bad.status().message(), Catch::Contains("capture_k"));
  auto typo = agentrt::MakePursuit({{"preys", 2}});
  REQUIRE_FALSE(typo.ok());
  CHECK_THAT(typo.status().message(), Catch::Contains("unknown parameter 'preys'"));
  auto ok = agentrt::MakePursuit({{"width", 9}, {"predators", 3}, {"prey", 2}});
  REQUIRE(ok.ok());
  CHECK((*ok)->num_agents() == 5);
  CHECK((*ok)->agent_name(3) == "prey_0");
}

TEST_CASE("a single-agent view of pursuit plays the others with the given policy") {
  auto env = agentrt::GlobalEnvRegistry().MakeEnv("pursuit", {{"control", "prey_0"}});
  REQUIRE(env.ok());
  auto* view = dynamic_cast<agentrt::SingleAgentView*>(env->get());
  REQUIRE(view != nullptr);
  CHECK(view->controlled() == 2);
  int calls = 0;
  view->set_others_policy(
      [&](int agent, std::span<const float>, std::span<float> action, agentrt::Rng&) {
        CHECK(agent < 2);
        ++calls;
        action[0] = Pursuit::kStay;
      });
  std::vector<float> obs(view->observation_space().size());
  view->Reset(3, obs);
  auto& world = dynamic_cast<Pursuit&>(view->world());
  const auto p0 = world.position(0);
  const float up = Pursuit::kUp;
  view->Step({&up, 1}, obs);
  CHECK(calls == 2);
  CHECK(world.position(0).x == p0.x);
  CHECK(world.position(0).y == p0.y);
  auto unknown = agentrt::GlobalEnvRegistry().MakeEnv("pursuit", {{"control", "wolf"}});
  REQUIRE_FALSE(unknown.ok());
  CHECK_THAT(unknown.status().message(), Catch::Contains("predator_0"));
}
