// The sbatch script of `agentctl run --backend slurm` (allocation mode): one
// allocation for the whole plan whose batch shell becomes the run controller
// (`agentctl run --backend slurm-steps --run-dir RUN_DIR`), which hosts the bus
// and launches every agent as its own job step (slurm/srun_backend.h).
//
// The script holds no secret: only paths (the run secret and tokens are 0600
// files under RUN_DIR/secrets/).
#pragma once

#include <string>

#include "plan/config.h"
#include "plan/plan.h"

namespace agentrt::slurm {

struct AllocScriptOptions {
  std::string run_dir;        // absolute
  std::string agentctl_path;  // absolute, as seen on the first node
  int cpus_per_rank = 1;
};
// slurm.steps: node adds `--node-steps` to the controller's command line.

// The script text: #SBATCH --nodes / --nodelist (the plan's nodes), --ntasks
// (every rank, plus one for the controller) and --cpus-per-task, --gres=gpu:<largest per-node GPU
// count>,
// --signal=B:USR2@<signal_grace_s>, --requeue, --open-mode=append, output to
// RUN_DIR/slurm-<jobid>.out, partition/account/qos/time/constraint and
// extra_args from `slurm:`; then `exec agentctl run --backend slurm-steps`.
std::string AllocationScript(const Plan& plan, const SlurmConfig& slurm,
                             const AllocScriptOptions& options);

}  // namespace agentrt::slurm
