#include "slurm/array_task.h"

#include <fmt/format.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <filesystem>

#include "common/file_util.h"
#include "plan/run_dir.h"
#include "scheduler/hostlist.h"

namespace agentrt::slurm {
Result<std::map<std::string, std::string>> ArrayTaskEnvironment(const Plan& plan,
                                                                const AgentPlan& agent,
                                                                const std::string& run_dir,
                                                                const std::string& bus_address,
                                                                const EnvLookup& env) {
  const std::string where = fmt::format("agent {}", agent.name);
  if (!env("SLURM_PROCID")) {
    return FailedPrecondition(
        "SLURM_PROCID is not set: `agentctl array-task` runs under srun inside a job-array task "
        "(see the array-*.sbatch scripts)");
  }
  Result<std::map<std::string, std::string>> rank_vars = RankVariablesFromLauncher(env);
  if (!rank_vars.ok()) return rank_vars.status().WithContext(where);
  const int world = std::atoi(rank_vars->at("WORLD_SIZE").c_str());
  if (world != agent.ranks) {
    return FailedPrecondition(
        fmt::format("{}: SLURM started {} tasks but the plan ({}/plan.json) gives the agent {} "
                    "ranks; was the array script edited?",
                    where, world, run_dir, agent.ranks));
  }
  std::optional<std::string> nodelist = env("SLURM_JOB_NODELIST");
  if (!nodelist) return FailedPrecondition(where + ": SLURM_JOB_NODELIST is not set");
  auto hosts = ExpandHostlist(*nodelist);
  if (!hosts.ok()) return hosts.status().WithContext(where + ": SLURM_JOB_NODELIST");
  if (hosts->empty()) return InvalidArgument(where + ": SLURM_JOB_NODELIST is empty");

  const RunDir dir(run_dir);
  AgentEnv contract;
  contract.run_dir = run_dir;
  contract.agent = agent.name;
  contract.agent_index = agent.index;
  contract.master_addr = hosts->front();
  contract.master_port = agent.master_port;
  contract.ports_first = agent.ports.first;
  contract.ports_last = agent.ports.last;
  contract.ckpt_dir = dir.Resolve(agent.checkpoint_dir);
  contract.bus = bus_address;
  contract.token_file = dir.TokenPath(agent.name);
  contract.restart_count = std::atoi(env("SLURM_RESTART_COUNT").value_or("0").c_str());
  contract.workdir =
      dir.Resolve(agent.workdir.empty() ? RunDir::RelativeWorkDir(agent.name) : agent.workdir);
  if (agent.gpus > 0) {
    std::optional<std::string> cvd = env("CUDA_VISIBLE_DEVICES");
    if (!cvd || cvd->empty()) {
      return FailedPrecondition(
          fmt::format("{}: the agent has {} GPUs but SLURM set no CUDA_VISIBLE_DEVICES; does "
                      "the cluster's gres.conf declare its GPUs?",
                      where, agent.gpus));
    }
    contract.cuda_visible_devices = *cvd;  // SLURM, not the plan, chose them in array mode
  }
  // There is no run controller in array mode: AGENTRT_TELEMETRY stays empty.
  std::map<std::string, std::string> vars = agent.env;  // the plan's first; the contract wins
  for (auto& [k, v] : contract.ToVariables(false)) vars[k] = std::move(v);
  for (auto& [k, v] : *rank_vars) vars[k] = std::move(v);
  (void)plan;
  return vars;
}

Status ExecArrayTask(const std::string& run_dir, const std::string& agent_name,
                     const std::string& self_path) {
  const RunDir dir(run_dir);
  AGENTRT_ASSIGN_OR_RETURN(Plan plan, ReadPlanFile(dir.PlanPath()));
  const AgentPlan* agent = plan.FindAgent(agent_name);
  if (agent == nullptr) {
    return NotFound(fmt::format("agent '{}' is not in {}/plan.json", agent_name, run_dir));
  }
  if (agent->command.empty())
    return InvalidArgument(fmt::format("agent {}: empty command in the plan", agent_name));
  const std::string bus = ReadWholeFile(dir.BusAddressPath(), 4096).value_or("");
  const std::string bus_address = bus.substr(0, bus.find('\n'));
  if (bus_address.empty()) {
    return FailedPrecondition(
        fmt::format("agent {}: {}/bus.address is missing or empty; the bus job has not "
                    "published its address",
                    agent_name, run_dir));
  }
  AGENTRT_ASSIGN_OR_RETURN(
      auto vars, ArrayTaskEnvironment(plan, *agent, run_dir, bus_address, ProcessEnvLookup()));
  for (const auto& [k, v] : vars) {
    if (setenv(k.c_str(), v.c_str(), 1) != 0) return ErrnoStatus(errno, "setenv " + k);
  }
  // The agent runs in its own working directory, as under `agentctl run`.
  const std::string workdir = vars.at("AGENTRT_WORKDIR");
  std::error_code ec;
  std::filesystem::create_directories(workdir, ec);
  if (ec)
    return Internal(
        fmt::format("agent {}: cannot create {}: {}", agent_name, workdir, ec.message()));
  if (::chdir(workdir.c_str()) != 0)
    return ErrnoStatus(errno, fmt::format("agent {}: cannot enter {}", agent_name, workdir));
  // agent-worker and the other tools live next to agentctl.
  std::string bin = std::filesystem::path(self_path).parent_path().string();
  const char* path = std::getenv("PATH");
  std::string new_path = bin + ":" + (path ? path : "/usr/bin:/bin");
  setenv("PATH", new_path.c_str(), 1);

  std::vector<char*> argv;
  for (const std::string& a : agent->command) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  execvp(argv[0], argv.data());
  return ErrnoStatus(errno,
                     fmt::format("agent {}: cannot run '{}'", agent_name, agent->command.front()));
}

}  // namespace agentrt::slurm
