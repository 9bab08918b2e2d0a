// agent-worker's pieces without processes: policy snapshots on the wire, the
// snapshot player against the learner it came from, seating of a pursuit
// world from the plan, and the args the worker accepts or refuses.
#include <catch2/catch.hpp>

#include <cstdio>
#include <fstream>
#include <string>
#include <unistd.h>

#include "agent_runtime/group.h"
#include "envs/registry.h"
#include "learners/ppo.h"
#include "tools/agent-worker/policy_snapshot.h"
#include "tools/agent-worker/pursuit_eval.h"
#include "tools/agent-worker/settings.h"

using namespace agentrt;
using namespace agentrt::worker;

namespace {

struct LearnerFixture {
  std::unique_ptr<Group> group = MakeSingleRankGroup("unit");
  std::unique_ptr<PpoLearner> learner;
  explicit LearnerFixture(const std::string& env = "cartpole", nlohmann::json env_args = nullptr) {
    auto made = GlobalEnvRegistry().MakeEnv(env, env_args);
    REQUIRE(made.ok());
    PpoConfig config;
    config.num_envs = 2;
    config.rollout_steps = 8;
    config.hidden = 16;
    auto l = PpoLearner::Make(config, (*made)->observation_space(), (*made)->action_space(), *group);
    REQUIRE(l.ok());
    learner = std::move(*l);
  }
};

}  // namespace

TEST_CASE("a policy snapshot survives the wire bit for bit") {
  LearnerFixture f;
  const PolicySnapshot s = SnapshotOf(*f.learner, "predator-0", 4096);
  REQUIRE(s.policy_params.size() == f.learner->network().policy().num_params());
  const std::string wire = EncodeSnapshot(s);
  auto back = DecodeSnapshot(wire);
  REQUIRE(back.ok());
  CHECK(back->agent == "predator-0");
  CHECK(back->env_steps == 4096);
  CHECK(back->obs_size == 4);
  CHECK(back->num_actions == 2);
  CHECK(back->policy_params == s.policy_params);
  CHECK(back->obs_mean == s.obs_mean);
  CHECK(back->obs_var == s.obs_var);
}

TEST_CASE("a damaged policy snapshot is refused with the reason") {
  LearnerFixture f;
  const std::string wire = EncodeSnapshot(SnapshotOf(*f.learner, "prey-0", 0));
  auto truncated = DecodeSnapshot(std::string_view(wire).substr(0, wire.size() - 3));
  REQUIRE_FALSE(truncated.ok());
  CHECK_THAT(truncated.status().message(), Catch::Contains("bytes"));
  CHECK_FALSE(DecodeSnapshot("no header here").ok());
  auto trailing = DecodeSnapshot(wire + "xx");
  REQUIRE_FALSE(trailing.ok());
  CHECK_THAT(trailing.status().message(), Catch::Contains("trailing"));
  const auto pos = wire.find("\"policy_params\":");
  REQUIRE(pos != std::string::npos);
  // e.g. 402 -> 1402 parameters
  const std::string wrong_count = wire.substr(0, pos + 16) + "1" + wire.substr(pos + 16);
  auto bad = DecodeSnapshot(wrong_count);
  REQUIRE_FALSE(bad.ok());
  CHECK_THAT(bad.status().message(), Catch::Contains("prey-0"));
}

TEST_CASE("a snapshot player acts like the learner it was taken from") {
  LearnerFixture f;
  PolicyPlayer player;
  CHECK_FALSE(player.loaded());
  auto decoded = DecodeSnapshot(EncodeSnapshot(SnapshotOf(*f.learner, "me", 0)));
  REQUIRE(decoded.ok());
  REQUIRE(player.Load(*decoded).ok());
  Rng obs_rng(7), rng_a(1), rng_b(1);
  std::vector<float> obs(4), action(1);
  int agree = 0;
  for (int i = 0; i < 200; ++i) {
    for (auto& x : obs) x = static_cast<float>(obs_rng.Normal());
    f.learner->Act(obs, 1, action, /*deterministic=*/true, rng_a);
    agree += player.Act(obs, rng_b, /*deterministic=*/true) == static_cast<int>(action[0]);
  }
  CHECK(agree == 200);
  // Sampling with the same random stream draws the same actions too.
  Rng s1(3), s2(3);
  for (int i = 0; i < 100; ++i) {
    for (auto& x : obs) x = static_cast<float>(obs_rng.Normal());
    f.learner->Act(obs, 1, action, /*deterministic=*/false, s1);
    CHECK(player.Act(obs, s2) == static_cast<int>(action[0]));
  }
}

