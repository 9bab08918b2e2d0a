#include "slurm/srun_backend.h"

#include <signal.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <set>

#include "common/file_util.h"
#include "plan/port_lease.h"
#include "plan/rank_exec.h"
#include "scheduler/launch_backend.h"

namespace agentrt::slurm {
namespace {

// Plan nodes in rank order, each once.
std::vector<std::string> Nodes(const AgentLaunch& agent) {
  std::vector<std::string> nodes;
  for (const auto& r : agent.ranks) {
    if (std::find(nodes.begin(), nodes.end(), r.node) == nodes.end()) nodes.push_back(r.node);
  }
  return nodes;
}

std::string SignalName(int sig) {
  switch (sig) {
    case SIGTERM:
      return "TERM";
    case SIGKILL:
      return "KILL";
    case SIGINT:
      return "INT";
    case SIGCONT:
      return "CONT";
    case SIGUSR2:
      return "USR2";
    case SIGHUP:
      return "HUP";
    default:
      return std::to_string(sig);
  }
}

struct Step {
  pid_t pid = 0;  // the local srun; 0 when it has exited
  std::string log_dir;
  int ranks = 0;
  int restart_count = 0;
};

// After srun exited 0: every rank must have left a clean exit record (the
// wrapper writes one however the program ends). srun also exits 0 when SLURM
// removed a failed node from the job (--no-kill); then its ranks there left
// none. Returns "" when every rank ended cleanly, else what was lost.
std::string LostRanks(const Step& step) {
  std::vector<bool> clean(static_cast<size_t>(step.ranks), false);
  for (const RankExit& r : ReadRankExits(step.log_dir, step.restart_count)) {
    if (r.rank >= 0 && r.rank < step.ranks && r.signal == 0 && r.exit_code == 0)
      clean[static_cast<size_t>(r.rank)] = true;
  }
  std::string missing;
  for (int r = 0; r < step.ranks; ++r) {
    if (!clean[static_cast<size_t>(r)]) missing += (missing.empty() ? "" : ",") + std::to_string(r);
  }
  if (missing.empty()) return "";
  std::string said = ReadWholeFile(step.log_dir + "/srun.log", 1 << 20).value_or("");
  const size_t at = said.rfind("error:");
  said = at == std::string::npos ? "" : said.substr(at, said.find('\n', at) - at);
  return "rank(s) " + missing + " left no clean exit record" +
         (said.empty() ? std::string() : " (srun " + said + ")");
}

class SrunBackend final : public LaunchBackend {
 public:
  SrunBackend(std::unique_ptr<ProcessSpawner> spawner, CommandRunner* runner, SrunOptions options)
      : spawner_(std::move(spawner)), runner_(runner), options_(std::move(options)) {
    if (options_.base_env.empty()) options_.base_env = CurrentEnviron();
    if (options_.search_dirs.empty()) options_.search_dirs = DefaultSearchDirs();
  }

  Result<LaunchedAgent> Launch(const AgentLaunch& agent) override {
    AGENTRT_RETURN_IF_ERROR(
        PrepareLaunch(agent, steps_.count(agent.name) > 0 && steps_[agent.name].pid != 0));
    std::error_code ec;
    std::filesystem::remove(agent.log_dir + "/step.id", ec);

    AGENTRT_ASSIGN_OR_RETURN(const int port, PickFreePort(agent.name, agent.master_port,
                                                          agent.ports_first, agent.ports_last));
    const std::string path_env = EnvLookupOf(options_.base_env)("PATH").value_or("");
    auto program = ResolveExecutable(agent.command[0], path_env, options_.search_dirs);
    if (!program.ok()) return program.status().WithContext("agent " + agent.name);
    auto srun = ResolveExecutable(options_.srun, path_env, {});
    if (!srun.ok()) return srun.status().WithContext("agent " + agent.name + ": srun");

    SpawnRequest req;
    req.argv = BuildSrunArgv(agent, *program, options_);
    req.argv[0] = *srun;
    req.env = BuildSrunEnvironment(agent, port, options_);
    req.log_path = agent.log_dir + "/srun.log";
    auto pid = spawner_->Spawn(req);
    if (!pid.ok()) return pid.status().WithContext("agent " + agent.name + ": srun");

    steps_[agent.name] =
        Step{*pid, agent.log_dir, static_cast<int>(agent.ranks.size()), agent.restart_count};
    owner_[*pid] = agent.name;
    LaunchedAgent launched;
    launched.process_group = *pid;
    launched.master_port = port;
    for (const auto& r : agent.ranks) launched.ranks.push_back({r.rank, *pid, r.node});
    return launched;
  }

