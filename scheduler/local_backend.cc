#include "scheduler/local_backend.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <map>
#include <set>
#include <thread>

#include "plan/mpi_shm.h"
#include "plan/port_lease.h"
#include "plan/rank_exec.h"
#include "plan/run_dir.h"

namespace agentrt {
namespace {

struct AgentProcs {
  pid_t pgid = 0;
  std::map<pid_t, int> live;  // pid -> rank (-1: mpirun for all ranks)
  std::string mpi_shm_dir;    // this incarnation's Open MPI shared memory (plan/mpi_shm.h)
};

class LocalBackend final : public LaunchBackend {
 public:
  LocalBackend(std::unique_ptr<ProcessSpawner> spawner, LocalBackendOptions options)
      : spawner_(std::move(spawner)), options_(std::move(options)) {
    if (options_.base_env.empty() && options_.inherit_environ) options_.base_env = CurrentEnviron();
    if (options_.search_dirs.empty()) options_.search_dirs = DefaultSearchDirs();
    SweepControllerMpiShmDirs(kMpiShmRoot);
    SweepSharedNodeDirs(kMpiShmRoot, kBusNodeDirPrefix);
  }

  ~LocalBackend() override {
    for (auto& [name, procs] : procs_) RemoveMpiShmDir(procs.mpi_shm_dir);
    // The bus folders of this node that agents killed at the run's end left
    // with no member (those of live runs are locked and stay).
    SweepSharedNodeDirs(kMpiShmRoot, kBusNodeDirPrefix);
  }

  Result<LaunchedAgent> Launch(const AgentLaunch& agent) override {
    AGENTRT_RETURN_IF_ERROR(
        PrepareLaunch(agent, procs_.count(agent.name) > 0 && !procs_[agent.name].live.empty()));

    AGENTRT_ASSIGN_OR_RETURN(const int port, PickFreePort(agent.name, agent.master_port,
                                                          agent.ports_first, agent.ports_last));
    const std::string path_env = EnvLookupOf(options_.base_env)("PATH").value_or("");
    auto program = ResolveExecutable(agent.command[0], path_env, options_.search_dirs);
    if (!program.ok()) return program.status().WithContext("agent " + agent.name);

    LaunchedAgent launched;
    launched.master_port = port;
    AgentProcs procs;
    if (agent.use_mpirun && agent.ranks.size() > 1) {
      auto mpirun = ResolveExecutable(options_.mpirun, path_env, {});
      if (!mpirun.ok()) return mpirun.status().WithContext("agent " + agent.name);
      if (options_.rank_exec.empty()) {
        return FailedPrecondition("agent " + agent.name +
                                  ": no rank wrapper configured for mpirun");
      }
      SpawnRequest req;
      req.argv = {*mpirun,
                  "--oversubscribe",
                  "--allow-run-as-root",
                  "--bind-to",
                  "none",
                  "-np",
                  std::to_string(agent.ranks.size())};
      req.env = BuildRankEnvironment(agent, -1, port, options_.base_env);
      // Open MPI's shared memory in a folder of this incarnation's
      // (plan/mpi_shm.h), unless the user chose one.
      if (!EnvLookupOf(req.env)(kOmpiVaderBackingVar))
        procs.mpi_shm_dir = MakeControllerMpiShmDir(kMpiShmRoot, agent.name, agent.incarnation);
      if (!procs.mpi_shm_dir.empty()) {
        // mpirun hands OMPI_MCA_* settings on to its ranks itself.
        req.env.push_back(std::string(kOmpiVaderBackingVar) + "=" + procs.mpi_shm_dir);
      }
      // mpirun passes on to its ranks only what it is told to (-x): the
      // agent's own env and the contract.
      std::map<std::string, std::string> passed = agent.Contract(-1, port).ToVariables(false);
      passed.insert(agent.env.begin(), agent.env.end());
      for (const auto& [name, value] : passed) req.argv.insert(req.argv.end(), {"-x", name});
      RankExecOptions wrapper;
      wrapper.log_dir = agent.log_dir;
      wrapper.exit_record = true;  // so a failure names its rank, not only mpirun
      wrapper.command = agent.command;
      wrapper.command[0] = *program;
      const std::vector<std::string> wrapper_args = RankExecArgs(wrapper);
      req.argv.insert(req.argv.end(), options_.rank_exec.begin(), options_.rank_exec.end());
      req.argv.insert(req.argv.end(), wrapper_args.begin(), wrapper_args.end());
      req.log_path = agent.log_dir + "/mpirun.log";
      req.workdir = agent.workdir;  // the wrapper enters AGENTRT_WORKDIR too
      auto spawned = spawner_->Spawn(req);
      if (!spawned.ok()) {
        RemoveMpiShmDir(procs.mpi_shm_dir);
        return spawned.status();
      }
      const pid_t pid = *spawned;
      procs.pgid = pid;
      procs.live[pid] = -1;
      for (const auto& r : agent.ranks) launched.ranks.push_back({r.rank, pid, r.node});
    } else {
      for (const auto& r : agent.ranks) {
        SpawnRequest req;
        req.argv = agent.command;
        req.argv[0] = *program;
        req.env = BuildRankEnvironment(agent, r.rank, port, options_.base_env);
        req.log_path = RankLogFile(agent.log_dir, r.rank);
        req.workdir = agent.workdir;
        req.join_group = procs.pgid;
        auto pid = spawner_->Spawn(req);
        if (!pid.ok()) {
          KillAndForget(procs);
          return pid.status().WithContext("agent " + agent.name + " rank " +
                                          std::to_string(r.rank));
        }
        if (procs.pgid == 0) procs.pgid = *pid;
        procs.live[*pid] = r.rank;
        launched.ranks.push_back({r.rank, *pid, r.node});
      }
    }
    launched.process_group = procs.pgid;
    for (const auto& [pid, rank] : procs.live) owner_[pid] = agent.name;
    procs_[agent.name] = std::move(procs);
    return launched;
  }

