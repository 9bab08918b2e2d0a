// LaunchBackend: how the run controller starts, signals and watches the ranks
// of an agent. The local backend (scheduler/local_backend.h) forks them on this
// machine; a SLURM backend runs them as srun steps. The controller never knows
// which one it talks to.
//
// Thread-safety: a backend is driven by one thread (the controller's loop).
// Spawning must happen on a thread that lives as long as the run: Linux's
// PR_SET_PDEATHSIG fires when the *thread* that forked a child exits.
#pragma once

#include <sys/types.h>

#include <map>
#include <string>
#include <vector>

#include "common/status.h"
#include "plan/agent_env.h"

namespace agentrt {

// One rank of an agent as the plan places it.
struct RankLaunch {
  int rank = 0;
  int local_rank = 0;
  int local_world_size = 1;
  std::string node;
  std::vector<int> gpus;  // this agent's GPUs on `node` (empty: a CPU rank)
};

// Everything needed to start one incarnation of an agent group. Built from the
// plan (LaunchesFromPlan in scheduler/run_driver.h); the backend adds nothing
// but what the agent contract (plan/agent_env.h) names, through Contract().
struct AgentLaunch {
  std::string name;
  int index = 0;
  std::vector<RankLaunch> ranks;           // ranks 0..n-1, in order
  std::vector<std::string> command;        // argv of every rank
  std::map<std::string, std::string> env;  // the agent's own env: from agents.yaml
  std::string master_addr = "127.0.0.1";
  int master_port = 0;  // preferred rendezvous port (inside the block)
  int ports_first = 0;  // the agent's port block, inclusive
  int ports_last = 0;
  std::string run_dir;
  std::string checkpoint_dir;
  std::string log_dir;      // rank N logs to <log_dir>/rank<N>.log
  std::string bus_address;  // host:port
  std::string token_file;
  std::string bus_ca_file;  // "" = a plaintext bus (BusConfig::ClientCaFile)
  std::string telemetry_endpoint;
  std::string workdir;  // the ranks' working directory ("" = inherit)
  int restart_count = 0;
  // This launch's id (set by the controller, unique per launch). PrepareLaunch
  // writes it to <checkpoint_dir>/FENCE, where the ranks find it at start:
  // only ranks of this incarnation may commit checkpoints, so one cut off by a network partition
  // and still running cannot write beside its successor (agent_runtime/checkpointer.h).
  std::string incarnation;
  bool use_mpirun = false;  // one `mpirun` for all ranks (LaunchesThroughMpi)
  // SLURM: its step may overlap others (srun --overlap). Set for every
  // relaunch once the allocation has lost a node (FailoverService):
  // slurmctld still counts the CPUs and GPUs of steps that started before the
  // job shrank ("dealloc count underflow"), and a new step on the healthy
  // nodes would wait for them forever.
  bool overlap_steps = false;
  // restart.elastic: the ranks planned when the agent runs shrunk (fewer
  // `ranks` than planned after a node failed); 0: as planned.
  int planned_ranks = 0;
  // The launcher's own CUDA_VISIBLE_DEVICES on a local run (nullopt: unset,
  // or the ranks' wrapper sets theirs): the plan's GPU ids index it.
  std::optional<std::string> launcher_visible_devices;

  // The agent contract (plan/agent_env.h) of `rank`, rendezvous on
  // `rendezvous_port`. With rank < 0: the agent-wide part, for a launcher whose
  // rank wrapper fills in the rank (mpirun, srun); CUDA_VISIBLE_DEVICES is then
  // that of rank 0's node (the wrapper sets each node's own).
  AgentEnv Contract(int rank, int rendezvous_port) const;
};

// What every backend does before starting an incarnation: refuses an agent
// with no ranks or no command, one that is `still_running`, or one whose
// GPUs the launcher cannot see (launcher_visible_devices), creates its
// log, checkpoint and working directories, removes the rank exit records of
// earlier incarnations (RemoveRankExits), and fences the checkpoint
// directory for this incarnation (FENCE). Errors name the agent.
Status PrepareLaunch(const AgentLaunch& agent, bool still_running);

struct LaunchedRank {
  int rank = 0;
  pid_t pid = 0;  // for an mpirun agent: mpirun's pid until the rank says hello
  std::string node;
};

// What a successful launch returns: the group to signal and who runs each rank.
struct LaunchedAgent {
  pid_t process_group = 0;
  int master_port = 0;  // the port actually used (probed free inside the block)
  std::vector<LaunchedRank> ranks;
};

// A process of an agent that has ended. `rank` is -1 when the process stood for
// all ranks (mpirun). exit_code is valid when term_signal == 0.
struct AgentProcessExit {
  std::string agent;
  int rank = -1;
  pid_t pid = 0;
  int exit_code = 0;
  int term_signal = 0;
  // Not empty when the launcher exited 0 but ranks did not end cleanly (srun
  // after a node failure): what happened to them. Such an exit is a failure.
  std::string lost;

  bool success() const { return term_signal == 0 && exit_code == 0 && lost.empty(); }
  // "exited with code 3" / "was killed by SIGKILL (signal 9)" / "exited with
  // code 0 but lost rank 2: ...".
  std::string Describe() const;
};

class LaunchBackend {
 public:
  virtual ~LaunchBackend() = default;

  // Starts every rank of `agent`. On error nothing of this agent is left running.
  virtual Result<LaunchedAgent> Launch(const AgentLaunch& agent) = 0;

  // Sends `sig` to every process of the agent's current incarnation (its process
  // group). Signalling an agent with nothing running is not an error.
  virtual Status Signal(const std::string& agent, int sig) = 0;

  // Non-blocking: the agent processes that ended since the last call. An agent is
  // fully down when every process returned by Launch has been reported here.
  virtual std::vector<AgentProcessExit> PollExits() = 0;

  // The launches between BeginBatch() and EndBatch() may be started together
  // (the SLURM backend's node steps: slurm/srun_backend.h); such an agent's
  // ranks have pid 0 until its processes tell theirs. EndBatch() starts what
  // is still waiting; a start that fails there comes back from PollExits().
  virtual void BeginBatch() {}
  virtual void EndBatch() {}
};

// The complete environment of rank `rank` of `agent` ("NAME=value", sorted),
// using `master_port`: ComposeEnvironment (plan/agent_env.h) of `base_env`,
// the agent's env and its Contract(). With rank < 0: the environment of the
// agent's mpirun (no rank variables; the wrapper sets them). Every launch
// backend builds a rank's environment with it.
std::vector<std::string> BuildRankEnvironment(const AgentLaunch& agent, int rank, int master_port,
                                              const std::vector<std::string>& base_env);

}  // namespace agentrt
