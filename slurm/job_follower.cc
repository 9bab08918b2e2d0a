#include "slurm/job_follower.h"

#include <fmt/format.h>

#include <chrono>
#include <thread>

#include "common/file_util.h"
#include "slurm/parse.h"

namespace agentrt::slurm {

Result<std::string> SubmitAllocation(SlurmClient& slurm, const Plan& plan,
                                     const SlurmConfig& config, const RunDir& dir,
                                     const AllocScriptOptions& options) {
  AGENTRT_RETURN_IF_ERROR(WriteRunPlan(plan, dir.path()));
  const std::string script_path = dir.AllocScriptPath();
  AGENTRT_RETURN_IF_ERROR(WriteFileAtomic(script_path, AllocationScript(plan, config, options)));
  AGENTRT_ASSIGN_OR_RETURN(std::string job, slurm.Submit(script_path));
  AGENTRT_RETURN_IF_ERROR(WriteFileAtomic(dir.SlurmJobIdPath(), job + "\n"));
  return job;
}

int FollowJob(SlurmClient& slurm, const std::string& job, const RunDir& dir, const Clock& clock,
              const FollowHooks& hooks) {
  const double t0 = clock.NowSeconds();
  int stops_seen = 0;
  std::string last_state;
  for (;;) {
    if (hooks.wait) {
      hooks.wait();
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(500));
    }
    const int stops = hooks.stop_requests();
    if (stops > stops_seen) {
      CancelOptions cancel;
      if (stops_seen == 0) {
        cancel.signal = "TERM";
        cancel.batch_only = true;
      }
      stops_seen = stops;
      hooks.on_event(fmt::format("agentctl run: stopping job {}", job));
      slurm.Cancel(job, cancel).IgnoreError();  // a job that ended meanwhile
    }
    if (auto status = ReadRunStatusFile(dir.StatusPath()); status.ok())
      hooks.on_status(*status, clock.NowSeconds() - t0);
    auto records = slurm.ShowJob(job);
    if (!records.ok() || records->empty()) {
      if (records.status().code() == StatusCode::kNotFound) return 0;
      continue;  // scontrol did not answer this time
    }
    const JobRecord& r = records->front();
    if (r.state_text != last_state) {
      hooks.on_event(fmt::format("[{:7.1f}s] job {} {}{}", clock.NowSeconds() - t0, job,
                                 r.state_text,
                                 r.restarts > 0 ? fmt::format(" (restart {})", r.restarts) : ""));
      last_state = r.state_text;
    }
    if (IsTerminal(r.state))
      return r.exit_code != 0 ? r.exit_code : (r.exit_signal != 0 ? 128 + r.exit_signal : 0);
  }
}

}  // namespace agentrt::slurm
