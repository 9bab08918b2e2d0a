#include "slurm/srun_backend.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
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
  pid_t pid = 0;  // the local srun; 0 when it has exited (a node step: when this agent ended)
  std::string log_dir;
  int ranks = 0;
  int restart_count = 0;
  bool in_node_step = false;  // this incarnation runs in a node step
  double killed_at_s = -1;    // in a node step: when SIGKILL was asked for
  bool cancelled = false;     // its step was scancel'ed (SIGKILL): CancelStep has nothing to do
};

// A node step's ranks are tasks of a step shared with other agents; these
// files of its log directory say how (plan/rank_exec.h's --task-file).
std::string TaskFile(const std::string& log_dir) { return log_dir + "/task.json"; }
std::string SignalFile(const std::string& log_dir) { return log_dir + "/signals"; }

// srun --multi-prog splits its lines at white space: a path with some cannot be in one.
bool HasSpace(const std::string& s) {
  return std::any_of(s.begin(), s.end(),
                     [](char c) { return std::isspace(static_cast<unsigned char>(c)); });
}

double SteadySeconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// How long an agent of a node step may take to leave its exit record after
// SIGKILL before it counts as gone (its node or its wrapper died with it).
constexpr double kNodeStepKillGraceS = 5.0;

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
    path_env_ = EnvLookupOf(options_.base_env)("PATH").value_or("");
  }

  Result<LaunchedAgent> Launch(const AgentLaunch& agent) override {
    AGENTRT_RETURN_IF_ERROR(InAllocation(agent));
    AGENTRT_RETURN_IF_ERROR(
        PrepareLaunch(agent, steps_.count(agent.name) > 0 && steps_[agent.name].pid != 0));
    std::error_code ec;
    std::filesystem::remove(agent.log_dir + "/step.id", ec);
    const bool first_launch = launched_.insert(agent.name).second;
    const bool was_in_node_step = in_node_step_.count(agent.name) > 0;

    AGENTRT_ASSIGN_OR_RETURN(const int port, PickFreePort(agent.name, agent.master_port,
                                                          agent.ports_first, agent.ports_last));
    auto program = ResolveExecutable(agent.command[0], path_env_, options_.search_dirs);
    if (!program.ok()) return program.status().WithContext("agent " + agent.name);
    if (batching_ && first_launch && NodeStepFits(agent)) return Defer(agent, *program, port);
    auto srun = ResolveExecutable(options_.srun, path_env_, {});
    if (!srun.ok()) return srun.status().WithContext("agent " + agent.name + ": srun");

    SpawnRequest req;
    // Its node step may still hold the CPUs it had there: share them.
    AgentLaunch step = agent;
    step.overlap_steps = agent.overlap_steps || was_in_node_step;
    req.argv = BuildSrunArgv(step, *program, options_);
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

  // Every rank of `agent` on a node of the job (SrunOptions::allocation_nodes).
  Status InAllocation(const AgentLaunch& agent) const {
    const auto& held = options_.allocation_nodes;
    if (held.empty()) return Status::Ok();
    for (const auto& r : agent.ranks) {
      if (std::find(held.begin(), held.end(), r.node) != held.end()) continue;
      return FailedPrecondition(fmt::format(
          "agent {}: rank {} is placed on node {}, which this allocation does not hold ({}): no "
          "node of the allocation was free for it after the requeue. Give the job a spare node "
          "(slurm.spare_nodes) or requeue it once {} is back",
          agent.name, r.rank, r.node, fmt::join(held, ","), r.node));
    }
    return Status::Ok();
  }

  Status Signal(const std::string& agent, int sig) override {
    auto it = steps_.find(agent);
    if (it != steps_.end() && it->second.in_node_step)
      return SignalInNodeStep(agent, it->second, sig);
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
      } else if (sig == SIGKILL) {
        it->second.cancelled = true;
      }
      if (sig != SIGKILL) return result;
    }
    // SIGKILL (after scancel), or no step id yet: the local srun, which forwards
    // catchable signals to its tasks.
    Status s = spawner_->SignalGroup(it->second.pid, sig).WithContext("agent " + agent + ": srun");
    return result.ok() ? s : result;
  }

  std::vector<AgentProcessExit> PollExits() override {
    std::vector<AgentProcessExit> out = std::move(failed_starts_);
    failed_starts_.clear();
    for (const auto& e : spawner_->ReapExited()) {
      if (auto node_step = node_steps_.find(e.pid); node_step != node_steps_.end()) {
        // Every agent of it still running ended with it.
        for (const std::string& name : node_step->second) {
          Step& step = steps_[name];
          if (step.pid == e.pid)
            out.push_back(EndInNodeStep(name, step, e.exit_code, e.term_signal));
        }
        node_steps_.erase(node_step);
        continue;
      }
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
      if (step != steps_.end() && x.term_signal != 0) CancelStep(step->second);
      if (step != steps_.end() && step->second.pid == e.pid) step->second.pid = 0;
      owner_.erase(owner);
      out.push_back(x);
    }
    PollNodeStepAgents(out);
    return out;
  }

  void BeginBatch() override { batching_ = options_.node_steps; }

  void EndBatch() override {
    batching_ = false;
    for (auto& [node, agents] : deferred_) StartNodeStep(node, agents);
    deferred_.clear();
  }

 private:
  struct Deferred {
    AgentLaunch agent;
    std::string program;
    int port = 0;
  };

  // A first launch that may share its node's step: one node, no MPI (its
  // PMIx wiring is per step), no white space in the paths srun must split.
  bool NodeStepFits(const AgentLaunch& agent) const {
    const bool mpi = std::find(options_.mpi_agents.begin(), options_.mpi_agents.end(),
                               agent.name) != options_.mpi_agents.end();
    if (mpi || Nodes(agent).size() != 1 || HasSpace(agent.log_dir)) return false;
    return std::none_of(options_.rank_exec.begin(), options_.rank_exec.end(), HasSpace);
  }

  LaunchedAgent Defer(const AgentLaunch& agent, const std::string& program, int port) {
    std::error_code ec;
    std::filesystem::remove(SignalFile(agent.log_dir), ec);
    const std::string node = agent.ranks.front().node;
    deferred_[node].push_back({agent, program, port});
    Step& step = steps_[agent.name];
    step = Step{0, agent.log_dir, static_cast<int>(agent.ranks.size()), agent.restart_count};
    step.in_node_step = true;
    in_node_step_.insert(agent.name);
    LaunchedAgent launched;
    launched.process_group = 0;
    launched.master_port = port;
    for (const auto& r : agent.ranks) launched.ranks.push_back({r.rank, 0, r.node});
    return launched;
  }

  // One srun for the deferred agents of `node`: task i of the step runs rank
  // (i - first task of its agent) of its agent, through the rank wrapper and
  // the agent's task file. No --kill-on-bad-exit: an agent that fails leaves
  // the others running.
  void StartNodeStep(const std::string& node, const std::vector<Deferred>& agents) {
    std::string conf;
    int tasks = 0;
    size_t gpus = 0;
    std::string rank_exec;
    for (const std::string& part : options_.rank_exec)
      rank_exec += (rank_exec.empty() ? "" : " ") + part;
    std::vector<std::string> names;
    Status failed = Status::Ok();
    for (const Deferred& d : agents) {
      const AgentLaunch& a = d.agent;
      RankExecOptions task;
      task.log_dir = a.log_dir;
      task.exit_record = true;
      task.lease_first = a.ports_first;
      task.lease_last = a.ports_last;
      size_t agent_gpus = 0;
      for (const auto& r : a.ranks) agent_gpus = std::max(agent_gpus, r.gpus.size());
      gpus += agent_gpus;
      if (!options_.trust_slurm_binding && agent_gpus > 0)
        task.node_gpus.push_back(node + "=" + GpuListString(a.ranks.front().gpus));
      task.command = a.command;
      task.command[0] = d.program;
      task.env = BuildSrunEnvironment(a, d.port, options_);
      task.rank_base = tasks;
      task.world_size = static_cast<int>(a.ranks.size());
      task.signal_file = SignalFile(a.log_dir);
      AtomicWriteOptions mode;
      mode.mode = 0600;  // the agent's environment
      mode.sync_file = false;
      if (Status s = WriteFileAtomic(TaskFile(a.log_dir), task.ToJson().dump(), mode); !s.ok()) {
        failed = s.WithContext("agent " + a.name);
        break;
      }
      conf += fmt::format("{}-{} {} --task-file {}\n", tasks, tasks + task.world_size - 1,
                          rank_exec, TaskFile(a.log_dir));
      tasks += task.world_size;
      names.push_back(a.name);
    }
    const std::string dir =
        std::filesystem::path(agents.front().agent.log_dir).parent_path().string() + "/node-steps";
    const std::string stem = fmt::format("{}/{}.{}", dir, node, ++node_step_count_);
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    if (failed.ok()) failed = WriteFileAtomic(stem + ".conf", conf);
    Result<pid_t> pid =
        failed.ok() ? Result<pid_t>(Internal("not started")) : Result<pid_t>(failed);
    if (failed.ok()) {
      auto srun = ResolveExecutable(options_.srun, path_env_, {});
      SpawnRequest req;
      req.argv = {srun.ok() ? *srun : options_.srun,
                  "--exact",
                  "--kill-on-bad-exit=0",
                  "--job-name=node-step-" + node,
                  "--nodes=1",
                  "--nodelist=" + node,
                  "--ntasks=" + std::to_string(tasks),
                  "--cpus-per-task=" + std::to_string(options_.cpus_per_rank),
                  gpus > 0 ? "--gres=gpu:" + std::to_string(gpus) : "--gres=none",
                  "--mpi=none"};
      req.argv.insert(req.argv.end(), options_.extra_args.begin(), options_.extra_args.end());
      req.argv.insert(req.argv.end(), {"--multi-prog", stem + ".conf"});
      req.env = options_.base_env;
      req.log_path = stem + ".srun.log";
      pid = srun.ok() ? spawner_->Spawn(req) : Result<pid_t>(srun.status());
    }
    for (const Deferred& d : agents) {
      Step& step = steps_[d.agent.name];
      if (pid.ok()) {
        step.pid = *pid;
        continue;
      }
      AgentProcessExit x;
      x.agent = d.agent.name;
      x.rank = -1;
      x.exit_code = 127;
      x.lost = "its node step on " + node + " did not start: " + pid.status().message();
      failed_starts_.push_back(x);
    }
    if (pid.ok()) node_steps_[*pid] = names;
  }

  // The agent of a node step `step` ended: how, from its ranks' exit records
  // (the step's own exit code and signal when it ended first).
  AgentProcessExit EndInNodeStep(const std::string& name, Step& step, int step_code,
                                 int step_signal) {
    AgentProcessExit x;
    x.agent = name;
    x.rank = -1;
    x.pid = 0;
    for (const RankExit& r : ReadRankExits(step.log_dir, step.restart_count)) {
      if (r.signal != 0 || r.exit_code != 0) {
        x.exit_code = r.exit_code;
        x.term_signal = r.signal;
        break;
      }
    }
    if (x.success()) x.lost = LostRanks(step);
    if (!x.lost.empty() && step_signal != 0) x.term_signal = step_signal;
    if (!x.lost.empty() && step_code != 0) x.exit_code = step_code;
    step.pid = 0;
    return x;
  }

  // The agents of running node steps that ended: a rank that failed, or every
  // rank's exit record; one SIGKILLed that left none within the grace.
  void PollNodeStepAgents(std::vector<AgentProcessExit>& out) {
    const double now = SteadySeconds();
    if (now - node_steps_polled_s_ < options_.node_step_poll_s) return;
    node_steps_polled_s_ = now;
    for (auto& [pid, names] : node_steps_) {
      for (const std::string& name : names) {
        Step& step = steps_[name];
        if (step.pid != pid) continue;
        const std::vector<RankExit> exits = ReadRankExits(step.log_dir, step.restart_count);
        const bool failed = std::any_of(exits.begin(), exits.end(), [](const RankExit& r) {
          return r.signal != 0 || r.exit_code != 0;
        });
        const bool killed_long_ago =
            step.killed_at_s >= 0 && now - step.killed_at_s > kNodeStepKillGraceS;
        if (failed || static_cast<int>(exits.size()) >= step.ranks || killed_long_ago) {
          AgentProcessExit x = EndInNodeStep(name, step, 0, killed_long_ago ? SIGKILL : 0);
          if (killed_long_ago && x.success()) x.term_signal = SIGKILL;
          out.push_back(std::move(x));
        }
      }
    }
  }

  // The controller cannot signal one agent of a shared step through SLURM:
  // its rank wrappers read the signal from the agent's signal file.
  Status SignalInNodeStep(const std::string& agent, Step& step, int sig) {
    const std::string path = SignalFile(step.log_dir);
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
    if (fd < 0) return ErrnoStatus(errno, "agent " + agent + ": cannot signal it through " + path);
    const std::string line = std::to_string(sig) + "\n";
    const bool ok = ::write(fd, line.data(), line.size()) == static_cast<ssize_t>(line.size());
    const int err = errno;
    ::close(fd);
    if (!ok) return ErrnoStatus(err, "agent " + agent + ": cannot signal it through " + path);
    if (sig == SIGKILL && step.killed_at_s < 0) step.killed_at_s = SteadySeconds();
    return Status::Ok();
  }

  // An srun killed by a signal (SIGKILL after scancel; the OOM killer or a
  // kill -9 on the batch node) leaves its step running on its nodes with no
  // one to watch it: it is cancelled, so no rank of an incarnation outlives
  // the srun the controller knows it by. (Gone already is fine.)
  void CancelStep(const Step& step) {
    if (step.cancelled) return;
    const std::string id = StepId(step);
    if (id.empty() || runner_ == nullptr) return;
    runner_->Run({options_.scancel, id}, 30).status().IgnoreError();
  }

  static std::string StepId(const Step& step) {
    const std::string id = ReadWholeFile(step.log_dir + "/step.id", 256).value_or("");
    return id.substr(0, id.find('\n'));
  }

  std::unique_ptr<ProcessSpawner> spawner_;
  CommandRunner* runner_;
  SrunOptions options_;
  std::string path_env_;  // PATH of base_env: where programs and srun are looked up
  std::map<std::string, Step> steps_;
  std::map<pid_t, std::string> owner_;
  // Node steps (slurm.steps: node):
  bool batching_ = false;                                  // between BeginBatch and EndBatch
  std::set<std::string> launched_;                         // agents launched before
  std::set<std::string> in_node_step_;                     // agents that ran in a node step
  std::map<std::string, std::vector<Deferred>> deferred_;  // node -> agents waiting for EndBatch
  std::map<pid_t, std::vector<std::string>> node_steps_;   // the local srun -> its agents
  std::vector<AgentProcessExit> failed_starts_;            // node steps that did not start
  int node_step_count_ = 0;
  double node_steps_polled_s_ = -1e9;
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
  if (agent.overlap_steps) argv.push_back("--overlap");
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