  Status Signal(const std::string& agent, int sig) override {
    auto it = steps_.find(agent);
    if (it == steps_.end() || it->second.pid == 0) return Status::Ok();
    const std::string step = StepId(it->second);
    Status result = Status::Ok();
    if (!step.empty() && runner_ != nullptr) {
      std::vector<std::string> argv = {options_.scancel};
      if (sig != SIGKILL) argv.push_back("--signal=" + SignalName(sig));
      argv.push_back(step);
      auto out = runner_->Run(argv, 30);
      if (!out.ok()) {
        result = out.status().WithContext("agent " + agent + ": scancel of step " + step);
      } else if (out->exit_code != 0 && sig != SIGKILL) {
        result = Unavailable("agent " + agent + ": " + FormatCommand(argv) + " exited with code " +
                             std::to_string(out->exit_code) + ": " + out->err);
      }
      if (sig != SIGKILL) return result;
    }
    // SIGKILL (after scancel), or no step id yet: the local srun, which forwards
    // catchable signals to its tasks.
    Status s = spawner_->SignalGroup(it->second.pid, sig).WithContext("agent " + agent + ": srun");
    return result.ok() ? s : result;
  }

  std::vector<AgentProcessExit> PollExits() override {
    std::vector<AgentProcessExit> out;
    for (const auto& e : spawner_->ReapExited()) {
      auto owner = owner_.find(e.pid);
      if (owner == owner_.end()) continue;
      AgentProcessExit x;
      x.agent = owner->second;
      x.rank = -1;
      x.pid = e.pid;
      x.exit_code = e.exit_code;
      x.term_signal = e.term_signal;
      auto step = steps_.find(owner->second);
      if (step != steps_.end() && x.success()) x.lost = LostRanks(step->second);
      if (step != steps_.end() && step->second.pid == e.pid) step->second.pid = 0;
      owner_.erase(owner);
      out.push_back(x);
    }
    return out;
  }

 private:
  static std::string StepId(const Step& step) {
    const std::string id = ReadWholeFile(step.log_dir + "/step.id", 256).value_or("");
    return id.substr(0, id.find('\n'));
  }

