// CommandRunner: how the SLURM layer runs sbatch, srun, squeue, scontrol,
// sacct and scancel. A collaborator passed in through constructors, so unit
// tests can hand SlurmClient a fake that replays captured command output.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "common/status.h"

namespace agentrt::slurm {

// What a finished command printed and how it ended.
struct CommandOutput {
  int exit_code = 0;  // the exit status; 128+N when killed by signal N
  std::string out;    // everything it wrote to stdout
  std::string err;    // everything it wrote to stderr
};

// Runs one external program to completion.
//
// Thread-safety: implementations may be called from several threads at once.
// Blocking: Run returns when the program has exited (or was killed at the
// timeout), with all of its output read.
class CommandRunner {
 public:
  virtual ~CommandRunner() = default;

  // Runs argv (argv[0] looked up in PATH) with the caller's environment and
  // stdin from /dev/null. A non-zero exit is NOT an error here: it comes back
  // in CommandOutput. Errors: the program could not be started (NotFound /
  // Internal), or it ran past `timeout_s` and was killed with its whole
  // process group (DeadlineExceeded).
  virtual Result<CommandOutput> Run(const std::vector<std::string>& argv, double timeout_s) = 0;
};

// The real runner: posix_spawn (no copy of the caller's page tables, however
// large the controller has grown) in a new process group, both pipes drained
// with poll(2), SIGKILL to the group at the deadline.
std::unique_ptr<CommandRunner> MakeProcessRunner();

// "sbatch --parsable x.sbatch": argv joined with shell-style quoting where a
// word needs it; for error messages.
std::string FormatCommand(const std::vector<std::string>& argv);

}  // namespace agentrt::slurm
