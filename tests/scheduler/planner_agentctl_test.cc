// `agentctl validate` and `agentctl plan` as a user runs them: the real binary,
// real files, exit codes and output.
#include <sys/wait.h>

#include <catch2/catch.hpp>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "plan/plan.h"
#include "tests/common/programs.h"
#include "tests/common/temp_dir.h"

namespace agentrt {
namespace {

using Catch::Matchers::Contains;
using Catch::Matchers::StartsWith;

struct Output {
  int exit_code = -1;
  std::string out, err;
};

std::string Slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

std::string Env(const char* name) {
  const char* v = std::getenv(name);  // set by ctest (agentrt_test)
  REQUIRE(v != nullptr);
  return v;
}

// Runs `agentctl <args>` (args are trusted test strings) with a 60 s bound.
Output Agentctl(const testing::TempDir& dir, const std::string& args) {
  const std::string out = dir.Path("stdout"), err = dir.Path("stderr");
  const std::string cmd =
      "timeout 60 " + testing::ProgramPath("agentctl") + " " + args + " >" + out + " 2>" + err;
  int status = std::system(cmd.c_str());
  Output o;
  o.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  o.out = Slurp(out);
  o.err = Slurp(err);
  return o;
}

TEST_CASE("agentctl validate accepts the shipped configs") {
  testing::TempDir dir;
  Output o = Agentctl(dir, "validate " + Env("AGENTRT_SOURCE_DIR") + "/configs/demo.yaml");
  CHECK(o.exit_code == 0);
  CHECK_THAT(o.out, StartsWith("ok: 3 agents (5 ranks, 0 GPUs), 4 channels"));
  CHECK(o.err.empty());
  o = Agentctl(dir, "validate " + Env("AGENTRT_SOURCE_DIR") + "/configs/cartpole.yaml");
  CHECK(o.exit_code == 0);
  CHECK_THAT(o.out, StartsWith("ok: 1 agents"));
}

TEST_CASE("agentctl validate prints one line naming file:line:column and exits 1") {
  testing::TempDir dir;
  const std::string bad = dir.Write("bad.yaml", "agents:\n  - name: a\n    gpu: 2\n");
  Output o = Agentctl(dir, "validate " + bad);
  CHECK(o.exit_code == 1);
  CHECK(o.out.empty());
  CHECK(o.err ==
        "agentctl validate: " + bad +
            ":3:5: key 'agents[0].gpu': unknown key; expected one of name, replicas, "
            "gpus, ranks, command, env, args, restart, workdir, checkpoint, group, nodes, backend, "
            "gpu_type; "
            "did "
            "you mean 'gpus'?\n");
  o = Agentctl(dir, "validate " + dir.Path("missing.yaml"));
  CHECK(o.exit_code == 1);
  CHECK_THAT(o.err, Contains("cannot read config"));
  o = Agentctl(dir, "validate --settings");
  CHECK(o.exit_code == 0);
  CHECK_THAT(o.out, Contains("bus.max_message_bytes"));
  o = Agentctl(dir, "validate " + bad + " --set 'agents=[{name: x}]'");  // the override fixes it
  CHECK(o.exit_code == 0);
}

TEST_CASE("agentctl validate checks agent-worker's args with agent-worker's own declarations") {
  testing::TempDir dir;
  const std::string typo = dir.Write(
      "typo.yaml", "agents:\n  - name: a\n    args:\n      env: cartpole\n      lrr: 0.1\n");
  Output o = Agentctl(dir, "validate " + typo);
  CHECK(o.exit_code == 1);
  CHECK_THAT(o.err, Contains(typo + ":5:7: key 'agents[0].args.lrr'"));
  CHECK_THAT(o.err, Contains("lr"));  // the suggestion
  const std::string type = dir.Write(
      "type.yaml",
      "agents:\n  - name: a\n    command: [agent-worker]\n    args: {env: cartpole, steps: "
      "many}\n");
  o = Agentctl(dir, "validate " + type);
  CHECK(o.exit_code == 1);
  CHECK_THAT(o.err, Contains(type + ":4:27: key 'agents[0].args.steps'"));
  // Another program's args are not agent-worker's business.
  const std::string other = dir.Write(
      "other.yaml", "agents:\n  - name: a\n    command: [/bin/true]\n    args: {lrr: 0.1}\n");
  o = Agentctl(dir, "validate " + other);
  CHECK(o.exit_code == 0);
}

TEST_CASE("agentctl plan prints a table, or the plan JSON with --json") {
  testing::TempDir dir;
  const std::string config = dir.Write("agents.yaml", R"(run: {name: pp, dir: runs}
cluster:
  nodes: [{name: "node[01-02]", gpus: 8, cpus: 64, nvlink_domains: [[0,1,2,3],[4,5,6,7]]}]
agents:
  - {name: predator, replicas: 2, gpus: 2}
  - {name: prey, ranks: 2}
)");
  Output table = Agentctl(dir, "plan " + config);
  CHECK(table.exit_code == 0);
  CHECK_THAT(table.out, Contains("AGENT"));
  CHECK_THAT(table.out, Contains("predator-1"));
  CHECK_THAT(table.out, Contains("checkpoints/prey"));
  Output json = Agentctl(dir, "plan " + config + " --json");
  REQUIRE(json.exit_code == 0);
  Result<Plan> plan = PlanFromJsonString(json.out);
  REQUIRE(plan.ok());
  CHECK(plan->agents.size() == 3);
  CHECK(plan->bus.host == "node01");
  CHECK(plan->agents[0].placement[0].gpus == std::vector<int>{0, 1});
  // --cluster replaces the config's nodes.
  const std::string inv =
      dir.Write("inv.yaml", "cluster:\n  nodes: [{name: big1, gpus: 4, cpus: 8}]\n");
  Output other = Agentctl(dir, "plan " + config + " --cluster " + inv + " --json");
  REQUIRE(other.exit_code == 0);
  CHECK(PlanFromJsonString(other.out)->bus.host == "big1");
  // --scontrol plans on SLURM's usable nodes of slurm.partition.
  const std::string scontrol = dir.Write(
      "nodes.txt",
      "NodeName=sg1 CPUAlloc=0 CPUTot=64 Gres=gpu:h100:8(S:0-1) State=IDLE Partitions=gpu\n"
      "NodeName=sg2 CPUAlloc=0 CPUTot=64 Gres=gpu:8 State=DOWN* Partitions=gpu\n"
      "NodeName=sg3 CPUAlloc=0 CPUTot=64 Gres=gpu:8 State=MIXED Partitions=gpu\n"
      "NodeName=sc1 CPUAlloc=0 CPUTot=64 Gres=(null) State=IDLE Partitions=cpu\n");
  Output slurm =
      Agentctl(dir, "plan " + config + " --scontrol " + scontrol + " --set slurm.partition=gpu");
  REQUIRE(slurm.exit_code == 0);
  CHECK_THAT(slurm.out, Contains("inventory: slurm partition gpu (2 nodes)"));
  CHECK_THAT(slurm.out, Contains("sg1"));
  CHECK_THAT(slurm.out, !Contains("sg2"));
  Output with_dir = Agentctl(dir, "plan " + config + " --json --run-dir /tmp/r1");
  CHECK(PlanFromJsonString(with_dir.out)->run_dir == "/tmp/r1");
  CHECK(PlanFromJsonString(with_dir.out)->agents[0].checkpoint_dir == "checkpoints/predator-0");
  Output table_in_dir = Agentctl(dir, "plan " + config + " --run-dir /tmp/r1");
  CHECK_THAT(table_in_dir.out, Contains("/tmp/r1/checkpoints/prey"));
}

TEST_CASE("agentctl plan exits 2 and names the agent when the plan is infeasible") {
  testing::TempDir dir;
  const std::string config = dir.Write("agents.yaml", R"(cluster:
  nodes:
    - {name: node01, gpus: 4, nvlink_domains: [[0,1],[2,3]]}
    - {name: node02, gpus: 2}
agents: [{name: predator, replicas: 4, gpus: 2}]
)");
  Output o = Agentctl(dir, "plan " + config);
  CHECK(o.exit_code == 2);
  CHECK(o.out.empty());
  CHECK_THAT(o.err, Contains("predator-3 needs 2 GPUs; 0 free in total"));
}

TEST_CASE("agentctl plan on this machine plans the demo, warning about oversubscription") {
  testing::TempDir dir;
  Output o = Agentctl(dir, "plan " + Env("AGENTRT_SOURCE_DIR") + "/configs/demo.yaml --json");
  REQUIRE(o.exit_code == 0);
  Result<Plan> plan = PlanFromJsonString(o.out);
  REQUIRE(plan.ok());
  CHECK(plan->agents.size() == 3);
  CHECK(plan->channels.size() == 4);
}

}  // namespace
}  // namespace agentrt
