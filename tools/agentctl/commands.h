// agentctl subcommands. Each lives in its own cmd_<name>.cc, which defines
// `void agentctl::Register<Name>(CLI::App& app)`: it adds a subcommand to `app`
// and sets a callback that does the work.
//
// Adding a subcommand is one line here — X(Name) — plus the new cmd_<name>.cc
// (tools/agentctl/CMakeLists.txt globs *.cc). Callbacks report failure with
// agentctl::Exit(code) or agentctl::Fail(status) (below); never call exit().
#pragma once

#include <CLI/CLI.hpp>
#include <string>
#include <string_view>

#include "common/status.h"
#include "scheduler/loader.h"
#include "scheduler/run_driver.h"

#define AGENTCTL_COMMANDS(X) \
  X(Validate)                \
  X(Plan)                    \
  X(Sbatch)                  \
  X(ArrayTask)               \
  X(Run)                     \
  X(Resume)                  \
  X(Status)                  \
  X(Logs)                    \
  X(Stop)                    \
  X(Check)                   \
  X(Dashboard)               \
  X(Export)                  \
  X(League)

namespace agentctl {

#define AGENTCTL_DECLARE_REGISTER(name) void Register##name(CLI::App& app);
AGENTCTL_COMMANDS(AGENTCTL_DECLARE_REGISTER)
#undef AGENTCTL_DECLARE_REGISTER

// Exit codes shared by every subcommand.
inline constexpr int kExitError = 1;           // bad input, I/O error, ...
inline constexpr int kExitInfeasible = 2;      // the plan cannot be made on this cluster
inline constexpr int kExitControllerGone = 3;  // status: the run's controller died mid-run

// What a subcommand that reads one run directory and can print JSON takes.
struct RunDirOptions {
  std::string run_dir;
  bool json = false;
};

// Adds `name` to `app` with a required RUN_DIR and `--json` (printing `json_doc`),
// both read into `opts`; the caller sets the callback.
inline CLI::App* AddRunDirCommand(CLI::App& app, const std::string& name, const std::string& about,
                                  RunDirOptions& opts, const std::string& json_doc) {
  CLI::App* cmd = app.add_subcommand(name, about);
  cmd->add_option("run_dir", opts.run_dir, "the run directory (printed by `agentctl run`)")
      ->required();
  cmd->add_flag("--json", opts.json, json_doc);
  return cmd;
}

// Ends the running subcommand with `code` (main returns it).
[[noreturn]] inline void Exit(int code) { throw CLI::RuntimeError(code); }

// How every subcommand loads agents.yaml: the overrides, and agent-worker's
// own check of its agents' `args` (so a typo there fails at file:line:col).
agentrt::LoadOptions ConfigLoadOptions(const std::vector<std::string>& overrides);

// A local run's set-up (PrepareRun on this machine or --cluster), failing the
// command with the planner's error (exit 2 when infeasible).
agentrt::PreparedRun PrepareLocal(agentrt::Config& config, const std::string& file,
                                  const std::string& cluster, std::string_view command);
// Drives a prepared local run to its end on this terminal (the local backend).
int DriveLocal(agentrt::PreparedRun prepared, bool quiet);
// A run planned on the live SLURM cluster (nothing submitted yet), failing the
// command with the planner's error.
agentrt::PreparedRun PrepareOnSlurm(agentrt::Config& config, const std::string& file,
                                    const std::string& cluster, std::string_view command);
// Writes plan.json and the allocation script of `prepared`, submits it and
// follows it to its end; the job's exit code.
int SubmitAndFollow(const agentrt::PreparedRun& prepared, const agentrt::SlurmConfig& slurm_config,
                    bool quiet);

// `agentctl check` (cmd_check.cc): 0 when every agent passed, 1 otherwise.
struct CheckOptions {
  std::string file;
  std::string cluster;
  std::string backend = "local";  // or "slurm": the check as one allocation, every agent a step
  bool strict = false;
  bool json = false;
};
int Check(agentrt::Config& config, const CheckOptions& options, std::string_view command);

// MakePlan of `config` on `inventory`, or Fail with exit code kExitInfeasible
// naming the inventory and why.
agentrt::Plan PlanOrFail(std::string_view command, const agentrt::Config& config,
                         const agentrt::Inventory& inventory, const std::string& run_dir);

// Prints "agentctl <command>: <message>" to stderr and exits with `code`.
[[noreturn]] void Fail(std::string_view command, const agentrt::Status& status,
                       int code = kExitError);

}  // namespace agentctl
