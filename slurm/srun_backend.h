// SrunBackend: the LaunchBackend used inside a SLURM allocation (the batch
// script of `agentctl run --backend slurm`). Every agent incarnation is one job
// step:
//
//   srun --exact --kill-on-bad-exit=1 --job-name=<agent> --nodes=N --nodelist=<plan nodes>
//        --ntasks=<ranks> --cpus-per-task=C --gres=gpu:G|none --mpi=pmix|none
//        agentrt-exec-rank --log-dir LOG_DIR [--gpus NODE=LIST]... --step-id-file LOG_DIR/step.id
//        -- <command...>
//
// - A restart is a new step (a new srun); other agents' steps keep running.
// - With SrunOptions::node_steps (slurm.steps: node), the first launch of
//   every single-node, non-MPI agent inside the controller's start
//   (BeginBatch .. EndBatch) waits, and then every node's waiting agents
//   start as one step:
//     srun --exact --kill-on-bad-exit=0 --nodes=1 --nodelist=NODE --ntasks=T
//          --multi-prog RUN_DIR/logs/node-steps/NODE.K.conf
//   whose line "i-j agentrt-exec-rank --task-file LOG_DIR/task.json" runs
//   the agent whose ranks are the step's tasks i..j (plan/rank_exec.h: the
//   task file holds its environment, command and ranks). Each agent stays its
//   own failure domain: one that fails ends alone (its wrappers' exit records
//   say so; they are looked at every node_step_poll_s), it is signalled
//   alone (through LOG_DIR/signals, which its wrappers read: SLURM signals
//   only whole steps), and its restart is a step of its own (--overlap: the
//   node step may still hold the CPUs it had). One srun per node instead of
//   one per agent: SLURM's cost per step is paid per node.
// - Signal(SIGKILL): `scancel JOBID.STEPID` of the agent's current step, then
//   SIGKILL to the local srun. Other signals go to the step's tasks through
//   `scancel --signal=SIG JOBID.STEPID` (srun's own forwarding when the step id
//   is not known yet).
// - Rank environment: the agent's Contract() (plan/agent_env.h), composed like
//   the local backend's, passed to srun (which exports it to the tasks); the
//   rank wrapper (plan/rank_exec.h) then sets the rank variables from SLURM's,
//   and sends the rank's output to <log_dir>/rank<RANK>.log. Rank 0 records the
//   step id in <log_dir>/step.id.
// - CUDA_VISIBLE_DEVICES: set explicitly to the plan's GPUs of the rank's node
//   (the wrapper's --gpus overwrites what SLURM's GRES binding set). The controller first
//   maps the plan's GPUs on its node onto the ones SLURM gave the job
//   (SLURM_JOB_GPUS; see RunInAllocation in tools/agentctl/cmd_run.cc), so a run
//   never touches another job's GPUs; `--gres=gpu:G` makes SLURM account for
//   each step's count. The plan is then the single source of truth for *which*
//   GPUs, and the planner has already made them pairwise disjoint. Without
//   ConstrainDevices (the test cluster) SLURM's own per-step choice could
//   overlap another step's plan GPUs, which is why it is not used. On clusters
//   with ConstrainDevices=yes a step sees only the devices SLURM bound to it:
//   there set SrunOptions::trust_slurm_binding to keep SLURM's value.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "plan/plan.h"
#include "scheduler/launch_backend.h"
#include "scheduler/process.h"
#include "slurm/command_runner.h"

namespace agentrt::slurm {

struct SrunOptions {
  std::string srun = "srun";
  std::string scancel = "scancel";
  int cpus_per_rank = 1;                 // srun --cpus-per-task
  std::vector<std::string> mpi_agents;   // agents launched with --mpi=pmix
  bool trust_slurm_binding = false;      // keep SLURM's CUDA_VISIBLE_DEVICES
  std::vector<std::string> search_dirs;  // where to look for a command not in PATH
  std::vector<std::string> base_env;     // default: this process's environ
  std::vector<std::string> extra_args;   // added to every srun (before the command)
  std::vector<std::string> rank_exec = {"agentrt-exec-rank"};  // the rank wrapper's argv prefix
  bool node_steps = false;                                     // slurm.steps: node (see above)
  // The job's nodes: a launch with a rank placed on another fails at once
  // (FailedPrecondition, the agent fails saying why) instead of an srun that
  // cannot start, relaunched until the restart budget is spent. Empty: not checked.
  std::vector<std::string> allocation_nodes;
  double node_step_poll_s = 0.2;  // how often agents of node steps are looked at
};

// The srun argv for one incarnation of `agent` (command resolved to `program`).
std::vector<std::string> BuildSrunArgv(const AgentLaunch& agent, const std::string& program,
                                       const SrunOptions& options);

// The environment passed to srun for `agent` (sorted "NAME=value"): the
// agent-wide contract (the wrapper adds the rank part).
std::vector<std::string> BuildSrunEnvironment(const AgentLaunch& agent, int master_port,
                                              const SrunOptions& options);

// The plan numbers GPUs as if the node were the job's alone; SLURM may have
// given the job others (another job holds 0-2). On `node`, the plan's k-th GPU
// becomes the job's k-th (`slurm_job_gpus`, SLURM_JOB_GPUS), so agents stay
// pairwise disjoint inside the job and never touch another job's GPUs. Other
// nodes keep the plan's numbers. Returns a warning ("" when none) when SLURM
// gave fewer GPUs than the plan uses there (the plan is then left alone).
std::string MapPlanGpusOntoJob(Plan& plan, const std::string& node,
                               const std::string& slurm_job_gpus);

// `runner` runs scancel; it must outlive the backend.
std::unique_ptr<LaunchBackend> MakeSrunBackend(std::unique_ptr<ProcessSpawner> spawner,
                                               CommandRunner* runner, SrunOptions options);

}  // namespace agentrt::slurm
