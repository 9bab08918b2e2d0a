// SlurmClient: sbatch, squeue, scontrol, sacct and scancel through a
// CommandRunner, their output parsed into the types of slurm/parse.h.
//
// Errors are Status values whose message carries the command line, its exit
// code and its stderr ("sbatch: error: invalid partition specified: gpu").
// The SLURM commands find their cluster the usual way (SLURM_CONF or
// /etc/slurm/slurm.conf), inherited from this process's environment.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "slurm/command_runner.h"
#include "slurm/parse.h"

namespace agentrt::slurm {

struct SlurmClientOptions {
  double command_timeout_s = 60;  // each command; sbatch may block on a busy slurmctld
  double poll_interval_s = 0.5;   // WaitForJobs between two scontrol calls
};

// Which jobs scancel addresses and how.
struct CancelOptions {
  std::string signal;       // empty: cancel; else e.g. "USR2" (scancel --signal)
  bool batch_only = false;  // --batch: only the batch shell (and not its steps)
  bool full = false;        // --full: the batch shell and every step
};

// Thread-safety: as safe as the CommandRunner (the real one is). Blocking:
// every call runs one or more commands to completion.
class SlurmClient {
 public:
  // `runner` must outlive the client.
  explicit SlurmClient(CommandRunner& runner, SlurmClientOptions options = {});

  // sbatch --parsable [args...] SCRIPT → the job id ("12"; for an array the
  // array's job id). `args` come before the script (e.g. --dependency=...).
  Result<std::string> Submit(const std::string& script_path,
                             const std::vector<std::string>& args = {});

  // scontrol show job -o ID: one record per job, or per array task.
  // An id SLURM no longer knows (older than MinJobAge) is NotFound.
  Result<std::vector<JobRecord>> ShowJob(std::string_view job_id);

  // squeue --steps for one job (its array tasks too): the steps running now.
  Result<std::vector<StepRecord>> Steps(std::string_view job_id);

  // sacct for one job: finished and running jobs and steps. Needs slurmdbd
  // (FailedPrecondition with sacct's message when accounting is disabled).
  Result<std::vector<AccountingRecord>> Accounting(std::string_view job_id);

  // scancel [--signal=S] [--batch] [--full] ID.
  Status Cancel(std::string_view job_id, const CancelOptions& options = {});

  // scontrol show node -o: the text the scheduler's inventory parser reads.
  Result<std::string> ShowNodesText();

  // Polls ShowJob until every record of each job is terminal (an array: every
  // task split out and terminal), or `timeout_s` passes (DeadlineExceeded,
  // naming the jobs still unfinished and their states).
  Result<std::vector<JobRecord>> WaitForJobs(const std::vector<std::string>& job_ids,
                                             double timeout_s);

 private:
  // Runs argv; a non-zero exit becomes an error Status with stderr.
  Result<CommandOutput> RunChecked(const std::vector<std::string>& argv);

  CommandRunner& runner_;
  SlurmClientOptions options_;
};

}  // namespace agentrt::slurm
