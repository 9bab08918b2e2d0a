// agent-worker's pieces without processes: seating of a pursuit world from the
// plan, the args the worker accepts or refuses, the pursuit evaluation. (The
// policy snapshot format is the learners' own: tests/learners/policy_snapshot_test.cc.)
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdio>
#include <fstream>
#include <string>

#include "agent_runtime/group.h"
#include "envs/registry.h"
#include "learners/ppo.h"
#include "tests/plan/plan_test_util.h"
#include "tools/agent-worker/settings.h"
#include "tools/agent-worker/world_eval.h"

using namespace agentrt;
using namespace agentrt::worker;

TEST_CASE("pursuit seats follow the plan's roles in plan order") {
  const Plan plan = testing::TestPlan(
      "r", std::vector<testing::TestAgent>{
               {"predator-0", 1, GroupBackend::kSingle, {{"env", "pursuit"}, {"role", "predator"}}},
               {"predator-1", 1, GroupBackend::kSingle, {{"env", "pursuit"}, {"role", "predator"}}},
               {"prey-0", 1, GroupBackend::kSingle, {{"env", "pursuit"}, {"role", "prey"}}},
               {"cartpole", 1, GroupBackend::kSingle, {{"env", "cartpole"}}}});
  auto settings = WorkerSettings::FromArgs(plan.agents[1].args, "test");
  REQUIRE(settings.ok());
  auto seats = SeatWorld(plan, "predator-1", *settings);
  REQUIRE(seats.ok());
  CHECK(seats->control == 1);
  CHECK(seats->count == std::vector<int>{2, 1});
  CHECK(seats->first == std::vector<int>{0, 2});
  CHECK(seats->side == 0);
  CHECK(seats->others == std::map<int, std::string>{{0, "predator-0"}, {2, "prey-0"}});
  CHECK(seats->world_args["control"] == 1);

  auto prey = SeatWorld(plan, "prey-0", *WorkerSettings::FromArgs(plan.agents[2].args, "test"));
  REQUIRE(prey.ok());
  CHECK(prey->control == 2);
  CHECK(prey->others.size() == 2);

  // A world too small for every agent of a side: the one left over is told why.
  nlohmann::json small = {
      {"env", "pursuit"}, {"role", "predator"}, {"env_args", {{"predators", 1}, {"capture_k", 1}}}};
  auto none = SeatWorld(plan, "predator-1", *WorkerSettings::FromArgs(small, "test"));
  REQUIRE_FALSE(none.ok());
  CHECK_THAT(none.status().message(),
             Catch::Contains("predator-1") && Catch::Contains("no predator seat"));

  auto no_role =
      SeatWorld(plan, "predator-0", *WorkerSettings::FromArgs({{"env", "pursuit"}}, "test"));
  REQUIRE_FALSE(no_role.ok());
  CHECK_THAT(no_role.status().message(), Catch::Contains("role"));
}

TEST_CASE("worker args are read by name and typos are refused") {
  auto ok = WorkerSettings::FromArgs({{"env", "pursuit"},
                                      {"role", "prey"},
                                      {"lr", 0.0005},
                                      {"steps", 30000},
                                      {"snapshot_every", 3}},
                                     "agent prey-0 args");
  REQUIRE(ok.ok());
  CHECK(ok->trainer.ppo.lr == Approx(0.0005f));
  CHECK(ok->trainer.ppo.steps == 30000);
  CHECK(ok->snapshot_every == 3);

  auto typo = WorkerSettings::FromArgs({{"env", "cartpole"}, {"stesp", 10}}, "agent a args");
  REQUIRE_FALSE(typo.ok());
  CHECK_THAT(typo.status().message(), Catch::Contains("agent a args") && Catch::Contains("stesp"));

  auto algo = WorkerSettings::FromArgs({{"algo", "dqn"}}, "agent a args");
  REQUIRE_FALSE(algo.ok());
  CHECK_THAT(algo.status().message(), Catch::Contains("algo"));

  auto role = WorkerSettings::FromArgs({{"role", "hunter"}}, "agent a args");
  REQUIRE_FALSE(role.ok());
  CHECK_THAT(role.status().message(), Catch::Contains("hunter"));
}

