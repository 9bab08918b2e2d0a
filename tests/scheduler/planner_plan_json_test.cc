// The plan's JSON contract: shape, round trip, and clear errors.
#include <catch2/catch.hpp>
#include <string>

#include "scheduler/loader.h"
#include "scheduler/planner.h"
#include "tests/common/temp_dir.h"

namespace agentrt {
namespace {

using Catch::Matchers::Contains;

Plan DemoPlan() {
  // The bus's TLS files must exist; they are taken from the config's folder.
  static const testing::TempDir tls("agentrt-plan-tls");
  tls.Write("bus.pem", "certificate");
  tls.Write("bus.key", "key");
  LoadOptions options;
  options.base_dir = tls.path;
  Result<Config> c = LoadConfigString(R"(run: {name: predator-prey, dir: runs}
cluster:
  nodes: [{name: "node[01-03]", gpus: 8, cpus: 64, nvlink_domains: [[0,1,2,3],[4,5,6,7]]}]
bus: {tls: true, cert_file: bus.pem, key_file: bus.key}
agents:
  - name: predator
    replicas: 2
    gpus: 2
    env: {PYTHONUNBUFFERED: "1"}
    args: {env: predator_prey, lr: 0.0003, nested: {a: [1, 2]}}
  - {name: prey, ranks: 2, restart: {max_restarts: 0}, checkpoint: {interval_s: 5}}
  - {name: huge, gpus: 16}
channels:
  - {topic: sightings, publishers: ["predator-*"], subscribers: ["*"]}
)",
                                      "<string>", options);
  REQUIRE(c.ok());
  CHECK(c->bus.cert_file == tls.Path("bus.pem"));
  PlanResult r = MakePlan(*c, InventoryFromCluster(c->cluster));
  REQUIRE(r.feasible());
  return r.plan();
}

TEST_CASE("plan JSON has its documented shape with additive keys") {
  nlohmann::json j = nlohmann::json::parse(PlanToJsonString(DemoPlan()));
  CHECK(j["run"] == "predator-prey");
  CHECK(j["bus"]["host"] == "node01");
  CHECK(j["bus"]["port"] == 20000);
  CHECK(j["bus"]["tls"] == "on");  // a certificate of one's own: on
  CHECK(j["bus"]["run_ca"] == false);
  const nlohmann::json& a = j["agents"][0];
  CHECK(a["name"] == "predator-0");
  CHECK(a["index"] == 0);
  CHECK(a["ranks"] == 2);
  CHECK(a["placement"][0]["gpus"] == nlohmann::json::array({0, 1}));
  CHECK(a["placement"][0]["ranks"] == nlohmann::json::array({0, 1}));
  CHECK(a["ports"]["first"].is_number_integer());
  CHECK(a["master_addr"] == a["ports"]["node"]);
  CHECK(a["master_port"] == a["ports"]["first"]);
  CHECK(a["checkpoint_dir"] == "checkpoints/predator-0");
  CHECK(a["gpus"] == 2);
  CHECK(a["backend"] == "nccl");
  CHECK(a["command"] == nlohmann::json::array({"agent-worker"}));
  CHECK(a["env"]["PYTHONUNBUFFERED"] == "1");
  CHECK(a["args"]["nested"]["a"][1] == 2);
  CHECK(a["restart"]["heartbeat_timeout_s"] == 60.0);
  CHECK(j["agents"][2]["backend"] == "mpi");
  CHECK(j["agents"][2]["restart"]["max_restarts"] == 0);
  CHECK(j["agents"][3]["placement"].size() == 2);
  CHECK(j["channels"][0]["topic"] == "sightings");
  CHECK(j["channels"][0]["publishers"] == nlohmann::json::array({"predator-0", "predator-1"}));
  CHECK_FALSE(j.contains("run_dir"));
  // Keys come in the documented order.
  auto ordered = nlohmann::ordered_json::parse(PlanToJsonString(DemoPlan()));
  CHECK(ordered["agents"][0].begin().key() == "name");
  CHECK(ordered.begin().key() == "run");
}

TEST_CASE("a plan survives a JSON round trip, through a file too") {
  Plan plan = DemoPlan();
  plan.run_dir = "runs/predator-prey-20260101T000000Z";
  plan.warnings = {"something to know"};
  const std::string text = PlanToJsonString(plan);
  Result<Plan> back = PlanFromJsonString(text);
  REQUIRE(back.ok());
  CHECK(PlanToJsonString(*back) == text);
  CHECK(back->agents[2].checkpoint.interval_s == 5.0);
  CHECK(back->agents[3].PlacementOfRank(15)->node == "node02");
  CHECK(back->agents[3].PlacementOfRank(16) == nullptr);
  CHECK(back->bus.settings.port == back->bus.port);
  // A plan.json from before bus.tls was on/off/auto held a boolean: read as on or off.
  nlohmann::json legacy = nlohmann::json::parse(text);
  legacy["bus"]["tls"] = true;
  Result<Plan> old = PlanFromJsonString(legacy.dump());
  REQUIRE(old.ok());
  CHECK(old->bus.settings.tls == "on");
  legacy["bus"]["tls"] = false;
  CHECK(PlanFromJsonString(legacy.dump())->bus.settings.tls == "off");
  // The nodes with agents on them, with their NVLink domains (the dashboard's map).
  REQUIRE_FALSE(back->nodes.empty());
  CHECK(back->nodes[0].nvlink_domains.size() >= 1);

  testing::TempDir dir;
  const std::string path = dir.Path("plan.json");
  REQUIRE(WritePlanFile(plan, path).ok());
  Result<Plan> read = ReadPlanFile(path);
  REQUIRE(read.ok());
  CHECK(PlanToJsonString(*read) == text);
  CHECK_THAT(ReadPlanFile(dir.Path("none.json")).status().message(),
             Contains("cannot read the plan") && Contains("no such file"));
  CHECK_THAT(WritePlanFile(plan, dir.Path("no/such/dir/plan.json")).message(),
             Contains("no/such/dir"));
}

TEST_CASE("the bare example without additive keys reads, with them derived") {
  Result<Plan> p = PlanFromJsonString(R"({"run": "predator-prey",
 "bus": {"host": "node01", "port": 20000},
 "agents": [
   {"name": "predator-0", "index": 0, "ranks": 2,
    "placement": [{"node": "node01", "gpus": [0, 1], "ranks": [0, 1]}],
    "ports": {"node": "node01", "first": 20016, "last": 20031},
    "master_addr": "node01", "master_port": 20016,
    "checkpoint_dir": "runs/predator-prey/checkpoints/predator-0"}]})");
  REQUIRE(p.ok());
  CHECK(p->agents[0].gpus == 2);
  CHECK(p->agents[0].backend == GroupBackend::kNccl);
  CHECK(p->agents[0].command == std::vector<std::string>{"agent-worker"});
  CHECK(p->bus.settings.max_message_bytes == 4194304);
}

