// An agent's view of the plan (PlanViews, WriteRunPlan, ReadAgentPlanView):
// what it holds, that it does not grow with the run, and how it is read back.
#include <sys/stat.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <string>
#include <vector>

#include "common/file_util.h"
#include "plan/plan.h"
#include "plan/run_dir.h"
#include "tests/common/temp_dir.h"
#include "tests/plan/plan_test_util.h"

namespace agentrt {
namespace {

using testing::TestAgent;
using testing::TestPlan;

std::vector<std::string> Names(const Plan& plan) {
  std::vector<std::string> out;
  for (const AgentPlan& a : plan.agents) out.push_back(a.name);
  return out;
}

// predator-0/1 and prey-0 share a pursuit world; solo trains cartpole; two
// plain agents name no env; a league of two and a PBT population of two.
Plan MixedPlan() {
  std::vector<TestAgent> agents = {
      {"predator-0", 1, GroupBackend::kSingle, {{"env", "pursuit"}, {"role", "predator"}}},
      {"solo", 1, GroupBackend::kSingle, {{"env", "cartpole"}}},
      {"prey-0", 1, GroupBackend::kSingle, {{"env", "pursuit"}, {"role", "prey"}}},
      {"plain-a", 2, GroupBackend::kMpi, nlohmann::json::object()},
      {"plain-b", 1, GroupBackend::kSingle, nlohmann::json::object()},
      {"predator-1", 1, GroupBackend::kSingle, {{"env", "pursuit"}, {"role", "predator"}}},
  };
  Plan plan = TestPlan(
      "mixed", agents,
      {{"sightings", {"predator-0"}, {"prey-0", "plain-a"}}, {"other", {"plain-b"}, {"solo"}}});
  plan.run_dir = "/runs/mixed";
  plan.warnings = {"a warning about the whole run"};
  plan.nodes = {{"localhost", 0, {}}, {"elsewhere", 0, {}}};
  plan.league.members = {{"plain-a", "main", "pfsp", 0.5, {"plain-b"}},
                         {"plain-b", "main", "pfsp", 0.5, {"plain-a"}}};
  PbtPopulation population;
  population.name = "pop";
  population.agents = {"solo", "plain-b"};
  plan.pbt = {population};
  return plan;
}

TEST_CASE("an agent's view holds it, the agents it plays with, its channels, league and PBT") {
  const Plan plan = MixedPlan();
  const PlanViews views(plan);

  const Plan prey = views.Of(2);
  CHECK(prey.run == "mixed");
  CHECK(prey.run_dir == "/runs/mixed");
  CHECK(prey.bus.port == plan.bus.port);
  // Its world's agents, in plan order with their plan indices: seats stay as in the whole plan.
  CHECK(Names(prey) == std::vector<std::string>{"predator-0", "prey-0", "predator-1"});
  CHECK(prey.FindAgent("predator-1")->index == 5);
  REQUIRE(prey.channels.size() == 1);
  CHECK(prey.channels[0].topic == "sightings");
  CHECK(prey.league.members.empty());
  CHECK(prey.pbt.empty());
  CHECK(prey.warnings.empty());
  REQUIRE(prey.nodes.size() == 1);
  CHECK(prey.nodes[0].name == "localhost");

  const Plan a = views.Of(3);
  CHECK(Names(a) == std::vector<std::string>{"plain-a", "plain-b"});  // its league opponent
  REQUIRE(a.league.members.size() == 2);
  CHECK(a.league.FindMember("plain-a")->opponents == std::vector<std::string>{"plain-b"});
  REQUIRE(a.channels.size() == 1);
  CHECK(a.channels[0].topic == "sightings");

  const Plan solo = views.Of(1);
  CHECK(Names(solo) == std::vector<std::string>{"solo"});
  REQUIRE(solo.pbt.size() == 1);
  CHECK(solo.pbt[0].name == "pop");
  REQUIRE(solo.channels.size() == 1);
  CHECK(solo.channels[0].topic == "other");
}

TEST_CASE("an agent's view does not grow with the run") {
  std::vector<TestAgent> few(10), many(1000);
  for (size_t i = 0; i < many.size(); ++i) many[i].name = "a" + std::to_string(i);
  for (size_t i = 0; i < few.size(); ++i) few[i].name = "a" + std::to_string(i);
  const Plan small = TestPlan("r", few), big = TestPlan("r", many);
  const std::string in_small = PlanToJsonString(PlanViews(small).Of(3), -1);
  const std::string in_big = PlanToJsonString(PlanViews(big).Of(3), -1);
  CHECK(in_big.size() == in_small.size());
  CHECK(PlanToJsonString(big, -1).size() > 50 * in_big.size());
}

TEST_CASE("WriteRunPlan writes plan.json and every view; ReadAgentPlanView reads one back") {
  testing::TempDir dir;
  const Plan plan = MixedPlan();
  REQUIRE(WriteRunPlan(plan, dir.path).ok());
  const RunDir run(dir.path);
  auto whole = ReadPlanFile(run.PlanPath());
  REQUIRE(whole.ok());
  CHECK(whole->agents.size() == plan.agents.size());
  for (const AgentPlan& a : plan.agents) CHECK(std::filesystem::exists(run.AgentPlanPath(a.name)));

  auto view = ReadAgentPlanView(dir.path, "prey-0");
  REQUIRE(view.ok());
  auto expected = PlanFromJsonString(PlanToJsonString(PlanViews(plan).Of(2)));
  REQUIRE(expected.ok());
  CHECK(PlanToJsonString(*view) == PlanToJsonString(*expected));

  auto nobody = ReadAgentPlanView(dir.path, "nobody");
  REQUIRE(nobody.status().code() == StatusCode::kNotFound);
  CHECK_THAT(nobody.status().message(), Catch::Contains("agent 'nobody' is not in the plan") &&
                                            Catch::Contains(run.AgentPlanPath("nobody")));

  // A view that does not hold its agent is refused, not taken for another's.
  REQUIRE(WriteFileAtomic(run.AgentPlanPath("solo"), PlanToJsonString(PlanViews(plan).Of(2)) + "\n")
              .ok());
  auto wrong = ReadAgentPlanView(dir.path, "solo");
  REQUIRE_FALSE(wrong.ok());
  CHECK_THAT(wrong.status().message(), Catch::Contains("agent 'solo' is not in the plan"));
}

TEST_CASE("a run directory made by hand, with plan.json and no plans/, is read whole") {
  testing::TempDir dir;
  const Plan plan = MixedPlan();
  REQUIRE(WritePlanFile(plan, RunDir(dir.path).PlanPath()).ok());
  auto view = ReadAgentPlanView(dir.path, "solo");
  REQUIRE(view.ok());
  CHECK(view->agents.size() == plan.agents.size());
  auto nobody = ReadAgentPlanView(dir.path, "nobody");
  CHECK(nobody.status().code() == StatusCode::kNotFound);
}

}  // namespace
}  // namespace agentrt