TEST_CASE("random predators rarely catch a random prey that a chasing team catches") {
  const nlohmann::json world = {{"predators", 2}, {"prey", 1}};
  auto random = PlayWorld("pursuit", world, 100, 11, [](int, std::span<const float>, Rng& rng) {
    return static_cast<int>(rng.Below(5));
  });
  REQUIRE(random.ok());
  CHECK(random->episodes == 100);
  CHECK(random->mean_length > 0);
  // A scripted chaser (moves towards the prey seen in its window) as a sanity
  // check that PlayWorld counts captures at all.
  auto chase = PlayWorld("pursuit", world, 100, 11,
                         [](int seat, std::span<const float> obs, Rng& rng) -> int {
                           if (seat >= 2) return static_cast<int>(rng.Below(5));
                           const int w = 5;  // window of obs_radius 2
                           for (int y = 0; y < w; ++y) {
                             for (int x = 0; x < w; ++x) {
                               if (obs[static_cast<size_t>(2 * w * w + y * w + x)] > 0) {
                                 const int dx = x - 2, dy = y - 2;
                                 if (dx == 0 && dy == 0) return 0;
                                 if (std::abs(dx) >= std::abs(dy)) return dx < 0 ? 3 : 4;
                                 return dy < 0 ? 1 : 2;
                               }
                             }
                           }
                           return static_cast<int>(1 + rng.Below(4));
                         });
  REQUIRE(chase.ok());
  INFO("random " << random->score_per_episode << " chase " << chase->score_per_episode);
  CHECK(chase->score_per_episode > random->score_per_episode);
}

TEST_CASE("a league member's world is one seat per side; the league plays the other") {
  auto predator = WorkerSettings::FromArgs({{"env", "pursuit"}, {"role", "predator"}}, "test");
  REQUIRE(predator.ok());
  auto seats = SeatLeague("hunter", *predator);
  REQUIRE(seats.ok());
  CHECK(seats->control == 0);
  CHECK(seats->count == std::vector<int>{1, 1});
  CHECK(seats->others == std::map<int, std::string>{{1, std::string(kLeagueServiceName)}});
  CHECK(seats->world_args["capture_k"] == 1);
  auto prey = SeatLeague("runner",
                         *WorkerSettings::FromArgs({{"env", "pursuit"}, {"role", "prey"}}, "test"));
  REQUIRE(prey.ok());
  CHECK(prey->control == 1);
  CHECK(prey->side == 1);
  auto crowded = SeatLeague(
      "hunter",
      *WorkerSettings::FromArgs(
          {{"env", "pursuit"}, {"role", "predator"}, {"env_args", {{"predators", 2}}}}, "test"));
  REQUIRE_FALSE(crowded.ok());
  CHECK_THAT(crowded.status().message(),
             Catch::StartsWith("agent hunter: league play is one predator against one prey"));
}

TEST_CASE("a role is a side of the env's world") {
  auto cartpole = WorkerSettings::FromArgs({{"env", "cartpole"}, {"role", "prey"}}, "a");
  REQUIRE_FALSE(cartpole.ok());
  CHECK_THAT(
      cartpole.status().message(),
      Catch::Contains("only for a multi-agent world with sides to play; env cartpole has none"));
  auto wrong = WorkerSettings::FromArgs({{"env", "pursuit"}, {"role", "hunter"}}, "a");
  REQUIRE_FALSE(wrong.ok());
  CHECK_THAT(wrong.status().message(),
             Catch::Contains("must be \"predator\" or \"prey\", got \"hunter\""));
  const std::optional<WorldSides> sides = GlobalEnvRegistry().SidesOf("pursuit");
  REQUIRE(sides.has_value());
  CHECK(sides->SideOf("prey") == 1);
  CHECK(sides->sized(nlohmann::json::object(), {3, 0}) ==
        nlohmann::json{{"predators", 3}, {"prey", 1}});
  CHECK_FALSE(GlobalEnvRegistry().SidesOf("cartpole").has_value());
}
