// The local launch backend: every rank of every agent runs on this machine.
//
// - Each agent incarnation is one process group (the first process leads it);
//   Signal() reaches the whole group. Every child has PR_SET_PDEATHSIG(SIGKILL).
// - GPU agents and single-rank agents: one process per rank, spawned directly.
// - Multi-rank CPU agents with an MPI group (AgentLaunch::use_mpirun): ONE
//   `mpirun --oversubscribe --allow-run-as-root -np N -x VAR...` per agent, so
//   each agent is its own MPI world. mpirun starts `rank_exec` (a small wrapper,
//   `agentrt-exec-rank --log-dir DIR -- command...`, see
//   plan/rank_exec.h) in front of the command: it sets RANK / LOCAL_RANK
//   from OMPI_COMM_WORLD_RANK / OMPI_COMM_WORLD_LOCAL_RANK and its own
//   PDEATHSIG, so the ranks see exactly the agent contract's variables and die with
//   mpirun (which Open MPI puts in separate process groups). See plan/rank_exec.h.
// - MASTER_PORT is the first port of the agent's block, starting at the
//   preferred one, that can be bound at launch; never a port outside the block.
// - Environment of a rank: agentctl's own environment without any inherited
//   AGENTRT_* / torchrun / Open MPI rank variables, then the agent's `env:`
//   from agents.yaml, then the agent contract's variables (they win).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "scheduler/launch_backend.h"
#include "scheduler/process.h"

namespace agentrt {

struct LocalBackendOptions {
  std::string mpirun = "mpirun";         // resolved in PATH at launch
  std::vector<std::string> rank_exec;    // wrapper argv prefix for mpirun ranks
  std::vector<std::string> search_dirs;  // where to look for a command not in PATH
  std::vector<std::string> base_env;     // "NAME=value"; default: this process's environ
  bool inherit_environ = true;           // take base_env from environ when it is empty
};

std::unique_ptr<LaunchBackend> MakeLocalBackend(std::unique_ptr<ProcessSpawner> spawner,
                                                LocalBackendOptions options);

}  // namespace agentrt
