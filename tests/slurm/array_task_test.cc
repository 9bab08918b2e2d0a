#include "slurm/array_task.h"

#include <algorithm>
#include <catch2/catch.hpp>
#include <map>

#include "common/file_util.h"
#include "plan/fence.h"
#include "tests/common/temp_dir.h"
#include "tests/slurm/test_plans.h"

using namespace agentrt;
using namespace agentrt::slurm;
using agentrt::slurm::testing::AddAgent;
using agentrt::slurm::testing::MapLookup;

namespace {

std::map<std::string, std::string> SlurmRank(int procid, int ntasks, const std::string& per_node,
                                             const std::string& nodelist) {
  return {{"SLURM_PROCID", std::to_string(procid)},
          {"SLURM_NTASKS", std::to_string(ntasks)},
          {"SLURM_LOCALID", std::to_string(procid % 2)},
          {"SLURM_NODEID", std::to_string(procid / 2)},
          {"SLURM_TASKS_PER_NODE", per_node},
          {"SLURM_JOB_NODELIST", nodelist},
          {"CUDA_VISIBLE_DEVICES", "4,5"}};
}

}  // namespace

TEST_CASE("an array task's rank gets the agent contract from the plan and from SLURM") {
  Plan plan;
  plan.run = "pp";
  AddAgent(plan, "prey-0", 2, 4, "planned-node", 20032, "/runs/pp");
  plan.agents[0].env = {{"PYTHONUNBUFFERED", "1"}, {"RANK", "overridden"}};
  auto vars = SlurmRank(3, 4, "2(x2)", "gpu[07-08]");
  vars["SLURM_RESTART_COUNT"] = "1";
  auto env = ArrayTaskEnvironment(plan.agents[0], "/runs/pp", "gpu09:41234", "/etc/bus-ca.pem",
                                  MapLookup(vars));
  REQUIRE(env.ok());
  const auto& e = *env;
  CHECK(e.at("AGENTRT_AGENT") == "prey-0");
  CHECK(e.at("AGENTRT_AGENT_INDEX") == "0");
  CHECK(e.at("AGENTRT_RUN_DIR") == "/runs/pp");
  CHECK(e.at("RANK") == "3");
  CHECK(e.at("WORLD_SIZE") == "4");
  CHECK(e.at("LOCAL_RANK") == "1");
  CHECK(e.at("LOCAL_WORLD_SIZE") == "2");
  CHECK(e.at("MASTER_ADDR") == "gpu07");  // where SLURM put it, not the planned node
  CHECK(e.at("MASTER_PORT") == "20032");
  CHECK(e.at("AGENTRT_PORTS") == "20032-20047");
  CHECK(e.at("AGENTRT_CKPT_DIR") == "/runs/pp/checkpoints/prey-0");
  CHECK(e.at("AGENTRT_BUS") == "gpu09:41234");
  CHECK(e.at("AGENTRT_TOKEN_FILE") == "/runs/pp/secrets/prey-0.token");
  CHECK(e.at("AGENTRT_BUS_CA") == "/etc/bus-ca.pem");  // a TLS bus: its clients trust this CA
  CHECK(e.at("AGENTRT_RESTART_COUNT") == "1");
  CHECK(e.at("CUDA_VISIBLE_DEVICES") == "4,5");
  CHECK(e.at("PYTHONUNBUFFERED") == "1");
  CHECK(e.at("AGENTRT_TELEMETRY").empty());                    // no run controller in array mode
  CHECK(e.at("AGENTRT_WORKDIR") == "/runs/pp/agents/prey-0");  // as under agentctl run
}

TEST_CASE("a CPU agent's rank sees no GPU") {
  Plan plan;
  AddAgent(plan, "cpu", 0, 1, "n", 20016, "/r");
  auto env =
      ArrayTaskEnvironment(plan.agents[0], "/r", "h:1", "", MapLookup(SlurmRank(0, 1, "1", "n1")));
  REQUIRE(env.ok());
  CHECK(env->at("CUDA_VISIBLE_DEVICES").empty());
  CHECK(env->at("AGENTRT_RESTART_COUNT") == "0");
}

