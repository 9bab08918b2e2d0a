#include "slurm/array_task.h"

#include <fmt/format.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <filesystem>

#include "common/file_util.h"
#include "plan/fence.h"
#include "plan/run_dir.h"
#include "scheduler/hostlist.h"

namespace agentrt::slurm {
Result<std::map<std::string, std::string>> ArrayTaskEnvironment(const AgentPlan& agent,
                                                                const std::string& run_dir,
                                                                const std::string& bus_address,
                                                                const std::string& bus_ca_file,
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
  contract.bus_ca_file = bus_ca_file;
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
  return vars;
}

namespace {

// What of `base_env` the agent keeps although ComposeEnvironment would strip it
// as another launcher's: the PMIx / Open MPI wiring srun gave this very
// process, and the cluster's NCCL/gloo interface choice (no agentrt-exec-rank
// picks one in array mode).
std::map<std::string, std::string> LauncherWiring(const std::vector<std::string>& base_env) {
  std::map<std::string, std::string> wiring;
  for (const std::string& e : base_env) {
    const size_t eq = e.find('=');
    if (eq != std::string::npos && IsLauncherWiringVariable(std::string_view(e).substr(0, eq)))
      wiring[e.substr(0, eq)] = e.substr(eq + 1);
  }
  return wiring;
}

}  // namespace

Result<ArrayTaskLaunch> PrepareArrayTask(const std::string& run_dir, const std::string& agent_name,
                                         const std::string& self_path, const EnvLookup& env,
                                         const std::vector<std::string>& base_env) {
  const RunDir dir(run_dir);
  AGENTRT_ASSIGN_OR_RETURN(Plan plan, ReadAgentPlanView(run_dir, agent_name));
  const AgentPlan* agent = plan.FindAgent(agent_name);
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
  AGENTRT_ASSIGN_OR_RETURN(auto vars, ArrayTaskEnvironment(*agent, run_dir, bus_address,
                                                           plan.bus.settings.ClientCaFile(), env));
  const std::optional<std::string> job = env("SLURM_JOB_ID");
  if (!job || job->empty()) {
    return FailedPrecondition(fmt::format("agent {}: SLURM_JOB_ID is not set", agent_name));
  }
  ArrayTaskLaunch launch;
  launch.incarnation =
      ArrayTaskIncarnation(*job, std::atoi(vars.at("AGENTRT_RESTART_COUNT").c_str()));
  launch.workdir = vars.at("AGENTRT_WORKDIR");
  launch.argv = agent->command;
  for (const std::string& d : {launch.workdir, vars.at("AGENTRT_CKPT_DIR")}) {
    std::error_code ec;
    std::filesystem::create_directories(d, ec);
    if (ec)
      return Internal(fmt::format("agent {}: cannot create {}: {}", agent_name, d, ec.message()));
  }
  AGENTRT_RETURN_IF_ERROR(WriteCheckpointFence(vars.at("AGENTRT_CKPT_DIR"), launch.incarnation)
                              .WithContext("agent " + agent_name));
  std::map<std::string, std::string> contract = LauncherWiring(base_env);
  for (auto& [k, v] : vars) contract[k] = std::move(v);
  // The agent's own PATH (its env:) when it sets one, else the task's.
  const auto own = contract.find("PATH");
  const std::string path =
      own != contract.end() ? own->second : env("PATH").value_or("/usr/bin:/bin");
  contract["PATH"] = std::filesystem::path(self_path).parent_path().string() + ":" + path;
  launch.env = ComposeEnvironment(base_env, {}, contract);
  return launch;
}

Status ExecArrayTask(const std::string& run_dir, const std::string& agent_name,
                     const std::string& self_path) {
  std::vector<std::string> base;
  for (char** e = environ; *e != nullptr; ++e) base.emplace_back(*e);
  AGENTRT_ASSIGN_OR_RETURN(ArrayTaskLaunch launch, PrepareArrayTask(run_dir, agent_name, self_path,
                                                                    EnvLookupOf(base), base));
  if (::chdir(launch.workdir.c_str()) != 0)
    return ErrnoStatus(errno, fmt::format("agent {}: cannot enter {}", agent_name, launch.workdir));
  // execvpe looks argv[0] up in this process's PATH: the agent's.
  for (const std::string& e : launch.env) {
    if (e.rfind("PATH=", 0) == 0) setenv("PATH", e.c_str() + 5, 1);
  }
  std::vector<char*> argv, envp;
  for (std::string& a : launch.argv) argv.push_back(a.data());
  argv.push_back(nullptr);
  for (std::string& e : launch.env) envp.push_back(e.data());
  envp.push_back(nullptr);
  execvpe(argv[0], argv.data(), envp.data());
  return ErrnoStatus(errno,
                     fmt::format("agent {}: cannot run '{}'", agent_name, launch.argv.front()));
}

}  // namespace agentrt::slurm
