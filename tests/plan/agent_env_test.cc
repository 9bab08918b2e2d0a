// The agent process contract: one type fills it, one parses it.
#include "plan/agent_env.h"

#include <catch2/catch.hpp>
#include <map>
#include <string>

namespace agentrt {
namespace {

using Env = std::map<std::string, std::string>;

EnvLookup Lookup(const Env& env) {
  return [env](const std::string& name) -> std::optional<std::string> {
    auto it = env.find(name);
    if (it == env.end()) return std::nullopt;
    return it->second;
  };
}

Env FullEnv() {
  return {{"AGENTRT_RUN_DIR", "/runs/demo-1"},
          {"AGENTRT_AGENT", "predator-1"},
          {"AGENTRT_AGENT_INDEX", "3"},
          {"RANK", "1"},
          {"WORLD_SIZE", "2"},
          {"LOCAL_RANK", "1"},
          {"LOCAL_WORLD_SIZE", "2"},
          {"MASTER_ADDR", "node01"},
          {"MASTER_PORT", "20017"},
          {"CUDA_VISIBLE_DEVICES", "2,3"},
          {"AGENTRT_PORTS", "20016-20031"},
          {"AGENTRT_CKPT_DIR", "/runs/demo-1/checkpoints/predator-1"},
          {"AGENTRT_BUS", "node01:20000"},
          {"AGENTRT_TOKEN_FILE", "/runs/demo-1/secrets/predator-1.token"},
          {"AGENTRT_BUS_CA", "/runs/demo-1/secrets/bus-ca.pem"},
          {"AGENTRT_TELEMETRY", "ipc:///runs/demo-1/telemetry.sock"},
          {"AGENTRT_RESTART_COUNT", "2"},
          {"AGENTRT_WORKDIR", "/runs/demo-1/agents/predator-1"}};
}

Result<AgentEnv> Parse(const Env& env) { return AgentEnv::Parse(Lookup(env)); }

TEST_CASE("the agent environment is read from the agent contract's variables") {
  auto a = Parse(FullEnv());
  REQUIRE(a.ok());
  CHECK(a->run_dir == "/runs/demo-1");
  CHECK(a->agent == "predator-1");
  CHECK(a->agent_index == 3);
  CHECK(a->rank == 1);
  CHECK(a->world_size == 2);
  CHECK(a->local_rank == 1);
  CHECK(a->local_world_size == 2);
  CHECK(a->master_addr == "node01");
  CHECK(a->master_port == 20017);
  CHECK(a->ports_first == 20016);
  CHECK(a->ports_last == 20031);
  CHECK(a->cuda_visible_devices == "2,3");
  CHECK(a->ckpt_dir == "/runs/demo-1/checkpoints/predator-1");
  CHECK(a->bus == "node01:20000");
  CHECK(a->token_file == "/runs/demo-1/secrets/predator-1.token");
  CHECK(a->bus_ca_file == "/runs/demo-1/secrets/bus-ca.pem");
  CHECK(a->telemetry == "ipc:///runs/demo-1/telemetry.sock");
  CHECK(a->restart_count == 2);
  CHECK(a->workdir == "/runs/demo-1/agents/predator-1");
}

TEST_CASE("what a launcher writes, the rank reads back field for field") {
  AgentEnv e = *Parse(FullEnv());
  const std::map<std::string, std::string> vars = e.ToVariables();
  Env env(vars.begin(), vars.end());
  auto back = Parse(env);
  REQUIRE(back.ok());
  CHECK(back->ToVariables() == vars);
  for (const auto& [name, value] : FullEnv()) {
    INFO(name);
    CHECK(vars.at(name) == value);
  }
  // Without the rank part (a launcher whose wrapper fills it in).
  const auto agent_wide = e.ToVariables(/*with_rank=*/false);
  CHECK(agent_wide.count("RANK") == 0);
  CHECK(agent_wide.count("LOCAL_RANK") == 0);
  CHECK(agent_wide.count("WORLD_SIZE") == 0);
  CHECK(agent_wide.at("AGENTRT_AGENT") == "predator-1");
}

TEST_CASE("a missing variable is named, with a hint that agentctl run sets it") {
  for (const char* name :
       {"AGENTRT_RUN_DIR", "AGENTRT_AGENT", "AGENTRT_CKPT_DIR", "RANK", "WORLD_SIZE"}) {
    Env env = FullEnv();
    env.erase(name);
    auto a = Parse(env);
    REQUIRE_FALSE(a.ok());
    CHECK(a.status().message().find(std::string("environment variable ") + name + " is not set") !=
          std::string::npos);
    CHECK(a.status().message().find("agentctl run") != std::string::npos);
  }
}

TEST_CASE("malformed numbers and ranges in the environment are rejected by name") {
  Env env = FullEnv();
  env["MASTER_PORT"] = "20x";
  auto a = Parse(env);
  REQUIRE_FALSE(a.ok());
  CHECK(a.status().message().find("MASTER_PORT=\"20x\"") != std::string::npos);
  env = FullEnv();
  env["AGENTRT_PORTS"] = "20031-20016";
  CHECK_FALSE(Parse(env).ok());
  env = FullEnv();
  env["RANK"] = "2";
  auto b = Parse(env);
  REQUIRE_FALSE(b.ok());
  CHECK(b.status().message().find("outside WORLD_SIZE=2") != std::string::npos);
}

TEST_CASE("under mpirun the rank comes from Open MPI's variables; CPU agents see no GPU") {
  Env env = FullEnv();
  env.erase("RANK");
  env.erase("WORLD_SIZE");
  env.erase("LOCAL_RANK");
  env.erase("LOCAL_WORLD_SIZE");
  env["OMPI_COMM_WORLD_RANK"] = "3";
  env["OMPI_COMM_WORLD_SIZE"] = "4";
  env["OMPI_COMM_WORLD_LOCAL_RANK"] = "3";
  env["CUDA_VISIBLE_DEVICES"] = "";
  auto a = Parse(env);
  REQUIRE(a.ok());
  CHECK(a->rank == 3);
  CHECK(a->world_size == 4);
  CHECK(a->local_rank == 3);
  CHECK(a->cuda_visible_devices.empty());
}

TEST_CASE("the rank wrapper takes the rank from mpirun or from srun") {
  auto ompi = RankVariablesFromLauncher(Lookup({{"OMPI_COMM_WORLD_RANK", "1"},
                                                {"OMPI_COMM_WORLD_SIZE", "2"},
                                                {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                                                {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}}));
  REQUIRE(ompi.ok());
  CHECK(*ompi ==
        std::map<std::string, std::string>{
            {"RANK", "1"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "1"}, {"LOCAL_WORLD_SIZE", "2"}});
  auto srun = RankVariablesFromLauncher(Lookup({{"SLURM_PROCID", "3"},
                                                {"SLURM_NTASKS", "4"},
                                                {"SLURM_LOCALID", "1"},
                                                {"SLURM_NODEID", "1"},
                                                {"SLURM_TASKS_PER_NODE", "2(x2)"}}));
  REQUIRE(srun.ok());
  CHECK(srun->at("RANK") == "3");
  CHECK(srun->at("WORLD_SIZE") == "4");
  CHECK(srun->at("LOCAL_RANK") == "1");
  CHECK(srun->at("LOCAL_WORLD_SIZE") == "2");
  auto bad = RankVariablesFromLauncher(Lookup({{"SLURM_PROCID", "0"},
                                               {"SLURM_NTASKS", "1"},
                                               {"SLURM_LOCALID", "0"},
                                               {"SLURM_NODEID", "5"},
                                               {"SLURM_TASKS_PER_NODE", "1"}}));
  REQUIRE_FALSE(bad.ok());
  CHECK_THAT(bad.status().message(), Catch::Contains("SLURM_NODEID=5"));
  auto none = RankVariablesFromLauncher(Lookup({}));
  REQUIRE_FALSE(none.ok());
  CHECK_THAT(none.status().message(), Catch::Contains("mpirun or srun"));
}

TEST_CASE("SLURM_TASKS_PER_NODE expands to one count per node") {
  CHECK(ParseTasksPerNode("2").value() == std::vector<int>{2});
  CHECK(ParseTasksPerNode("2(x3),1").value() == std::vector<int>{2, 2, 2, 1});
  CHECK_FALSE(ParseTasksPerNode("").ok());
  CHECK_FALSE(ParseTasksPerNode("2(3)").ok());
  CHECK_FALSE(ParseTasksPerNode("x").ok());
}

TEST_CASE(
    "a rank's environment: the launcher's own minus inherited launch variables, the agent's, the "
    "contract") {
  const std::vector<std::string> base = {"PATH=/bin",
                                         "HOME=/root",
                                         "RANK=7",
                                         "OMPI_COMM_WORLD_RANK=3",
                                         "AGENTRT_AGENT=old",
                                         "CUDA_VISIBLE_DEVICES=0,1,2",
                                         "MASTER_PORT=29500"};
  const auto env = ComposeEnvironment(base, {{"PYTHONUNBUFFERED", "1"}, {"HOME", "/agent"}},
                                      {{"RANK", "0"}, {"AGENTRT_AGENT", "a"}});
  const std::vector<std::string> expected = {"AGENTRT_AGENT=a", "HOME=/agent", "PATH=/bin",
                                             "PYTHONUNBUFFERED=1", "RANK=0"};
  CHECK(env == expected);
  CHECK(IsInheritedLaunchVariable("NCCL_SOCKET_IFNAME"));
  CHECK_FALSE(IsInheritedLaunchVariable("NCCL_DEBUG"));
}

}  // namespace
}  // namespace agentrt

namespace agentrt {
namespace {

TEST_CASE("CUDA_VISIBLE_DEVICES entries are read as CUDA reads them: UUIDs and MIG count") {
  CHECK(DeviceListEntries("0,1") == std::vector<std::string>{"0", "1"});
  CHECK(DeviceListEntries("GPU-8a1b,MIG-3c4d") == std::vector<std::string>{"GPU-8a1b", "MIG-3c4d"});
  CHECK(DeviceListEntries("2,-1,3") == std::vector<std::string>{"2"});  // CUDA stops at -1
  CHECK(DeviceListEntries("").empty());
  AgentEnv e;
  e.cuda_visible_devices = "GPU-8a1b,GPU-77ff";
  CHECK(e.VisibleGpuCount() == 2);
}

TEST_CASE("plan GPU ids map through the launcher's own CUDA_VISIBLE_DEVICES") {
  CHECK(VisibleDevicesFor({0, 1}, std::nullopt).value() == "0,1");
  CHECK(VisibleDevicesFor({0, 1}, std::string("4,6,7")).value() == "4,6");
  CHECK(VisibleDevicesFor({1}, std::string("GPU-a,GPU-b")).value() == "GPU-b");
  CHECK(VisibleDevicesFor({}, std::string("0")).value().empty());
  auto bad = VisibleDevicesFor({2}, std::string("0,1"));
  REQUIRE_FALSE(bad.ok());
  CHECK_THAT(bad.status().message(), Catch::Contains("makes 2 GPU(s) visible"));
}

}  // namespace
}  // namespace agentrt
