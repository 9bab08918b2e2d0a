// `agentctl array-task`: what runs as each rank of a job-array task (see
// slurm/sbatch_writer.h). It finds the agent in RUN_DIR/plan.json, fills the
// agent process contract (AgentEnv, plan/agent_env.h) from the plan and from
// what SLURM set for this rank, then execs the agent's command.
//
// From the plan: AGENTRT_AGENT(_INDEX), MASTER_PORT, AGENTRT_PORTS,
// AGENTRT_CKPT_DIR, the agent's env, its command. From SLURM: RANK
// (SLURM_PROCID), WORLD_SIZE (SLURM_NTASKS), LOCAL_RANK (SLURM_LOCALID),
// LOCAL_WORLD_SIZE (SLURM_TASKS_PER_NODE at SLURM_NODEID), MASTER_ADDR (first
// host of SLURM_JOB_NODELIST), CUDA_VISIBLE_DEVICES (as SLURM's GRES binding
// set it; empty for a CPU agent), AGENTRT_RESTART_COUNT (SLURM_RESTART_COUNT).
// From the run directory: AGENTRT_BUS (bus.address), AGENTRT_TOKEN_FILE
// (secrets/<agent>.token), AGENTRT_WORKDIR (the plan's workdir, by default
// agents/<agent>: created, and the command runs in it). There is no run controller in array mode,
// so AGENTRT_TELEMETRY is not set.
#pragma once

#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"
#include "plan/agent_env.h"
#include "plan/plan.h"

namespace agentrt::slurm {

// The variables to set for this rank (added to or replacing the inherited
// environment). `bus_address` is the content of RUN_DIR/bus.address,
// `bus_ca_file` the CA its clients trust ("" = plaintext; BusConfig::ClientCaFile).
// Errors name the missing or malformed SLURM variable, or a task count that
// differs from the plan's ranks.
Result<std::map<std::string, std::string>> ArrayTaskEnvironment(const AgentPlan& agent,
                                                                const std::string& run_dir,
                                                                const std::string& bus_address,
                                                                const std::string& bus_ca_file,
                                                                const EnvLookup& env);

// What one rank of an array task execs, made ready: the complete
// environment, composed as every launcher composes a rank's
// (ComposeEnvironment: `base_env` without inherited launch variables, the
// agent's env, then the contract), except that the PMIx / Open MPI wiring srun
// gave this very process stays (an MPI agent's MPI_Init needs it), and so do
// NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME as the task got them; PATH has
// the directory of `self_path` (where agentctl and agent-worker live) first.
struct ArrayTaskLaunch {
  std::vector<std::string> env;   // "NAME=value"
  std::vector<std::string> argv;  // the agent's command
  std::string workdir;            // created; the command runs in it
  std::string incarnation;        // in the checkpoint fence
};

// Reads the plan and bus address from `run_dir` and prepares the launch. Like
// every launcher it fences the checkpoint directory for this incarnation
// (plan/fence.h): "slurm-<SLURM_JOB_ID>.<SLURM_RESTART_COUNT>", which every
// rank of the task computes alike and writes before its agent starts, so a
// rank of an earlier run of the task (requeued while cut off) cannot commit.
Result<ArrayTaskLaunch> PrepareArrayTask(const std::string& run_dir, const std::string& agent_name,
                                         const std::string& self_path, const EnvLookup& env,
                                         const std::vector<std::string>& base_env);

// PrepareArrayTask with this process's environment, then execs the agent's
// command (argv[0] looked up in PATH) in its working directory. Returns only
// on error.
Status ExecArrayTask(const std::string& run_dir, const std::string& agent_name,
                     const std::string& self_path);

}  // namespace agentrt::slurm
