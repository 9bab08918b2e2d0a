// What SLURM's commands print, as types. Pure functions over the text, so
// they are unit-tested on captured output and used by SlurmClient on live
// output (slurm-wlm 22.05 formats; later versions print the same keys).
#pragma once

#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace agentrt::slurm {

// A job's (or step's) state, from the names SLURM prints (squeue %T,
// scontrol JobState=, sacct State). "CANCELLED by 0" reads as kCancelled.
enum class JobState {
  kPending,
  kConfiguring,
  kRunning,
  kSuspended,
  kCompleting,
  kCompleted,
  kFailed,
  kCancelled,
  kTimeout,
  kNodeFail,
  kPreempted,
  kOutOfMemory,
  kBootFail,
  kDeadline,
  kRequeued,  // REQUEUED, REQUEUE_FED, REQUEUE_HOLD: going back to pending
  kResizing,
  kRevoked,
  kSpecialExit,
  kStopped,
  kUnknown,
};

JobState ParseJobState(std::string_view text);
std::string_view JobStateName(JobState state);  // "COMPLETED", ...
// True for states a job does not leave by itself (COMPLETED, FAILED, ...).
// kRequeued is not terminal: the job runs again.
bool IsTerminal(JobState state);

// One job from `scontrol show job -o` (an array task is its own job there;
// a pending array whose tasks are not split yet is one record whose
// array_task is a range such as "0-3").
struct JobRecord {
  std::string job_id;        // JobId, e.g. "13"
  std::string array_job_id;  // ArrayJobId, empty when not an array
  std::string array_task;    // ArrayTaskId: "2", or a pending range "0-3"; empty when not an array
  std::string name;          // JobName
  JobState state = JobState::kUnknown;
  std::string state_text;  // JobState as printed
  std::string reason;      // Reason
  int exit_code = 0;       // ExitCode=<code>:<signal>
  int exit_signal = 0;
  int restarts = 0;                           // Restarts (requeues)
  std::string node_list;                      // NodeList, "(null)" while pending → empty
  std::map<std::string, std::string> fields;  // every Key=Value of the line

  // "12_3" for an array task, else the job id: how squeue and sacct name it.
  std::string DisplayId() const;
};

// `scontrol show job -o [ID]`: one line per job. Values may contain spaces
// (WorkDir, Comment); a word without '=' continues the previous value.
// Errors: a line without JobId= (InvalidArgument, names the line number).
Result<std::vector<JobRecord>> ParseScontrolJobs(std::string_view text);

// One step from `squeue -h --steps -o '%i|%j|%N'`.
struct StepRecord {
  std::string step_id;  // "12_1.0", "12.batch", "13.extern"
  std::string job;      // the part before the last '.': "12_1", "12"
  std::string step;     // the part after it: "0", "batch"
  std::string name;
  std::string node_list;
};
// The format string SlurmClient passes to squeue for ParseSqueueSteps.
inline constexpr std::string_view kSqueueStepFormat = "%i|%j|%N";
Result<std::vector<StepRecord>> ParseSqueueSteps(std::string_view text);

// One row of `sacct -n -P -o JobID,JobName,State,ExitCode,NodeList`
// (needs slurmdbd; the test cluster has none, see slurm/testcluster/start.sh).
struct AccountingRecord {
  std::string job_id;  // "12_1", "12_1.batch", "12_1.0"
  std::string name;
  JobState state = JobState::kUnknown;
  int exit_code = 0;
  int exit_signal = 0;
  std::string node_list;
};
inline constexpr std::string_view kSacctFields = "JobID,JobName,State,ExitCode,NodeList";
Result<std::vector<AccountingRecord>> ParseSacct(std::string_view text);

// `sbatch --parsable` prints "<jobid>" or "<jobid>;<cluster>".
Result<std::string> ParseSbatchParsable(std::string_view text);

// "0:15" → {0, 15}. Errors on anything else.
Result<std::pair<int, int>> ParseExitCode(std::string_view text);

}  // namespace agentrt::slurm