TEST_CASE("pursuit seats follow the plan's roles in plan order") {
  auto entry = [](std::string name, nlohmann::json args) {
    PlanAgentArgs a;
    a.name = std::move(name);
    a.args = std::move(args);
    return a;
  };
  std::vector<PlanAgentArgs> plan = {entry("predator-0", {{"env", "pursuit"}, {"role", "predator"}}),
                                     entry("predator-1", {{"env", "pursuit"}, {"role", "predator"}}),
                                     entry("prey-0", {{"env", "pursuit"}, {"role", "prey"}}),
                                     entry("cartpole", {{"env", "cartpole"}})};
  auto settings = WorkerSettings::FromArgs(plan[1].args, "test");
  REQUIRE(settings.ok());
  auto seats = SeatPursuit(plan, "predator-1", *settings);
  REQUIRE(seats.ok());
  CHECK(seats->control == 1);
  CHECK(seats->predators == 2);
  CHECK(seats->prey == 1);
  CHECK(seats->others == std::map<int, std::string>{{0, "predator-0"}, {2, "prey-0"}});
  CHECK(seats->world_args["control"] == 1);

  auto prey = SeatPursuit(plan, "prey-0", *WorkerSettings::FromArgs(plan[2].args, "test"));
  REQUIRE(prey.ok());
  CHECK(prey->control == 2);
  CHECK(prey->others.size() == 2);

  // A world too small for every agent of a side: the one left over is told why.
  nlohmann::json small = {{"env", "pursuit"}, {"role", "predator"}, {"env_args", {{"predators", 1}, {"capture_k", 1}}}};
  auto none = SeatPursuit(plan, "predator-1", *WorkerSettings::FromArgs(small, "test"));
  REQUIRE_FALSE(none.ok());
  CHECK_THAT(none.status().message(), Catch::Contains("predator-1") && Catch::Contains("no predator seat"));

  auto no_role = SeatPursuit(plan, "predator-0", *WorkerSettings::FromArgs({{"env", "pursuit"}}, "test"));
  REQUIRE_FALSE(no_role.ok());
  CHECK_THAT(no_role.status().message(), Catch::Contains("role"));
}

TEST_CASE("worker args are read by name and typos are refused") {
  auto ok = WorkerSettings::FromArgs({{"env", "pursuit"}, {"role", "prey"}, {"lr", 0.0005}, {"steps", 30000},
                                      {"snapshot_every", 3}},
                                     "agent prey-0 args");
  REQUIRE(ok.ok());
  CHECK(ok->ppo.lr == Approx(0.0005f));
  CHECK(ok->ppo.steps == 30000);
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

TEST_CASE("the plan's agents are read from plan.json with their args and checkpoint policy") {
  char dir[] = "/tmp/agent-worker-unit-XXXXXX";
  REQUIRE(mkdtemp(dir) != nullptr);
  const std::string path = std::string(dir) + "/plan.json";
  std::ofstream(path) << R"({"run": "r", "agents": [
      {"name": "a", "index": 0, "ranks": 2, "backend": "mpi", "args": {"env": "cartpole"},
       "checkpoint": {"interval_s": 5, "keep_last": 2}},
      {"name": "b", "index": 1, "ranks": 1}]})";
  auto agents = ReadPlanAgents(path);
  REQUIRE(agents.ok());
  REQUIRE(agents->size() == 2);
  CHECK((*agents)[0].ranks == 2);
  CHECK((*agents)[0].backend == "mpi");
  CHECK((*agents)[0].args["env"] == "cartpole");
  CHECK((*agents)[0].checkpoint_interval_s == 5.0);
  CHECK((*agents)[0].checkpoint_keep_last == 2);
  CHECK((*agents)[1].args.empty());
  std::ofstream(path) << R"({"agents": [{"ranks": 1}]})";
  auto bad = ReadPlanAgents(path);
  REQUIRE_FALSE(bad.ok());
  CHECK_THAT(bad.status().message(), Catch::Contains("agents[0]"));
  CHECK_FALSE(ReadPlanAgents(std::string(dir) + "/missing.json").ok());
  std::remove(path.c_str());
  rmdir(dir);
}

TEST_CASE("random predators rarely catch a random prey that a chasing team catches") {
  const nlohmann::json world = {{"predators", 2}, {"prey", 1}};
  auto random = PlayPursuit(world, 100, 11, [](int, std::span<const float>, Rng& rng) {
    return static_cast<int>(rng.Below(5));
  });
  REQUIRE(random.ok());
  CHECK(random->episodes == 100);
  CHECK(random->mean_length > 0);
  // A scripted chaser (moves towards the prey seen in its window) as a sanity
  // check that PlayPursuit counts captures at all.
  auto chase = PlayPursuit(world, 100, 11, [](int seat, std::span<const float> obs, Rng& rng) -> int {
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
  INFO("random " << random->captures_per_episode << " chase " << chase->captures_per_episode);
  CHECK(chase->captures_per_episode > random->captures_per_episode);
}
