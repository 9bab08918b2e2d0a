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

TEST_CASE("srun argv: the plan's ranks per node") {
  AgentLaunch a = TwoNodeAgent();
  a.ranks = {{0, 0, 2, "gpu-01", {0}},
             {1, 1, 2, "gpu-01", {1}},
             {2, 0, 2, "gpu-02", {0}},
             {3, 1, 2, "gpu-02", {1}}};
  const auto argv = BuildSrunArgv(a, "/bin/train", SrunOptions{});
  CHECK(Has(argv, "--ntasks-per-node=2"));
  CHECK(Has(argv, "--distribution=block"));
  CHECK(Has(argv, "--gres=gpu:1"));
  CHECK_FALSE(Has(argv, "--overlap"));
  // Going on without a failed node, its step may overlap the dead step that
  // slurmctld still counts on the healthy nodes.
  a.overlap_steps = true;
  CHECK(Has(BuildSrunArgv(a, "/bin/train", SrunOptions{}), "--overlap"));
}

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
  // Two ranks on gpu-01, one on gpu-02: uneven, so SLURM is not told a per-node count.
  CHECK(std::none_of(argv.begin(), argv.end(),
                     [](const std::string& a) { return a.rfind("--ntasks-per-node", 0) == 0; }));
  // Every task runs the rank wrapper with the plan's GPUs of its node, its
  // log dir, the step id file and the agent's port block to lease on each
  // node; the command comes last, arguments untouched.
  const auto wrapper = std::find(argv.begin(), argv.end(), "agentrt-exec-rank");
  REQUIRE(wrapper != argv.end());
  CHECK(std::vector<std::string>(wrapper, argv.end()) ==
        std::vector<std::string>{"agentrt-exec-rank", "--log-dir", "/runs/r/logs/learner", "--gpus",
                                 "gpu-01=2,3", "--gpus", "gpu-02=0", "--step-id-file",
                                 "/runs/r/logs/learner/step.id", "--exit-record", "--lease-ports",
                                 "30000-30007", "--", "/bin/train", "--lr", "3e-4"});
  options.trust_slurm_binding = true;  // ConstrainDevices clusters: SLURM's binding stands
  const auto trusting = BuildSrunArgv(TwoNodeAgent(), "/bin/train", options);
  CHECK_FALSE(Has(trusting, "--gpus"));
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

TEST_CASE("srun environment: the agent-wide contract, no rank variables") {
  SrunOptions options;
  options.base_env = {"PATH=/usr/bin", "RANK=7", "CUDA_VISIBLE_DEVICES=0,1,2,3,4,5,6,7"};
  const auto env = BuildSrunEnvironment(TwoNodeAgent(), 30003, options);
  CHECK(Value(env, "MASTER_PORT") == "30003");
  CHECK(Value(env, "AGENTRT_AGENT") == "learner");
  CHECK(Value(env, "AGENTRT_PORTS") == "30000-30007");
  CHECK(Value(env, "PATH") == "/usr/bin");
  // Set per task by the rank wrapper from SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID.
  CHECK(Value(env, "RANK") == "<unset>");
  CHECK(Value(env, "WORLD_SIZE") == "<unset>");
  CHECK(Value(env, "CUDA_VISIBLE_DEVICES") == "2,3");  // the wrapper's --gpus sets each node's
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
  // Two nodes: each asks for the most ranks the plan puts on one (2, on n1) plus the controller.
  CHECK(s.find("#SBATCH --ntasks-per-node=3\n") != std::string::npos);
  CHECK(s.find("#SBATCH --ntasks=") == std::string::npos);
  // Several nodes: losing one must not end the job (the controller handles it).
  CHECK(s.find("#SBATCH --no-kill\n") != std::string::npos);
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

TEST_CASE("allocation script: spare nodes widen --nodes beyond the plan's --nodelist") {
  Plan plan;
  plan.run = "spares";
  AgentPlan a;
  a.name = "a";
  a.ranks = 1;
  a.placement = {{"n1", {0}, {0}}};
  plan.agents = {a};
  SlurmConfig slurm;
  AllocScriptOptions options;
  options.run_dir = "/runs/spares-1";
  options.agentctl_path = "agentctl";
  const std::string plain = AllocationScript(plan, slurm, options);
  CHECK(plain.find("#SBATCH --nodes=1\n") != std::string::npos);
  CHECK(plain.find("--no-kill") == std::string::npos);  // one node, no spare: SLURM's default
  slurm.spare_nodes = 2;
  const std::string s = AllocationScript(plan, slurm, options);
  CHECK(s.find("#SBATCH --nodes=3\n#SBATCH --nodelist=n1\n") != std::string::npos);
  CHECK(s.find("#SBATCH --no-kill\n") != std::string::npos);
  CHECK(s.find("2 spare") != std::string::npos);
  // Tasks per node, so that a spare can take the agent's ranks (and -n is not below -N).
  CHECK(s.find("#SBATCH --ntasks-per-node=2\n") != std::string::npos);
  CHECK(s.find("#SBATCH --ntasks=") == std::string::npos);
}
