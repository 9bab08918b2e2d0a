#include "slurm/srun_backend.h"

#include <signal.h>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include "scheduler/local_backend.h"


namespace agentrt::slurm {
namespace {

// Runs as every task of the step: the DESIGN §4 rank variables from SLURM's,
// the plan's GPUs of this node, the rank's log file, then exec of the command.
constexpr const char* kRankWrapper = R"sh(export RANK="$SLURM_PROCID" LOCAL_RANK="$SLURM_LOCALID"
node=$(printf %s "${SLURMD_NODENAME:-}" | tr -c 'A-Za-z0-9_' '_')
if [ -z "${AGENTRT_TRUST_SLURM_GPUS:-}" ]; then
  eval "CUDA_VISIBLE_DEVICES=\${AGENTRT_STEP_GPUS_$node-}"
  export CUDA_VISIBLE_DEVICES
fi
if [ "$SLURM_PROCID" = 0 ]; then
  echo "$SLURM_JOB_ID.$SLURM_STEP_ID" >"$AGENTRT_STEP_LOG_DIR/step.id.tmp" &&
    mv -f "$AGENTRT_STEP_LOG_DIR/step.id.tmp" "$AGENTRT_STEP_LOG_DIR/step.id"
fi
exec "$@" >>"$AGENTRT_STEP_LOG_DIR/rank$RANK.log" 2>&1
)sh";

std::string NodeKey(const std::string& node) {
  std::string key = node;
  for (char& c : key) {
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '_') c = '_';
  }
  return key;
}

std::string JoinInts(const std::vector<int>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? "," : "") + std::to_string(v[i]);
  return s;
}

// Plan nodes in rank order, each once.
std::vector<std::string> Nodes(const AgentLaunch& agent) {
  std::vector<std::string> nodes;
  for (const auto& r : agent.ranks) {
    if (std::find(nodes.begin(), nodes.end(), r.node) == nodes.end()) nodes.push_back(r.node);
  }
  return nodes;
}

std::string EnvValue(const std::vector<std::string>& env, const std::string& name) {
  for (const auto& e : env) {
    if (e.size() > name.size() && e.compare(0, name.size(), name) == 0 && e[name.size()] == '=') {
      return e.substr(name.size() + 1);
    }
  }
  return "";
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
};

class SrunBackend final : public LaunchBackend {
 public:
  SrunBackend(std::unique_ptr<ProcessSpawner> spawner, CommandRunner* runner, SrunOptions options)
      : spawner_(std::move(spawner)), runner_(runner), options_(std::move(options)) {
    if (options_.base_env.empty()) options_.base_env = CurrentEnviron();
    if (options_.search_dirs.empty()) options_.search_dirs = DefaultSearchDirs();
  }

  Result<LaunchedAgent> Launch(const AgentLaunch& agent) override {
    if (agent.ranks.empty()) return InvalidArgument("agent " + agent.name + ": no ranks to launch");
    if (agent.command.empty()) return InvalidArgument("agent " + agent.name + ": empty command");
    if (steps_.count(agent.name) && steps_[agent.name].pid != 0) {
      return FailedPrecondition("agent " + agent.name +
                                " is still running; cannot launch it again");
    }
    std::error_code ec;
    std::filesystem::create_directories(agent.log_dir, ec);
    if (ec)
      return Internal("agent " + agent.name + ": cannot create log dir " + agent.log_dir + ": " +
                      ec.message());
    if (!agent.checkpoint_dir.empty())
      std::filesystem::create_directories(agent.checkpoint_dir, ec);
    std::filesystem::remove(agent.log_dir + "/step.id", ec);

    AGENTRT_ASSIGN_OR_RETURN(const int port, PickFreePort(agent.name, agent.master_port,
                                                          agent.ports_first, agent.ports_last));
    const std::string path_env = EnvValue(options_.base_env, "PATH");
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

    steps_[agent.name] = Step{*pid, agent.log_dir};
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
      if (step != steps_.end() && step->second.pid == e.pid) step->second.pid = 0;
      owner_.erase(owner);
      out.push_back(x);
    }
    return out;
  }

 private:
  static std::string StepId(const Step& step) {
    std::ifstream in(step.log_dir + "/step.id");
    std::string id;
    std::getline(in, id);
    return id;
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
  // A step that names no GRES gets all of the job's: a CPU agent says none.
  argv.push_back(gpus_per_node > 0 ? "--gres=gpu:" + std::to_string(gpus_per_node) : "--gres=none");
  const bool mpi = std::find(options.mpi_agents.begin(), options.mpi_agents.end(), agent.name) !=
                   options.mpi_agents.end();
  argv.push_back(mpi ? "--mpi=pmix" : "--mpi=none");
  argv.insert(argv.end(), options.extra_args.begin(), options.extra_args.end());
  argv.insert(argv.end(), {"/bin/sh", "-c", kRankWrapper, "sh", program});
  argv.insert(argv.end(), agent.command.begin() + 1, agent.command.end());
  return argv;
}

std::vector<std::string> BuildSrunEnvironment(const AgentLaunch& agent, int master_port,
                                              const SrunOptions& options) {
  std::vector<std::string> env = BuildRankEnvironment(agent, -1, master_port, options.base_env);
  std::map<std::string, std::string> extra;
  for (const auto& r : agent.ranks)
    extra["AGENTRT_STEP_GPUS_" + NodeKey(r.node)] = JoinInts(r.gpus);
  extra["AGENTRT_STEP_LOG_DIR"] = agent.log_dir;
  if (options.trust_slurm_binding) extra["AGENTRT_TRUST_SLURM_GPUS"] = "1";
  for (auto& e : env) {
    const std::string name = e.substr(0, e.find('='));
    auto it = extra.find(name);
    if (it == extra.end()) continue;
    e = name + "=" + it->second;
    extra.erase(it);
  }
  for (const auto& [k, v] : extra) env.push_back(k + "=" + v);
  std::sort(env.begin(), env.end());
  return env;
}

std::unique_ptr<LaunchBackend> MakeSrunBackend(std::unique_ptr<ProcessSpawner> spawner,
                                               CommandRunner* runner, SrunOptions options) {
  return std::make_unique<SrunBackend>(std::move(spawner), runner, std::move(options));
}

}  // namespace agentrt::slurm
