// league: and pbt: in agents.yaml: what they expand to, and every mistake an
// error at file:line:column.
#include <catch2/catch.hpp>
#include <string>

#include "plan/config.h"
#include "plan/plan.h"
#include "scheduler/loader.h"

namespace agentrt {
namespace {

using Catch::Matchers::Contains;
using Catch::Matchers::StartsWith;

std::string ErrorOf(const std::string& text) {
  Result<Config> c = LoadConfigString(text, "agents.yaml");
  return c.ok() ? std::string() : c.status().message();
}

const char* kAgents = R"(agents:
  - {name: hunter, replicas: 2, args: {env: pursuit, role: predator, lr: 0.001}}
  - {name: anchor, args: {env: pursuit, role: predator, lr: 0.001}}
  - {name: runner, args: {env: pursuit, role: prey, lr: 0.001}}
)";

TEST_CASE("league members expand patterns, take their role's matchmaking and default opponents") {
  Result<Config> c = LoadConfigString(std::string(kAgents) + R"(league:
  keep_snapshots: 4
  members:
    - {agents: ["hunter-*"], role: main, opponents: [runner]}
    - {agents: [anchor], role: anchor}
    - {agents: [runner], role: main_exploiter, newest_share: 0.5}
)",
                                      "agents.yaml");
  REQUIRE(c.ok());
  const LeagueConfig& l = c->league;
  REQUIRE(l.members.size() == 4);
  CHECK(l.keep_snapshots == 4);
  const LeagueMember* h = l.FindMember("hunter-1");
  REQUIRE(h != nullptr);
  CHECK(h->role == "main");
  CHECK(h->matchmaking == "pfsp");
  CHECK(h->newest_share == Approx(0.35));
  CHECK(h->opponents == std::vector<std::string>{"runner"});
  const LeagueMember* a = l.FindMember("anchor");
  CHECK(a->matchmaking == "uniform");
  // No opponents given: every other member.
  CHECK(a->opponents == std::vector<std::string>{"hunter-0", "hunter-1", "runner"});
  const LeagueMember* r = l.FindMember("runner");
  CHECK(r->matchmaking == "self");
  CHECK(r->newest_share == Approx(0.5));

  // plan.json carries it unchanged.
  Plan plan;
  plan.run = "r";
  plan.league = l;
  Result<Plan> back = PlanFromJson(nlohmann::json::parse(PlanToJsonString(plan)));
  REQUIRE(back.ok());
  REQUIRE(back->league.members.size() == 4);
  CHECK(back->league.FindMember("runner")->opponents == r->opponents);
  CHECK(back->league.keep_snapshots == 4);
}

TEST_CASE("an unknown league role is an error at its position naming the roles") {
  const std::string e = ErrorOf(std::string(kAgents) + R"(league:
  members:
    - {agents: ["hunter-*"], role: mian}
)");
  CHECK_THAT(e, StartsWith("agents.yaml:7:"));
  CHECK_THAT(e, Contains("unknown role 'mian'"));
  CHECK_THAT(e, Contains("main, main_exploiter, league_exploiter, anchor"));
  CHECK_THAT(e, Contains("did you mean 'main'?"));
}

TEST_CASE("a league member naming a missing agent, or one twice, is an error") {
  CHECK_THAT(ErrorOf(std::string(kAgents) + R"(league:
  members:
    - {agents: [hunterr], role: main}
)"),
             Contains("agents.yaml:7:17: key 'league.members[0].agents[0]': pattern 'hunterr' "
                      "matches no agent"));
  CHECK_THAT(ErrorOf(std::string(kAgents) + R"(league:
  members:
    - {agents: ["hunter-*"], role: main}
    - {agents: [hunter-1], role: anchor}
)"),
             Contains("agent hunter-1 is already a member by league.members[0]"));
  CHECK_THAT(ErrorOf(std::string(kAgents) + R"(league:
  members:
    - {agents: ["hunter-*"], role: main, opponents: [anchor]}
)"),
             Contains("agent anchor is not a league member"));
  CHECK_THAT(ErrorOf(std::string(kAgents) + R"(league:
  members:
    - {agents: ["hunter-*"], role: main, matchmaking: elo}
)"),
             Contains("unknown matchmaking 'elo'; expected one of self, uniform, pfsp"));
}

TEST_CASE("a pbt population expands its agents and hyperparameters") {
  Result<Config> c = LoadConfigString(std::string(kAgents) + R"(pbt:
  - name: hunters
    agents: ["hunter-*", anchor]
    interval_steps: 1000
    hyperparameters:
      lr: {min: 1.0e-5, max: 0.01, perturb: [0.5, 2], log_scale: true}
)",
                                      "agents.yaml");
  REQUIRE(c.ok());
  REQUIRE(c->pbt.size() == 1);
  const PbtPopulation& p = c->pbt[0];
  CHECK(p.agents == std::vector<std::string>{"hunter-0", "hunter-1", "anchor"});
  CHECK(p.interval_steps == 1000);
  CHECK(p.metric == "episode_return_mean");
  REQUIRE(p.hyperparameters.size() == 1);
  CHECK(p.hyperparameters[0].perturb == std::vector<double>{0.5, 2.0});
  CHECK(p.hyperparameters[0].log_scale);
  Plan plan;
  plan.run = "r";
  plan.pbt = c->pbt;
  Result<Plan> back = PlanFromJson(nlohmann::json::parse(PlanToJsonString(plan)));
  REQUIRE(back.ok());
  REQUIRE(back->pbt.size() == 1);
  CHECK(back->pbt[0].agents == p.agents);
  CHECK(back->pbt[0].hyperparameters[0].max == Approx(0.01));
}

TEST_CASE("pbt bounds that exclude an initial value are an error at the bound") {
  const std::string e = ErrorOf(std::string(kAgents) + R"(pbt:
  - agents: ["hunter-*"]
    hyperparameters:
      lr: {min: 0.01, max: 0.1}
)");
  CHECK_THAT(e, StartsWith("agents.yaml:8:17: key 'pbt[0].hyperparameters.lr.min'"));
  CHECK_THAT(e, Contains("agent hunter-0 starts with args.lr = 0.001, outside [0.01, 0.1]"));
}

TEST_CASE("a pbt population naming a missing agent, or too few, or an unset arg, is an error") {
  CHECK_THAT(ErrorOf(std::string(kAgents) + R"(pbt:
  - agents: [hunter-0, hunter-7]
)"),
             Contains("agents.yaml:6:24: key 'pbt[0].agents[1]': pattern 'hunter-7' matches no "
                      "agent"));
  CHECK_THAT(ErrorOf(std::string(kAgents) + R"(pbt:
  - agents: [runner]
)"),
             Contains("a population needs at least 2 agents, got 1"));
  CHECK_THAT(ErrorOf(std::string(kAgents) + R"(pbt:
  - agents: ["hunter-*"]
    hyperparameters:
      ent_coef: {min: 0, max: 0.1}
)"),
             Contains("agent hunter-0 sets no number args.ent_coef"));
  CHECK_THAT(
      ErrorOf(std::string(kAgents) + R"(pbt:
  - agents: ["hunter-*"]
    metric: rating
)"),
      Contains("metric rating is the league's Elo, but agent hunter-0 is not a league member"));
  CHECK_THAT(ErrorOf(std::string(kAgents) + R"(pbt:
  - agents: ["hunter-*"]
    fraction: 0.75
)"),
             Contains("expected a fraction in (0, 0.5], got 0.75"));
}

}  // namespace
}  // namespace agentrt
