// The rank wrapper: what mpirun (local MPI agents) and srun (every agent inside
// a SLURM allocation) start in front of each rank of an agent.
//
//   agentrt-exec-rank [--log-dir DIR] [--gpus NODE=0,1]... [--step-id-file FILE]
//                     [--exit-record] [--lease-ports FIRST-LAST] -- /abs/program args...
//   (also reachable as `agentctl exec-rank ...`)
//
// It
//   1. sets PR_SET_PDEATHSIG(SIGKILL): Open MPI puts its children in their own
//      process groups, so this is what makes a rank die with its launcher;
//   2. sets the rank part of the agent contract (RANK, WORLD_SIZE, LOCAL_RANK,
//      LOCAL_WORLD_SIZE) from mpirun's or srun's own variables
//      (RankVariablesFromLauncher in plan/agent_env.h), so every rank sees
//      exactly the agent contract's variables (plan/agent_env.h);
//   3. with --gpus: sets CUDA_VISIBLE_DEVICES to the list given for this node
//      (SLURMD_NODENAME, else the host name): the plan, not SLURM's per-step
//      binding, says which GPUs an agent has;
//   4. with --step-id-file, on rank 0 under srun: writes "JOBID.STEPID" there
//      (atomically), so the controller can scancel exactly this step;
//   5. with --lease-ports (implies --exit-record), on the node's first rank
//      (LOCAL_RANK 0): leases the agent's port block on this node
//      (plan/port_lease.h) for the rank's lifetime, so runs of other
//      allocations sharing the node never get it; a block the run's own
//      controller holds here counts as leased. A block another run holds is an
//      error (exit 2) that names the node and the holder;
//   6. in an MPI step under srun (PMIx's variables set) that it supervises:
//      points Open MPI's shared memory on this node at the step's folder,
//      which the last rank of the step there removes, and on the node's first
//      rank first removes the folders of steps whose ranks were killed
//      (plan/mpi_shm.h; a user's own OMPI_MCA_btl_vader_backing_directory
//      wins);
//   7. sends stdout and stderr to DIR/rank<RANK>.log and execs the program.
//
//   agentrt-exec-rank --sweep-mpi-shm
//
// removes this node's step folders of killed ranks and says how many (for a
// node's clean-up, such as SLURM's Epilog).
//
//   agentrt-exec-rank --task-file FILE
//
// reads every option above, and three more, from FILE (a RankExecOptions
// record): how one agent's ranks run inside a SLURM step shared with other
// agents (a node step: srun --multi-prog, slurm/srun_backend.h):
//   - env: the agent's complete environment, which replaces the inherited one
//     (only the launcher's own SLURM_*, PMI*, PMIX_* and OMPI_* variables stay);
//   - rank_base, world_size: the agent's ranks are the step's tasks rank_base
//     .. rank_base + world_size - 1 (all on this node): RANK = SLURM_PROCID -
//     rank_base, WORLD_SIZE = LOCAL_WORLD_SIZE = world_size;
//   - signal_file: the controller cannot signal one agent of a shared step
//     through SLURM, so it appends signal numbers (one per line) to this file;
//     the wrapper (which then stays the program's parent) looks every 0.1 s
//     and passes each on to the program, in order, the ones written before it
//     started included.
//   With --exit-record it stays the program's parent instead: it passes on
//   every catchable signal it gets (SIGTERM, SIGINT, SIGUSR1/2, SIGHUP,
//   SIGCONT, ...), and when the program ends writes DIR/rank<RANK>.exit
//   (RankExit below) and ends the same way (the same exit code, or the same
//   signal). That is how the supervisor of an mpirun or srun agent learns
//   which rank failed and how ("rank 1 (pid N) was killed by signal 9"),
//   where mpirun alone would only say that it stopped.
//
// Returns only on error, with the exit status to use (126/127 like a shell).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/status.h"

namespace agentrt {

struct RankExecOptions {
  std::string log_dir;
  std::vector<std::string> node_gpus;  // "NODE=0,1" entries; empty: leave CUDA_VISIBLE_DEVICES
  std::string step_id_file;
  bool exit_record = false;  // stay the parent and write DIR/rank<RANK>.exit
  int lease_first = 0;       // the agent's port block to lease on this node (0: none)
  int lease_last = 0;
  std::vector<std::string> command;  // absolute program path and its arguments
  // --task-file only (see above):
  std::vector<std::string> env;  // "NAME=value": the agent's environment; empty: inherited
  int rank_base = -1;            // the agent's first task in the step; -1: SLURM's ranks
  int world_size = 0;            // with rank_base: the agent's ranks
  std::string signal_file;       // signals from the controller, one number per line

  // The --task-file record (plan/records.h's conventions: unknown keys are
  // ignored; a missing command or a bad value is InvalidArgument).
  nlohmann::json ToJson() const;
  static Result<RankExecOptions> FromJson(const nlohmann::json& j);
};

// How one rank ended, as --exit-record writes it: one JSON object
// {"rank", "pid", "exit_code", "signal", "restart_count", "time"} in
// <log_dir>/rank<RANK>.exit.
struct RankExit {
  int rank = 0;
  int64_t pid = 0;
  int exit_code = 0;  // valid when signal == 0
  int signal = 0;     // the signal that killed it, or 0
  int restart_count = 0;
  double time = 0;   // Unix seconds
  std::string node;  // where it ran: SLURMD_NODENAME, else the hostname

  nlohmann::json ToJson() const;
  // A key the object lacks reads as -1 for rank and restart_count (nobody's)
  // and as the member's default for the others; not an object, or a value of
  // the wrong type, is InvalidArgument.
  static Result<RankExit> FromJson(const nlohmann::json& j);
};
std::string RankExitPath(const std::string& log_dir, int rank);
// The records of `log_dir` written by incarnation `restart_count`, by rank.
std::vector<RankExit> ReadRankExits(const std::string& log_dir, int restart_count);
// Removes every record of `log_dir`: before an incarnation starts
// (PrepareLaunch), since an earlier one's may carry the same restart count
// (a requeued allocation counts from 0 again).
void RemoveRankExits(const std::string& log_dir);

// The wrapper's argv (after the program name) for `options`.
std::vector<std::string> RankExecArgs(const RankExecOptions& options);

// This host's network interface that traffic to `addr` (an IPv4 address or a
// resolvable name) leaves by: what NCCL_SOCKET_IFNAME and GLOO_SOCKET_IFNAME
// must name for a rank to reach MASTER_ADDR. No packet is sent.
struct RouteInterface {
  std::string name;
  bool loopback = false;  // IFF_LOOPBACK
};
Result<RouteInterface> InterfaceToward(const std::string& addr);

// What the rank wrapper sets so that NCCL and gloo use `iface` (the one
// InterfaceToward found) and no other: NCCL_SOCKET_IFNAME takes "=name"
// (NCCL's exact match: a plain "eth1" would also match "eth10"), gloo the
// plain name. A loopback interface is refused when the agent's ranks span
// nodes: the other nodes could never reach rank 0 through it.
struct SocketInterfaces {
  std::string nccl;  // NCCL_SOCKET_IFNAME
  std::string gloo;  // GLOO_SOCKET_IFNAME
};
Result<SocketInterfaces> SocketInterfacesFor(const std::string& iface, bool loopback,
                                             bool ranks_span_nodes, const std::string& master_addr);

int ExecRank(const RankExecOptions& options);

// Parses the command line above (argv[0] excluded) and runs ExecRank.
int ExecRankMain(int argc, char** argv);

}  // namespace agentrt