  std::unique_ptr<ProcessSpawner> spawner_;
  CommandRunner* runner_;
  SrunOptions options_;
  std::map<std::string, Step> steps_;
  std::map<pid_t, std::string> owner_;
};

}  // namespace

std::vector<std::string> BuildSrunArgv(const AgentLaunch& agent, const std::string& program,
                                       const SrunOptions& options) {
  const std::vector<std::string> nodes = Nodes(agent);
  std::string nodelist;
  for (const auto& n : nodes) nodelist += (nodelist.empty() ? "" : ",") + n;
  size_t gpus_per_node = 0;
  for (const auto& r : agent.ranks) gpus_per_node = std::max(gpus_per_node, r.gpus.size());
  std::vector<std::string> argv = {options.srun,
                                   "--exact",
                                   "--kill-on-bad-exit=1",
                                   "--job-name=" + agent.name,
                                   "--nodes=" + std::to_string(nodes.size()),
                                   "--nodelist=" + nodelist,
                                   "--ntasks=" + std::to_string(agent.ranks.size()),
                                   "--cpus-per-task=" + std::to_string(options.cpus_per_rank)};
  // The plan's ranks per node, not SLURM's packing (which may put 3 of 4 ranks on
  // the first node): the planner gives a multi-node agent the same count on each.
  if (nodes.size() > 1) {
    std::map<std::string, size_t> per_node;
    for (const auto& r : agent.ranks) ++per_node[r.node];
    const size_t k = per_node.begin()->second;
    if (std::all_of(per_node.begin(), per_node.end(),
                    [&](const auto& e) { return e.second == k; })) {
      argv.push_back("--ntasks-per-node=" + std::to_string(k));
      argv.push_back("--distribution=block");
    }
  }
  // A step that names no GRES gets all of the job's: a CPU agent says none.
  // Untyped even for an agent with a gpu_type: its nodes (--nodelist) already
  // are of that type, and a step may not ask for a type the allocation did not.
  argv.push_back(gpus_per_node > 0 ? "--gres=gpu:" + std::to_string(gpus_per_node) : "--gres=none");
  const bool mpi = std::find(options.mpi_agents.begin(), options.mpi_agents.end(), agent.name) !=
                   options.mpi_agents.end();
  argv.push_back(mpi ? "--mpi=pmix" : "--mpi=none");
  argv.insert(argv.end(), options.extra_args.begin(), options.extra_args.end());
  // Every task runs the rank wrapper (plan/rank_exec.h): the rank variables
  // from SLURM's, the plan's GPUs of its node, its log, the step id.
  RankExecOptions wrapper;
  wrapper.log_dir = agent.log_dir;
  wrapper.exit_record = true;  // so a failure names its rank, not only srun
  wrapper.step_id_file = agent.log_dir + "/step.id";
  // Other allocations may share a node: each node's first rank leases the
  // agent's block there (the controller's own leases count as the run's).
  wrapper.lease_first = agent.ports_first;
  wrapper.lease_last = agent.ports_last;
  if (!options.trust_slurm_binding && gpus_per_node > 0) {
    for (const auto& node : nodes) {
      for (const auto& r : agent.ranks) {
        if (r.node == node) {
          wrapper.node_gpus.push_back(node + "=" + GpuListString(r.gpus));
          break;
        }
      }
    }
  }
  wrapper.command = agent.command;
  wrapper.command[0] = program;
  const std::vector<std::string> args = RankExecArgs(wrapper);
  argv.insert(argv.end(), options.rank_exec.begin(), options.rank_exec.end());
  argv.insert(argv.end(), args.begin(), args.end());
  return argv;
}

std::vector<std::string> BuildSrunEnvironment(const AgentLaunch& agent, int master_port,
                                              const SrunOptions& options) {
  return BuildRankEnvironment(agent, -1, master_port, options.base_env);
}

std::string MapPlanGpusOntoJob(Plan& plan, const std::string& node,
                               const std::string& slurm_job_gpus) {
  std::vector<int> granted;
  size_t at = 0;
  while (at < slurm_job_gpus.size()) {
    const size_t comma = std::min(slurm_job_gpus.find(',', at), slurm_job_gpus.size());
    if (comma > at) granted.push_back(std::atoi(slurm_job_gpus.substr(at, comma - at).c_str()));
    at = comma + 1;
  }
  std::vector<int> planned;
  for (const AgentPlan& a : plan.agents) {
    for (const Placement& p : a.placement) {
      if (p.node == node) planned.insert(planned.end(), p.gpus.begin(), p.gpus.end());
    }
  }
  std::sort(planned.begin(), planned.end());
  planned.erase(std::unique(planned.begin(), planned.end()), planned.end());
  if (planned.empty()) return "";
  if (granted.size() < planned.size()) {
    return "SLURM gave the job GPUs " + slurm_job_gpus + " on " + node +
           ", fewer than the plan's " + std::to_string(planned.size()) +
           "; keeping the plan's GPU numbers";
  }
  for (AgentPlan& a : plan.agents) {
    for (Placement& p : a.placement) {
      if (p.node != node) continue;
      for (int& g : p.gpus) {
        g = granted[static_cast<size_t>(std::lower_bound(planned.begin(), planned.end(), g) -
                                        planned.begin())];
      }
    }
  }
  return "";
}

std::unique_ptr<LaunchBackend> MakeSrunBackend(std::unique_ptr<ProcessSpawner> spawner,
                                               CommandRunner* runner, SrunOptions options) {
  return std::make_unique<SrunBackend>(std::move(spawner), runner, std::move(options));
}

}  // namespace agentrt::slurm