TEST_CASE("a malformed plan names the JSON path") {
  CHECK_THAT(PlanFromJsonString("{").status().message(), Contains("not valid JSON"));
  CHECK_THAT(PlanFromJsonString("{}").status().message(), Contains("plan: run: missing"));
  CHECK_THAT(PlanFromJsonString(R"({"run": "r", "bus": {"host": "h", "port": "x"}, "agents": []})")
                 .status()
                 .message(),
             Contains("plan: bus.port: expected an integer"));
  CHECK_THAT(PlanFromJsonString(
                 R"({"run": "r", "bus": {"host": "h", "port": 1}, "agents": [{"name": "a"}]})")
                 .status()
                 .message(),
             Contains("plan: agents[0].index: missing"));
  CHECK_THAT(
      PlanFromJsonString(
          R"({"run": "r", "bus": {"host": "h", "port": 1}, "agents": [{"name": "a", "index": 0,
    "ranks": 1, "placement": [{"node": "n", "gpus": [], "ranks": [0]}], "ports": {"node": "n", "first": 1, "last": 2},
    "master_addr": "n", "master_port": 1, "checkpoint_dir": "c", "backend": "gloo"}]})")
          .status()
          .message(),
      Contains("agents[0].backend: expected single, mpi or nccl"));
}

TEST_CASE("the plan table lists agent, nodes, GPUs, ranks, ports and checkpoint dir") {
  std::string t = PlanToTable(DemoPlan());
  CHECK_THAT(t, Contains("AGENT"));
  CHECK_THAT(t, Contains("CHECKPOINT DIR"));
  CHECK_THAT(t, Contains("bus on node01:20000"));
  CHECK_THAT(t, Contains("huge"));
  CHECK_THAT(t, Contains("node01 node02"));
  CHECK_THAT(t, Contains("0-7 0-7"));
  CHECK_THAT(t, Contains("checkpoints/prey"));
}

}  // namespace
}  // namespace agentrt
