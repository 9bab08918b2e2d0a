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
// environment). `bus_address` is the content of RUN_DIR/bus.address.
// Errors name the missing or malformed SLURM variable, or a task count that
// differs from the plan's ranks.
Result<std::map<std::string, std::string>> ArrayTaskEnvironment(const Plan& plan,
                                                                const AgentPlan& agent,
                                                                const std::string& run_dir,
                                                                const std::string& bus_address,
                                                                const EnvLookup& env);

// Reads the plan and bus address from `run_dir`, sets the environment, and
// execs the agent's command (argv[0] looked up in PATH, with the directory of
// `self_path` — where agentctl and agent-worker live — put first). Returns
// only on error.
Status ExecArrayTask(const std::string& run_dir, const std::string& agent_name,
                     const std::string& self_path);

}  // namespace agentrt::slurm
