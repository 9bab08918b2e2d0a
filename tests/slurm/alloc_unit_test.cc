// The srun command line of one agent step and the allocation script, from a
// plan: no cluster needed.
#include <algorithm>
#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "slurm/alloc_script.h"
#include "slurm/srun_backend.h"

using namespace agentrt;
using namespace agentrt::slurm;

namespace {

bool Has(const std::vector<std::string>& v, const std::string& s) {
  return std::find(v.begin(), v.end(), s) != v.end();
}

std::string Value(const std::vector<std::string>& env, const std::string& name) {
  for (const auto& e : env) {
    if (e.rfind(name + "=", 0) == 0) return e.substr(name.size() + 1);
  }
  return "<unset>";
}

AgentLaunch TwoNodeAgent() {
  AgentLaunch a;
  a.name = "learner";
  a.ranks = {{0, 0, 2, "gpu-01", {2, 3}}, {1, 1, 2, "gpu-01", {2, 3}}, {2, 0, 1, "gpu-02", {0}}};
  a.command = {"train", "--lr", "3e-4"};
  a.log_dir = "/runs/r/logs/learner";
  a.ports_first = 30000;
  a.ports_last = 30007;
  return a;
}

}  // namespace

TEST_CASE("srun argv: one step with the plan's nodes, tasks, GPUs and MPI") {
  SrunOptions options;
  options.cpus_per_rank = 4;
  options.mpi_agents = {"learner"};
  const auto argv = BuildSrunArgv(TwoNodeAgent(), "/bin/train", options);
  CHECK(argv[0] == "srun");
  CHECK(Has(argv, "--exact"));
  CHECK(Has(argv, "--kill-on-bad-exit=1"));
  CHECK(Has(argv, "--job-name=learner"));
  CHECK(Has(argv, "--nodes=2"));
  CHECK(Has(argv, "--nodelist=gpu-01,gpu-02"));
  CHECK(Has(argv, "--ntasks=3"));
  CHECK(Has(argv, "--cpus-per-task=4"));
  CHECK(Has(argv, "--gres=gpu:2"));
  CHECK(Has(argv, "--mpi=pmix"));
  // The command comes last, after the rank wrapper, arguments untouched.
  REQUIRE(argv.size() >= 4);
  CHECK(std::vector<std::string>(argv.end() - 4, argv.end()) ==
        std::vector<std::string>{"sh", "/bin/train", "--lr", "3e-4"});
}

TEST_CASE("srun argv: a CPU agent asks for no GRES and no MPI") {
  AgentLaunch a;
  a.name = "env";
  a.ranks = {{0, 0, 1, "cpu-01", {}}};
  a.command = {"env-worker"};
  const auto argv = BuildSrunArgv(a, "/bin/env-worker", SrunOptions{});
  CHECK(Has(argv, "--gres=none"));
  CHECK(Has(argv, "--mpi=none"));
  CHECK(Has(argv, "--nodes=1"));
}

TEST_CASE("srun environment: the plan's GPUs per node for the wrapper, no rank variables") {
  SrunOptions options;
  options.base_env = {"PATH=/usr/bin", "RANK=7", "CUDA_VISIBLE_DEVICES=0,1,2,3,4,5,6,7"};
  const auto env = BuildSrunEnvironment(TwoNodeAgent(), 30003, options);
  CHECK(Value(env, "AGENTRT_STEP_GPUS_gpu_01") == "2,3");
  CHECK(Value(env, "AGENTRT_STEP_GPUS_gpu_02") == "0");
  CHECK(Value(env, "AGENTRT_STEP_LOG_DIR") == "/runs/r/logs/learner");
  CHECK(Value(env, "MASTER_PORT") == "30003");
  CHECK(Value(env, "WORLD_SIZE") == "3");
  CHECK(Value(env, "RANK") == "<unset>");  // set per task from SLURM_PROCID
  CHECK(Value(env, "AGENTRT_TRUST_SLURM_GPUS") == "<unset>");
  CHECK(std::is_sorted(env.begin(), env.end()));
}

TEST_CASE("allocation script: nodes, tasks, GPUs, signal, requeue, no secret, controller exec") {
  Plan plan;
  plan.run = "demo";
  AgentPlan a;
  a.name = "a";
  a.ranks = 2;
  a.placement = {{"n1", {0, 1}, {0, 1}}};
  AgentPlan b;
  b.name = "b";
  b.ranks = 1;
  b.placement = {{"n2", {}, {0}}};
  plan.agents = {a, b};
  SlurmConfig slurm;
  slurm.partition = "gpu";
  slurm.account = "rl team";
  slurm.time = "01:00:00";
  slurm.signal_grace_s = 90;
  AllocScriptOptions options;
  options.run_dir = "/runs/demo-1";
  options.agentctl_path = "/opt/agentrt/bin/agentctl";
  const std::string s = AllocationScript(plan, slurm, options);
  CHECK(s.rfind("#!/bin/bash\n", 0) == 0);
  CHECK(s.find("#SBATCH --nodes=2\n") != std::string::npos);
  CHECK(s.find("#SBATCH --nodelist=n1,n2\n") != std::string::npos);
  CHECK(s.find("#SBATCH --ntasks=4\n") != std::string::npos);  // 3 ranks + the controller
  CHECK(s.find("#SBATCH --gres=gpu:2\n") != std::string::npos);
  CHECK(s.find("#SBATCH --signal=B:USR2@90\n") != std::string::npos);
  CHECK(s.find("#SBATCH --requeue\n") != std::string::npos);
  CHECK(s.find("#SBATCH --partition=gpu\n") != std::string::npos);
  CHECK(s.find("#SBATCH --account='rl team'\n") != std::string::npos);
  CHECK(s.find("#SBATCH --time=01:00:00\n") != std::string::npos);
  CHECK(s.find("#SBATCH --output=/runs/demo-1/slurm-%j.out\n") != std::string::npos);
  CHECK(s.find("exec /opt/agentrt/bin/agentctl run --backend slurm-steps --run-dir /runs/demo-1") !=
        std::string::npos);
  // Nothing runs but the controller: every other line is a comment or blank.
  int commands = 0;
  size_t at = 0;
  while (at < s.size()) {
    const size_t end = s.find('\n', at);
    const std::string line = s.substr(at, end - at);
    if (!line.empty() && line[0] != '#') ++commands;
    at = end == std::string::npos ? s.size() : end + 1;
  }
  CHECK(commands == 1);
}
