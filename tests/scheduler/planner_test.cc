// Hand-written planner cases: topology, best fit, multi-node, pinning, CPUs,
// ports, and the messages of infeasible plans.
#include "scheduler/planner.h"

#include <fmt/format.h>

#include <catch2/catch.hpp>
#include <cstdlib>
#include <filesystem>
#include <set>
#include <string>

#include "plan/run_dir.h"
#include "scheduler/inventory.h"
#include "scheduler/loader.h"
#include "tests/common/temp_dir.h"

namespace agentrt {
namespace {

using Catch::Matchers::Contains;
using Ints = std::vector<int>;

Config Load(const std::string& yaml) {
  Result<Config> c = LoadConfigString(yaml, "test.yaml");
  INFO(c.status().message());
  REQUIRE(c.ok());
  return *c;
}

PlanResult PlanOn(const Config& c) { return MakePlan(c, InventoryFromCluster(c.cluster)); }

Plan MustPlan(const Config& c) {
  PlanResult r = PlanOn(c);
  if (!r.feasible()) FAIL(r.infeasible().reason);
  return r.plan();
}

const AgentPlan& Agent(const Plan& p, const std::string& name) {
  const AgentPlan* a = p.FindAgent(name);
  REQUIRE(a != nullptr);
  return *a;
}

const char* kTwoDomainNode = "{name: n1, gpus: 8, nvlink_domains: [[0,1,2,3],[4,5,6,7]]}";

TEST_CASE("planner keeps an agent inside one NVLink domain") {
  Plan p = MustPlan(Load(fmt::format(R"(cluster: {{nodes: [{}]}}
agents:
  - {{name: small, gpus: 2}}
  - {{name: big, gpus: 4}}
  - {{name: other, gpus: 2}}
)",
                                     kTwoDomainNode)));
  // Largest first: big takes a whole domain, the two 2-GPU agents share the other.
  CHECK(Agent(p, "big").placement[0].gpus == Ints{0, 1, 2, 3});
  CHECK(Agent(p, "small").placement[0].gpus == Ints{4, 5});
  CHECK(Agent(p, "other").placement[0].gpus == Ints{6, 7});
  CHECK(Agent(p, "big").placement[0].ranks == Ints{0, 1, 2, 3});
  CHECK(Agent(p, "big").backend == GroupBackend::kNccl);
}

TEST_CASE("planner best-fits so a big agent is not starved by fragmentation") {
  // First fit would put the 2-GPU agent on n1 and break its 4-GPU domain.
  Plan p = MustPlan(Load(R"(cluster:
  nodes:
    - {name: n1, gpus: 4}
    - {name: n2, gpus: 2}
agents:
  - {name: two, gpus: 2}
  - {name: four, gpus: 4}
)"));
  CHECK(Agent(p, "two").placement[0].node == "n2");
  CHECK(Agent(p, "four").placement[0].node == "n1");
}

TEST_CASE("planner spans NVLink domains only when no domain can hold the agent") {
  Plan p = MustPlan(Load(fmt::format(R"(cluster: {{nodes: [{}]}}
agents:
  - {{name: a, gpus: 3}}
  - {{name: b, gpus: 3}}
  - {{name: c, gpus: 2}}
)",
                                     kTwoDomainNode)));
  CHECK(Agent(p, "a").placement[0].gpus == Ints{0, 1, 2});
  CHECK(Agent(p, "b").placement[0].gpus == Ints{4, 5, 6});
  CHECK(Agent(p, "c").placement[0].gpus == Ints{3, 7});
  // An 8-GPU agent on a node of two 4-GPU domains gets the whole node.
  Plan whole = MustPlan(Load(
      fmt::format("cluster: {{nodes: [{}]}}\nagents: [{{name: w, gpus: 8}}]\n", kTwoDomainNode)));
  CHECK(Agent(whole, "w").placement[0].gpus == Ints{0, 1, 2, 3, 4, 5, 6, 7});
}

TEST_CASE("an agent needing more than a node gets whole nodes") {
  Plan p = MustPlan(Load(R"(cluster:
  nodes: [{name: "g[1-4]", gpus: 8, nvlink_domains: [[0,1,2,3],[4,5,6,7]]}]
agents:
  - {name: small, gpus: 1}
  - {name: huge, gpus: 16, ranks: 32, backend: mpi}
)"));
  const AgentPlan& huge = Agent(p, "huge");
  REQUIRE(huge.placement.size() == 2);
  CHECK(huge.placement[0].node == "g1");
  CHECK(huge.placement[1].node == "g2");
  CHECK(huge.placement[0].gpus == Ints{0, 1, 2, 3, 4, 5, 6, 7});
  CHECK(huge.placement[0].ranks.size() == 16);  // two ranks per GPU
  CHECK(huge.placement[1].ranks.front() == 16);
  CHECK(huge.placement[1].ranks.back() == 31);
  CHECK(huge.master_addr == "g1");
  // The small agent stays off the whole nodes.
  CHECK(Agent(p, "small").placement[0].node == "g3");
  // 16 of 16 GPUs used: no idle-GPU warning (only that agent-worker trains on the CPU).
  for (const std::string& w : p.warnings) CHECK_THAT(w, Catch::Contains("runs agent-worker"));
  // A 9-GPU agent on 8-GPU nodes holds two whole nodes: plan says so.
  Plan idle = MustPlan(Load(R"(cluster: {nodes: [{name: "g[1-2]", gpus: 8}]}
agents: [{name: nine, gpus: 9, command: [/bin/true]}]
)"));
  REQUIRE(idle.warnings.size() == 1);
  CHECK(
      idle.warnings[0] ==
      "agent nine needs 9 GPUs and holds 2 whole nodes with 16: 7 GPUs stay idle (an agent larger "
      "than a node gets whole nodes); give it 16 GPUs to use them all");
  // Not enough whole nodes.
  PlanResult r = PlanOn(Load(R"(cluster: {nodes: [{name: "g[1-2]", gpus: 8}]}
agents:
  - {name: one, gpus: 1, nodes: [g2]}
  - {name: huge, gpus: 16}
)"));
  REQUIRE_FALSE(r.feasible());
  CHECK(r.infeasible().agent == "huge");
  CHECK(r.infeasible().reason ==
        "huge needs 16 GPUs on whole nodes; only 1 whole free node(s) with 8 GPUs in all are left");
}

TEST_CASE("infeasible plans name the agent and what is short") {
  PlanResult r = PlanOn(Load(R"(cluster:
  nodes:
    - {name: node01, gpus: 4, nvlink_domains: [[0,1],[2,3]]}
    - {name: node02, gpus: 4, nvlink_domains: [[0,1,2,3]]}
agents:
  - {name: predator, replicas: 4, gpus: 2}
  - {name: late, gpus: 2, nodes: [node02]}
)"));
  REQUIRE_FALSE(r.feasible());
  CHECK(r.infeasible().agent == "predator-3");
  CHECK(r.infeasible().reason == "predator-3 needs 2 GPUs; 0 free in total");
  PlanResult frag = PlanOn(Load(R"(cluster:
  nodes:
    - {name: node01, gpus: 8, nvlink_domains: [[0,1,2,3],[4,5,6,7]]}
    - {name: node02, gpus: 4, nvlink_domains: [[0,1],[2,3]]}
agents:
  - {name: p, replicas: 2, gpus: 3, nodes: [node01]}
  - {name: q, gpus: 2, nodes: [node02]}
  - {name: predator-3, gpus: 4}
)"));
  REQUIRE_FALSE(frag.feasible());
  CHECK(frag.infeasible().reason ==
        "predator-3 needs 4 GPUs on one node; the most free on one node is 2 on node01 (4 free in "
        "total, spread over 2 nodes)");
  Result<Plan> as_result = std::move(frag).ToResult();
  CHECK(as_result.status().code() == StatusCode::kResourceExhausted);
  PlanResult no_gpus =
      MakePlan(Load("agents: [{name: learner, gpus: 2}]\n"), LocalInventory({"laptop", 2, 0, {}}));
  REQUIRE_FALSE(no_gpus.feasible());
  CHECK(no_gpus.infeasible().reason ==
        "learner needs 2 GPUs, but no node of the inventory (local machine) has a GPU");
}

TEST_CASE("pinned agents are placed on their nodes or fail clearly") {
  Plan p = MustPlan(Load(R"(cluster:
  nodes: [{name: "n[1-3]", gpus: 4}]
agents:
  - {name: free, gpus: 4}
  - {name: pinned, gpus: 2, nodes: "n[2-3]"}
  - {name: pinned3, gpus: 4, nodes: [n3]}
)"));
  CHECK(Agent(p, "pinned3").placement[0].node == "n3");
  CHECK(Agent(p, "pinned").placement[0].node == "n2");
  CHECK(Agent(p, "free").placement[0].node == "n1");

  PlanResult missing = PlanOn(
      Load("cluster: {nodes: [{name: n1, gpus: 4}]}\nagents: [{name: a, gpus: 1, nodes: [n9]}]\n"));
  REQUIRE_FALSE(missing.feasible());
  CHECK_THAT(missing.infeasible().reason,
             Contains("a is pinned to node 'n9', which is not in the inventory"));
  PlanResult small =
      PlanOn(Load("cluster: {nodes: [{name: n1, gpus: 4}, {name: n2, gpus: 2}]}\nagents: [{name: "
                  "a, gpus: 4, nodes: [n2]}]\n"));
  REQUIRE_FALSE(small.feasible());
  CHECK(small.infeasible().reason ==
        "a needs 4 GPUs on whole nodes; only 1 whole free node(s) with 2 GPUs in all are left on "
        "n2");
  // The true shortage of a machine with GPUs left, but not enough: said in total, not per domain.
  PlanResult short_total = PlanOn(Load(R"(cluster:
  nodes: [{name: "node0[1-3]", gpus: 10}]
agents:
  - {name: first, gpus: 6, nodes: [node03]}
  - {name: second, gpus: 6, nodes: [node03]}
)"));
  REQUIRE_FALSE(short_total.feasible());
  CHECK(short_total.infeasible().reason == "second needs 6 GPUs; 4 free in total on node03");
  PlanResult spread = PlanOn(Load(R"(cluster: {nodes: [{name: "n[1-2]", gpus: 4}]}
agents:
  - {name: a, gpus: 3, nodes: [n1]}
  - {name: b, gpus: 3, nodes: [n2]}
  - {name: c, gpus: 2, nodes: [n1, n2]}
)"));
  REQUIRE_FALSE(spread.feasible());
  CHECK(spread.infeasible().reason ==
        "c needs 2 GPUs on one node; the most free on one node is 1 on n1 (2 free in total, spread "
        "over 2 nodes) on its pinned nodes n1, n2");
}

TEST_CASE(
    "CPU agents get ports and CPU slots but no GPUs; CPU counts are enforced on a described "
    "cluster") {
  Config c = Load(R"(cluster:
  nodes:
    - {name: gpu1, gpus: 2, cpus: 4}
    - {name: cpu1, cpus: 3}
agents:
  - {name: learner, gpus: 2}
  - {name: actor, ranks: 3}
  - {name: helper, ranks: 2}
)");
  Plan p = MustPlan(c);
  const AgentPlan& actor = Agent(p, "actor");
  CHECK(actor.placement[0].gpus.empty());
  CHECK(actor.placement[0].ranks == Ints{0, 1, 2});
  CHECK(actor.placement[0].node == "cpu1");               // best fit: exactly 3 free
  CHECK(Agent(p, "helper").placement[0].node == "gpu1");  // 2 CPUs left there
  CHECK(actor.backend == GroupBackend::kMpi);
  // No oversubscription: the one warning is that agent-worker trains on the CPU.
  REQUIRE(p.warnings.size() == 1);
  CHECK_THAT(p.warnings[0],
             Catch::Contains("agent learner asks for 2 GPU(s) but runs agent-worker"));

  PlanResult r =
      PlanOn(Load("cluster: {nodes: [{name: c1, cpus: 2}]}\nagents: [{name: wide, ranks: 3}]\n"));
  REQUIRE_FALSE(r.feasible());
  CHECK(r.infeasible().reason == "wide needs 3 CPU slots on one node; the most free is 2 on c1");
}

TEST_CASE("the local machine allows CPU oversubscription with a warning") {
  const char* source_dir = std::getenv("AGENTRT_SOURCE_DIR");  // set by ctest
  REQUIRE(source_dir != nullptr);
  Result<Config> demo = LoadConfigFile(std::string(source_dir) + "/configs/demo.yaml");
  REQUIRE(demo.ok());
  PlanResult r = MakePlan(*demo, LocalInventory({"laptop", 2, 0, {}}));
  REQUIRE(r.feasible());
  REQUIRE(r.plan().warnings.size() == 1);
  CHECK(r.plan().warnings[0] ==
        "node laptop: 5 ranks on 2 CPUs (oversubscribed: fine for a demo, slow for training)");
  CHECK(r.plan().bus.host == "laptop");
}

TEST_CASE("ports: each agent its own block, the bus outside every block") {
  Config c = Load(R"(cluster:
  nodes: [{name: "n[1-2]", gpus: 2}]
  ports: {first: 21000, last: 21063, per_agent: 16}
agents: [{name: a, replicas: 3, gpus: 1}]
)");
  Plan p = MustPlan(c);
  CHECK(p.bus.host == "n1");
  CHECK(p.bus.port == 21000);
  std::set<std::pair<std::string, int>> firsts;
  for (const AgentPlan& a : p.agents) {
    CHECK(a.ports.last - a.ports.first + 1 == 16);
    CHECK(a.master_port == a.ports.first);
    CHECK(firsts.insert({a.ports.node, a.ports.first}).second);
    if (a.ports.node == "n1") CHECK(a.ports.first > p.bus.port);
  }
  // A fixed bus port inside the range takes that block.
  c.bus.port = 21020;
  Plan fixed = MustPlan(c);
  for (const AgentPlan& a : fixed.agents) {
    if (a.ports.node == "n1")
      CHECK((fixed.bus.port < a.ports.first || fixed.bus.port > a.ports.last));
  }
  // Too many agents for the blocks on the only node.
  PlanResult r = PlanOn(Load(R"(cluster:
  nodes: [{name: n1}]
  ports: {first: 21000, last: 21047, per_agent: 16}
agents: [{name: a, replicas: 3}]
)"));
  REQUIRE_FALSE(r.feasible());
  CHECK_THAT(r.infeasible().reason,
             Contains("a-2 needs a port block; ports 21000-21047 hold 3 blocks of 16"));
}

TEST_CASE("the plan is deterministic and its checkpoint dirs are relative to the run directory") {
  Config c = Load(R"(run: {name: pp, dir: /tmp/runs}
cluster: {nodes: [{name: "n[1-3]", gpus: 8, nvlink_domains: [[0,1,2,3],[4,5,6,7]]}]}
agents:
  - {name: a, replicas: 5, gpus: 3}
  - {name: b, replicas: 4, gpus: 1}
  - {name: c, replicas: 2, ranks: 2}
)");
  Plan p1 = MustPlan(c);
  Plan p2 = MustPlan(c);
  CHECK(PlanToJsonString(p1) == PlanToJsonString(p2));
  CHECK(p1.agents[0].checkpoint_dir == "checkpoints/a-0");
  PlanOptions options;
  options.run_dir = "/tmp/runs/pp-20260101T000000Z";
  PlanResult r = MakePlan(c, InventoryFromCluster(c.cluster), options);
  REQUIRE(r.feasible());
  CHECK(r.plan().run_dir == options.run_dir);
  CHECK(PlanToJsonString(r.plan()).find("checkpoints/a-0") != std::string::npos);
  CHECK(RunDir(r.plan().run_dir).Resolve(r.plan().agents[0].checkpoint_dir) ==
        "/tmp/runs/pp-20260101T000000Z/checkpoints/a-0");
}

TEST_CASE("an empty inventory is infeasible") {
  Config c = Load("agents: [{name: a}]\n");
  Inventory none;
  none.source = "slurm partition gpu";
  PlanResult r = MakePlan(c, none);
  REQUIRE_FALSE(r.feasible());
  CHECK(r.infeasible().reason == "the inventory (slurm partition gpu) has no usable nodes");
}

}  // namespace
}  // namespace agentrt

namespace agentrt {
namespace {

using TempLeaseDir = testing::TempDir;

const auto kEverywhere = [](const AgentPlan&) { return true; };

TEST_CASE("a second run on the machine gets other port blocks and another bus port") {
  TempLeaseDir dir;
  const Config c = Load(R"(cluster:
  nodes: [{name: n1, cpus: 8}]
  ports: {first: 23000, last: 23127, per_agent: 16}
agents: [{name: a, replicas: 3}]
)");
  Plan first = MustPlan(c);
  Plan second = MustPlan(c);
  REQUIRE(PlanToJsonString(first) == PlanToJsonString(second));  // the same plan twice...
  auto l1 = PortLeases::Open("run-1", dir.path);
  auto l2 = PortLeases::Open("run-2", dir.path);
  REQUIRE(LeaseRunPorts(first, first.ports, kEverywhere, **l1).ok());
  REQUIRE(LeaseRunPorts(second, second.ports, kEverywhere, **l2).ok());
  // ... but no port in common once both are leased.
  std::set<int> used;
  for (const Plan* p : {&first, &second}) {
    CHECK(used.insert(p->bus.port).second);
    for (const AgentPlan& a : p->agents) {
      for (int port = a.ports.first; port <= a.ports.last; ++port) CHECK(used.insert(port).second);
      CHECK(a.master_port == a.ports.first);
      CHECK(a.ports.last - a.ports.first == 15);
    }
  }
  // A third does not fit in 128 ports: it is told which agent and which range.
  Plan third = MustPlan(c);
  auto l3 = PortLeases::Open("run-3", dir.path);
  const Status full = LeaseRunPorts(third, third.ports, kEverywhere, **l3);
  REQUIRE_FALSE(full.ok());
  CHECK(full.code() == StatusCode::kResourceExhausted);
  CHECK_THAT(full.message(),
             Contains("agent a-") && Contains("23000-23127") && Contains("widen cluster.ports"));
}

TEST_CASE("a fixed bus port that another run holds is an error, never a silent co-bind") {
  TempLeaseDir dir;
  const Config c = Load(R"(cluster:
  nodes: [{name: n1, cpus: 8}]
  ports: {first: 23200, last: 23299, per_agent: 16}
bus: {port: 23250}
agents: [{name: a}]
)");
  Plan first = MustPlan(c);
  Plan second = MustPlan(c);
  CHECK(first.bus.fixed_port);
  auto l1 = PortLeases::Open("/runs/one", dir.path);
  auto l2 = PortLeases::Open("/runs/two", dir.path);
  REQUIRE(LeaseRunPorts(first, first.ports, kEverywhere, **l1).ok());
  CHECK(first.bus.port == 23250);
  const Status s = LeaseRunPorts(second, second.ports, kEverywhere, **l2);
  REQUIRE_FALSE(s.ok());
  CHECK(s.code() == StatusCode::kAlreadyExists);
  CHECK_THAT(s.message(), Contains("bus.port 23250 is not free") && Contains("/runs/one"));
}

TEST_CASE(
    "gpu_type places an agent only on nodes of that type; an absent type names those present") {
  Config c = Load(R"(cluster:
  nodes:
    - {name: "h[1-2]", gpus: 4, gpu_type: h100}
    - {name: b1, gpus: 4, gpu_type: b200}
agents:
  - {name: fast, gpus: 2, gpu_type: b200}
  - {name: any, gpus: 4}
)");
  Plan p = MustPlan(c);
  CHECK(Agent(p, "fast").placement[0].node == "b1");
  CHECK(Agent(p, "fast").gpu_type == "b200");
  CHECK(Agent(p, "any").gpu_type.empty());
  Config bad = Load(R"(cluster:
  nodes: [{name: "h[1-2]", gpus: 4, gpu_type: h100}, {name: b1, gpus: 4, gpu_type: b200}]
agents: [{name: wish, gpus: 1, gpu_type: a100}]
)");
  PlanResult r = PlanOn(bad);
  REQUIRE_FALSE(r.feasible());
  CHECK(r.infeasible().agent == "wish");
  CHECK_THAT(r.infeasible().reason,
             Catch::Contains("wish asks for gpu_type 'a100', which no node has; GPU types present: "
                             "b200 (1 node), h100 (2 nodes)"));
  Result<Config> cpu = LoadConfigString("agents: [{name: c, gpus: 0, gpu_type: h100}]\n", "t.yaml");
  REQUIRE_FALSE(cpu.ok());
  CHECK_THAT(cpu.status().message(), Catch::Contains("t.yaml:1:"));
  CHECK_THAT(cpu.status().message(), Catch::Contains("cannot ask for GPUs of type 'h100'"));
}

TEST_CASE("a multi-node agent's MASTER_ADDR is its first node's address, as SLURM gives it") {
  Config c = Load(R"(cluster: {nodes: [{name: "n[1-2]", gpus: 2}]}
agents: [{name: wide, gpus: 4, ranks: 4}]
)");
  c.cluster.nodes[0].addr = "10.211.7.11";  // from `scontrol show node -o` NodeAddr=
  c.cluster.nodes[1].addr = "10.211.7.12";
  Plan p = MustPlan(c);
  CHECK(Agent(p, "wide").placement.size() == 2);
  CHECK(Agent(p, "wide").master_addr == "10.211.7.11");
  Plan named =
      MustPlan(Load("cluster: {nodes: [{name: a1, gpus: 2}]}\nagents: [{name: x, gpus: 1}]\n"));
  CHECK(Agent(named, "x").master_addr == "a1");  // no address known: by name
}

}  // namespace
}  // namespace agentrt

namespace agentrt {
namespace {

TEST_CASE("planner gives a 1-GPU agent the nccl backend and carries the GPU warnings") {
  Plan p = MustPlan(Load(R"(cluster: {nodes: [{name: g1, gpus: 2, cpus: 8}]}
slurm: {trust_slurm_binding: true}
agents:
  - {name: torch, gpus: 1, command: [/bin/true]}
  - {name: cpp, gpus: 1}
  - {name: wide-mpi, gpus: 0, ranks: 2}
)"));
  CHECK(Agent(p, "torch").backend == GroupBackend::kNccl);
  CHECK(Agent(p, "wide-mpi").backend == GroupBackend::kMpi);
  bool warned = false;
  for (const std::string& w : p.warnings) warned |= w.find("agent cpp asks for 1 GPU(s)") == 0;
  CHECK(warned);
  CHECK(p.trust_slurm_binding);
  Result<Plan> back = PlanFromJsonString(PlanToJsonString(p));
  REQUIRE(back.ok());
  CHECK(back->trust_slurm_binding);
}

}  // namespace
}  // namespace agentrt