TEST_CASE("array-task errors name what SLURM did not provide") {
  Plan plan;
  AddAgent(plan, "g", 2, 2, "n", 20016, "/r");
  auto no_procid = SlurmRank(0, 2, "2", "n1");
  no_procid.erase("SLURM_PROCID");
  auto e1 = ArrayTaskEnvironment(plan.agents[0], "/r", "h:1", "", MapLookup(no_procid));
  REQUIRE_FALSE(e1.ok());
  CHECK_THAT(e1.status().message(), Catch::Contains("SLURM_PROCID"));

  auto e2 =
      ArrayTaskEnvironment(plan.agents[0], "/r", "h:1", "", MapLookup(SlurmRank(0, 3, "3", "n1")));
  REQUIRE_FALSE(e2.ok());
  CHECK_THAT(e2.status().message(), Catch::Contains("3 tasks"));

  auto no_gpu = SlurmRank(0, 2, "2", "n1");
  no_gpu.erase("CUDA_VISIBLE_DEVICES");
  auto e3 = ArrayTaskEnvironment(plan.agents[0], "/r", "h:1", "", MapLookup(no_gpu));
  REQUIRE_FALSE(e3.ok());
  CHECK_THAT(e3.status().message(), Catch::Contains("CUDA_VISIBLE_DEVICES"));
}

TEST_CASE("an array task's rank is composed like any launch: stale variables out, fenced") {
  agentrt::testing::TempDir dir;
  Plan plan;
  plan.run = "pp";
  AddAgent(plan, "mpi-agent", 0, 2, "n", 20016, dir.path, {"agent-worker", "--x"});
  plan.agents[0].env = {{"PYTHONUNBUFFERED", "1"}, {"PATH", "/agent/bin"}};
  REQUIRE(WriteRunPlan(plan, dir.path).ok());
  dir.Write("bus.address", "gpu09:41234\n");
  auto vars = SlurmRank(1, 2, "2", "n1");
  vars["SLURM_JOB_ID"] = "812";
  vars["SLURM_RESTART_COUNT"] = "2";
  vars["PATH"] = "/usr/bin";
  // The task's own environment: srun's PMIx wiring, and what a submitting
  // shell left that must not reach the agent.
  const std::vector<std::string> base = {"HOME=/home/u",  "PMIX_RANK=1",
                                         "OMPI_MCA_x=y",  "AGENTRT_RUN_DIR=/elsewhere",
                                         "MASTER_PORT=1", "NCCL_SOCKET_IFNAME=ib0",
                                         "PATH=/usr/bin"};
  auto launch =
      PrepareArrayTask(dir.path, "mpi-agent", "/opt/agentrt/bin/agentctl", MapLookup(vars), base);
  REQUIRE(launch.ok());
  auto has = [&](const std::string& entry) {
    return std::find(launch->env.begin(), launch->env.end(), entry) != launch->env.end();
  };
  CHECK(has("HOME=/home/u"));
  CHECK(has("PMIX_RANK=1"));  // MPI_Init under srun --mpi=pmix needs its wiring
  CHECK(has("OMPI_MCA_x=y"));
  CHECK(has("NCCL_SOCKET_IFNAME=ib0"));
  CHECK(has("AGENTRT_RUN_DIR=" + dir.path));  // the contract's, not the shell's
  CHECK(has("MASTER_PORT=20016"));
  CHECK(has("RANK=1"));
  CHECK(has("PYTHONUNBUFFERED=1"));
  CHECK(has("PATH=/opt/agentrt/bin:/agent/bin"));  // the agent's own PATH, after agentrt's tools
  CHECK(launch->argv == std::vector<std::string>{"agent-worker", "--x"});
  CHECK(launch->workdir == dir.path + "/agents/mpi-agent");
  CHECK(launch->incarnation == "slurm-812.2");
  auto fence = ReadCheckpointFence(dir.path + "/checkpoints/mpi-agent");
  REQUIRE(fence.ok());
  CHECK(*fence == std::optional<std::string>("slurm-812.2"));

  vars.erase("SLURM_JOB_ID");
  auto no_job =
      PrepareArrayTask(dir.path, "mpi-agent", "/opt/agentrt/bin/agentctl", MapLookup(vars), base);
  REQUIRE_FALSE(no_job.ok());
  CHECK_THAT(no_job.status().message(), Catch::Contains("SLURM_JOB_ID"));
  CHECK_THAT(PrepareArrayTask(dir.path, "nobody", "x", MapLookup(vars), base).status().message(),
             Catch::Contains("agent 'nobody' is not in"));
}
