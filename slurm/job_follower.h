// Submitting an allocation and following its job to the end: what `agentctl
// run --backend slurm` (and `agentctl check` on SLURM) does once the plan is
// made. Through a SlurmClient, so tests drive it with a CommandRunner that
// replays SLURM's output.
//
// Blocking: FollowJob returns when the job has ended.
#pragma once

#include <functional>
#include <string>

#include "common/clock.h"
#include "common/status.h"
#include "plan/plan.h"
#include "plan/run_dir.h"
#include "scheduler/status.h"
#include "slurm/alloc_script.h"
#include "slurm/slurm_client.h"

namespace agentrt::slurm {

// Writes plan.json and RUN_DIR/alloc.sbatch, submits the script and records
// the job id in RUN_DIR/slurm.job_id. The job id.
Result<std::string> SubmitAllocation(SlurmClient& slurm, const Plan& plan,
                                     const SlurmConfig& config, const RunDir& dir,
                                     const AllocScriptOptions& options);

// What following a job reports, and how it learns of stop requests.
struct FollowHooks {
  // Stop requests (Ctrl-C) so far: the first sends SIGTERM to the batch
  // shell (its controller stops every agent, which checkpoint), a later one
  // cancels the job.
  std::function<int()> stop_requests = [] { return 0; };
  // RUN_DIR/status.json at each poll, and the seconds since following began.
  std::function<void(const RunStatus&, double)> on_status = [](const RunStatus&, double) {};
  // "[   12.5s] job 42 RUNNING", "agentctl run: stopping job 42".
  std::function<void(const std::string&)> on_event = [](const std::string&) {};
  // Between polls (the real one sleeps half a second).
  std::function<void()> wait;
};

// Follows `job` until SLURM says it ended, or no longer knows it. Its exit
// code: the job's, 128+N when a signal N ended it, 0 when SLURM forgot it.
int FollowJob(SlurmClient& slurm, const std::string& job, const RunDir& dir, const Clock& clock,
              const FollowHooks& hooks);

}  // namespace agentrt::slurm