  Status Signal(const std::string& agent, int sig) override {
    auto it = procs_.find(agent);
    if (it == procs_.end() || it->second.live.empty()) return Status::Ok();
    return spawner_->SignalGroup(it->second.pgid, sig).WithContext("agent " + agent);
  }

  std::vector<AgentProcessExit> PollExits() override {
    std::vector<AgentProcessExit> out;
    std::swap(out, pending_);
    for (const auto& e : spawner_->ReapExited()) Route(e, &out);
    return out;
  }

 private:
  void Route(const ProcessExit& e, std::vector<AgentProcessExit>* out) {
    auto owner = owner_.find(e.pid);
    if (owner == owner_.end()) return;  // a process we already gave up on
    auto& procs = procs_[owner->second];
    AgentProcessExit x;
    x.agent = owner->second;
    x.rank = procs.live.count(e.pid) ? procs.live[e.pid] : -1;
    x.pid = e.pid;
    x.exit_code = e.exit_code;
    x.term_signal = e.term_signal;
    procs.live.erase(e.pid);
    if (procs.live.empty()) RemoveMpiShmDir(procs.mpi_shm_dir);  // the incarnation is over
    owner_.erase(owner);
    out->push_back(x);
  }

  // After a failed launch: SIGKILL what was started and wait (bounded) until it is
  // reaped, so the caller sees no process of the failed incarnation.
  void KillAndForget(const AgentProcs& procs) {
    if (procs.pgid == 0) return;
    spawner_->SignalGroup(procs.pgid, SIGKILL).IgnoreError();  // gone already is fine
    std::set<pid_t> waiting;
    for (const auto& [pid, rank] : procs.live) waiting.insert(pid);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while (!waiting.empty() && std::chrono::steady_clock::now() < deadline) {
      for (const auto& e : spawner_->ReapExited()) {
        if (waiting.erase(e.pid) == 0) Route(e, &pending_);
      }
      if (!waiting.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  }

  std::unique_ptr<ProcessSpawner> spawner_;
  LocalBackendOptions options_;
  std::map<std::string, AgentProcs> procs_;
  std::map<pid_t, std::string> owner_;
  std::vector<AgentProcessExit> pending_;
};

}  // namespace

std::unique_ptr<LaunchBackend> MakeLocalBackend(std::unique_ptr<ProcessSpawner> spawner,
                                                LocalBackendOptions options) {
  return std::make_unique<LocalBackend>(std::move(spawner), std::move(options));
}

}  // namespace agentrt
