// NodeFailover (scheduler/node_failover.h): which spare takes a failed node's
// ranks, that nothing else moves, and when there is none.
#include "scheduler/node_failover.h"

#include <catch2/catch.hpp>

namespace agentrt {
namespace {

NodeSpec Node(const std::string& name, int gpus, const std::string& type = "", int cpus = 8) {
  NodeSpec n;
  n.name = name;
  n.gpus = gpus;
  n.cpus = cpus;
  n.addr = "10.0.0." + name.substr(1);
  n.gpu_type = type;
  return n;
}

AgentPlan Agent(const std::string& name, std::vector<Placement> placement) {
  AgentPlan a;
  a.name = name;
  a.placement = std::move(placement);
  for (const auto& p : a.placement) {
    a.ranks += static_cast<int>(p.ranks.size());
    a.gpus += static_cast<int>(p.gpus.size());
  }
  a.ports = {a.placement.front().node, 20016, 20031};
  a.master_addr = "10.0.0." + a.placement.front().node.substr(1);
  return a;
}

// n1: steady (1 GPU); n2+n3: wide (2 ranks on each, GPUs 0-1); spares n4, n5.
Plan MakePlan() {
  Plan p;
  p.run = "t";
  p.agents = {Agent("steady", {{"n1", {0}, {0}}}),
              Agent("wide", {{"n2", {0, 1}, {0, 1}}, {"n3", {0, 1}, {2, 3}}})};
  return p;
}

}  // namespace

TEST_CASE("an agent on a failed node takes a spare; its other nodes, ports and peers stay") {
  NodeFailover f({Node("n1", 2), Node("n2", 2), Node("n3", 2), Node("n4", 2), Node("n5", 2)});
  Plan plan = MakePlan();
  CHECK(f.Spares(plan, {}) == std::vector<std::string>{"n4", "n5"});

  // steady's node is fine: it stays.
  const FailoverDecision stay = f.Relocate(plan, "steady", {"n2"});
  CHECK(stay.kind == FailoverDecision::Kind::kStay);
  CHECK(plan.agents[0].placement.front().node == "n1");

  const FailoverDecision d = f.Relocate(plan, "wide", {"n2"});
  REQUIRE(d.kind == FailoverDecision::Kind::kMoved);
  CHECK(d.failed == std::vector<std::string>{"n2"});
  CHECK(d.moved_to == std::vector<std::string>{"n4"});
  const AgentPlan& wide = plan.agents[1];
  REQUIRE(wide.placement.size() == 2);
  CHECK(wide.placement[0].node == "n4");
  CHECK(wide.placement[0].ranks == std::vector<int>{0, 1});
  CHECK(wide.placement[0].gpus == std::vector<int>{0, 1});
  CHECK(wide.placement[1].node == "n3");  // the healthy node keeps its ranks
  CHECK(wide.ports.node == "n4");
  CHECK(wide.ports.first == 20016);  // same block
  CHECK(wide.master_addr == "10.0.0.4");
  CHECK(plan.agents[0].placement.front().node == "n1");
  CHECK(f.Spares(plan, {"n2"}) == std::vector<std::string>{"n5"});
}

TEST_CASE("the agents of one failed node share a spare while it has room") {
  // n1 holds three single-GPU agents and a CPU one; spares n4 (4 GPUs, 4 CPUs) and n5.
  NodeFailover f(
      {Node("n1", 4), Node("n2", 2), Node("n3", 2), Node("n4", 4, "", 4), Node("n5", 2)});
  Plan plan = MakePlan();
  plan.agents.push_back(Agent("b", {{"n1", {1}, {0}}}));
  plan.agents.push_back(Agent("c", {{"n1", {2}, {0}}}));
  plan.agents.push_back(Agent("cpu", {{"n1", {}, {0}}}));
  for (const char* name : {"steady", "b", "c", "cpu"}) {
    INFO(name);
    const FailoverDecision d = f.Relocate(plan, name, {"n1"});
    REQUIRE(d.kind == FailoverDecision::Kind::kMoved);
    CHECK(d.moved_to == std::vector<std::string>{"n4"});
  }
  CHECK(plan.agents[0].placement.front().gpus == std::vector<int>{0});
  CHECK(plan.agents[2].placement.front().gpus == std::vector<int>{1});
  CHECK(plan.agents[3].placement.front().gpus == std::vector<int>{2});
  CHECK(plan.agents[4].placement.front().gpus.empty());
  CHECK(f.Spares(plan, {"n1"}) == std::vector<std::string>{"n5"});  // still a spare
  // n4's four CPUs are taken: a fifth agent of n1 goes to n5.
  plan.agents.push_back(Agent("e", {{"n1", {3}, {0}}}));
  const FailoverDecision e = f.Relocate(plan, "e", {"n1"});
  REQUIRE(e.kind == FailoverDecision::Kind::kMoved);
  CHECK(e.moved_to == std::vector<std::string>{"n5"});
  CHECK(plan.agents[5].placement.front().gpus == std::vector<int>{0});
}

TEST_CASE("a spare is shared only by agents of the same failed node, never twice by one agent") {
  NodeFailover f({Node("n1", 2), Node("n2", 2), Node("n3", 2), Node("n4", 4), Node("n5", 2)});
  Plan plan = MakePlan();
  REQUIRE(f.Relocate(plan, "steady", {"n1"}).moved_to == std::vector<std::string>{"n4"});
  // wide's n2 fails: n4 has room, but holds an agent of n1 (whose port block may be wide's).
  const FailoverDecision d2 = f.Relocate(plan, "wide", {"n1", "n2"});
  REQUIRE(d2.kind == FailoverDecision::Kind::kMoved);
  CHECK(d2.moved_to == std::vector<std::string>{"n5"});
  // Then its n3: n5 is its own already, n4 is n1's: no spare.
  const FailoverDecision d3 = f.Relocate(plan, "wide", {"n1", "n2", "n3"});
  CHECK(d3.kind == FailoverDecision::Kind::kNoSpare);
  CHECK(plan.agents[1].placement[0].node == "n5");
  CHECK(plan.agents[1].placement[1].node == "n3");
}

TEST_CASE("a failed node is never handed out again, even when SLURM says it is back") {
  NodeFailover f({Node("n1", 2), Node("n2", 2), Node("n3", 2), Node("n4", 2), Node("n5", 2)});
  Plan plan = MakePlan();
  REQUIRE(f.Relocate(plan, "wide", {"n3"}).kind == FailoverDecision::Kind::kMoved);
  CHECK(plan.agents[1].placement[1].node == "n4");
  // n3 is back up, then n1 fails: steady goes to n5, not to n3.
  const FailoverDecision d = f.Relocate(plan, "steady", {"n1"});
  REQUIRE(d.kind == FailoverDecision::Kind::kMoved);
  CHECK(d.moved_to == std::vector<std::string>{"n5"});
  CHECK(f.Spares(plan, {}).empty());
}

TEST_CASE("no spare that fits: the decision says so, and the plan is left as it was") {
  // The only spare has one GPU, of another type; wide needs two on each node.
  NodeFailover f({Node("n1", 2), Node("n2", 2), Node("n3", 2), Node("n4", 1, "b200")});
  Plan plan = MakePlan();
  plan.agents[1].gpu_type = "h100";
  const Plan before = plan;
  const FailoverDecision d = f.Relocate(plan, "wide", {"n2", "n3"});
  REQUIRE(d.kind == FailoverDecision::Kind::kNoSpare);
  CHECK(d.failed == std::vector<std::string>{"n2", "n3"});
  CHECK_THAT(d.reason, Catch::Contains("no spare node left") && Catch::Contains("n2") &&
                           Catch::Contains("2 h100 GPU(s)") && Catch::Contains("1 spare"));
  CHECK(PlanToJsonString(plan) == PlanToJsonString(before));

  // A spare with too few CPU slots for the ranks does not fit either.
  NodeFailover small({Node("n1", 2), Node("n2", 2), Node("n3", 2), Node("n4", 2, "", 1)});
  Plan p2 = MakePlan();
  CHECK(small.Relocate(p2, "wide", {"n2"}).kind == FailoverDecision::Kind::kNoSpare);
}

TEST_CASE("an elastic agent with no spare goes on with its healthy nodes' ranks") {
  NodeFailover f({Node("n1", 2), Node("n2", 2), Node("n3", 2)});  // no spare at all
  Plan plan = MakePlan();
  plan.agents[1].restart.elastic_min_ranks = 2;
  const FailoverDecision d = f.Relocate(plan, "wide", {"n2"});
  REQUIRE(d.kind == FailoverDecision::Kind::kShrunk);
  CHECK(d.failed == std::vector<std::string>{"n2"});
  CHECK_THAT(d.reason, Catch::Contains("no spare node left") &&
                           Catch::Contains("goes on with the 2 rank(s) on n3 (4 planned, "
                                           "restart.elastic.min_ranks 2)"));
  const AgentPlan& wide = plan.agents[1];
  CHECK(wide.ranks == 2);
  CHECK(wide.planned_ranks == 4);
  CHECK(wide.gpus == 2);
  REQUIRE(wide.placement.size() == 1);
  CHECK(wide.placement[0].node == "n3");
  CHECK(wide.placement[0].ranks == std::vector<int>{0, 1});  // renumbered from 0
  CHECK(wide.placement[0].gpus == std::vector<int>{0, 1});   // its GPUs there, as planned
  CHECK(wide.ports.node == "n3");
  CHECK(wide.ports.first == 20016);
  CHECK(wide.master_addr == "10.0.0.3");
  CHECK(plan.agents[0].placement.front().node == "n1");  // the other agent is not touched
  // The planned size survives plan.json.
  plan.agents[1].index = 1;
  auto again = PlanFromJsonString(PlanToJsonString(plan));
  REQUIRE(again.ok());
  CHECK(again->agents[1].planned_ranks == 4);
  CHECK(again->agents[1].restart.elastic_min_ranks == 2);
  REQUIRE(again->agents[1].planned_placement.size() == 2);
  CHECK(again->agents[1].planned_placement[0].node == "n2");
  CHECK(again->agents[1].planned_placement[1].ranks == std::vector<int>{2, 3});
}

TEST_CASE("a shrunk agent grows back when a requeued allocation holds its planned nodes") {
  NodeFailover f({Node("n1", 2), Node("n2", 2), Node("n3", 2)});
  Plan plan = MakePlan();
  plan.agents[1].restart.elastic_min_ranks = 2;
  const Plan planned = plan;
  REQUIRE(f.Relocate(plan, "wide", {"n2"}).kind == FailoverDecision::Kind::kShrunk);
  // The same controller never gives n2 back, even once it is up again.
  CHECK(f.GrowBack(plan, {}).empty());
  CHECK(plan.agents[1].ranks == 2);

  // The requeued allocation's controller: while n2 is still down, nothing changes ...
  NodeFailover requeued({Node("n1", 2), Node("n2", 2), Node("n3", 2)});
  CHECK(requeued.GrowBack(plan, {"n2"}).empty());
  CHECK(plan.agents[1].ranks == 2);
  // ... nor when the allocation lacks it.
  NodeFailover without({Node("n1", 2), Node("n3", 2)});
  CHECK(without.GrowBack(plan, {}).empty());
  // Once it is up, the agent has its planned placement, ranks, GPUs and first node back.
  CHECK(requeued.GrowBack(plan, {}) == std::vector<std::string>{"wide"});
  CHECK(PlanToJsonString(plan) == PlanToJsonString(planned));
  CHECK(plan.agents[1].planned_placement.empty());
  CHECK(plan.agents[1].master_addr == "10.0.0.2");
  CHECK(requeued.GrowBack(plan, {}).empty());  // once
}

TEST_CASE("a shrunk agent's lost node is no spare for another, and is not taken from one") {
  NodeFailover f({Node("n1", 2), Node("n2", 2), Node("n3", 2)});
  Plan plan = MakePlan();
  plan.agents[1].restart.elastic_min_ranks = 2;
  REQUIRE(f.Relocate(plan, "wide", {"n2"}).kind == FailoverDecision::Kind::kShrunk);
  // n2 back and up: still wide's to grow back onto, not a spare for steady.
  NodeFailover later({Node("n1", 2), Node("n2", 2), Node("n3", 2)});
  CHECK(later.Spares(plan, {}).empty());
  // Were steady on n2 all the same (a plan written otherwise), wide would not grow onto it.
  plan.agents[0].placement[0].node = "n2";
  CHECK(later.GrowBack(plan, {}).empty());
  CHECK(plan.agents[1].ranks == 2);
}

TEST_CASE("an elastic agent whose healthy nodes hold fewer than min_ranks still requeues") {
  NodeFailover f({Node("n1", 2), Node("n2", 2), Node("n3", 2)});
  Plan plan = MakePlan();
  plan.agents[1].restart.elastic_min_ranks = 3;
  const Plan before = plan;
  const FailoverDecision d = f.Relocate(plan, "wide", {"n3"});
  REQUIRE(d.kind == FailoverDecision::Kind::kNoSpare);
  CHECK_THAT(d.reason, Catch::Contains("restart.elastic needs at least 3 rank(s), its healthy "
                                       "nodes hold 2"));
  CHECK(PlanToJsonString(plan) == PlanToJsonString(before));
  // A spare that fits is still preferred to shrinking.
  NodeFailover spare({Node("n1", 2), Node("n2", 2), Node("n3", 2), Node("n4", 2)});
  Plan p2 = MakePlan();
  p2.agents[1].restart.elastic_min_ranks = 1;
  CHECK(spare.Relocate(p2, "wide", {"n2"}).kind == FailoverDecision::Kind::kMoved);
  CHECK(p2.agents[1].ranks == 4);
}

TEST_CASE("a requeued allocation without an agent's moved-to spare moves it to a free node") {
  // steady moved to spare n4, which failed; the requeued allocation holds
  // n1-n3 and n5 (SLURM gave it another spare): steady takes a free node.
  Plan plan = MakePlan();
  plan.agents[0].placement[0].node = "n4";
  plan.agents[0].ports.node = "n4";
  NodeFailover f({Node("n1", 2), Node("n2", 2), Node("n3", 2), Node("n5", 2)});
  const auto placed = f.PlaceStrays(plan, {});
  REQUIRE(placed.size() == 1);
  CHECK(placed[0].first == "steady");
  CHECK(placed[0].second.kind == FailoverDecision::Kind::kMoved);
  CHECK(placed[0].second.failed == std::vector<std::string>{"n4"});
  CHECK(plan.agents[0].placement[0].node == "n1");  // the first node no agent uses
  CHECK(plan.agents[0].ports.node == "n1");
  CHECK(plan.agents[1].placement[0].node == "n2");  // wide holds its nodes: untouched

  // Every agent where the allocation holds it, nothing down: nothing moves.
  NodeFailover again({Node("n1", 2), Node("n2", 2), Node("n3", 2), Node("n5", 2)});
  CHECK(again.PlaceStrays(plan, {}).empty());
  // A stray with no free node that fits: the decision says so, the plan stays.
  plan.agents[0].placement[0].node = "n4";
  NodeFailover full({Node("n2", 2), Node("n3", 2)});
  const auto none = full.PlaceStrays(plan, {});
  REQUIRE(none.size() == 1);
  CHECK(none[0].second.kind == FailoverDecision::Kind::kNoSpare);
  CHECK(plan.agents[0].placement[0].node == "n4");
}

}  // namespace agentrt
