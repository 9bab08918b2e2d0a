// `agentctl stop RUN_DIR [--no-wait] [--timeout-s S]` — ends a run: SIGTERM to
// its controller, which asks every agent to stop (checkpoint first), waits each
// agent's grace period, then kills. A local run's controller is found through
// RUN_DIR/controller.pid; a SLURM run's (`--backend slurm`, RUN_DIR/slurm.job_id)
// is the allocation's batch shell, reached with `scancel --signal=TERM --batch`
// from any host of the cluster (its pid means nothing on another node).
#include <fmt/format.h>
#include <signal.h>

#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>

#include "common/file_util.h"
#include "plan/run_dir.h"
#include "scheduler/status.h"
#include "slurm/command_runner.h"
#include "slurm/slurm_client.h"
#include "tools/agentctl/commands.h"

namespace agentctl {
namespace {

// The SLURM job of a `--backend slurm` run, or "" for a local run.
std::string SlurmJobOf(const std::string& run_dir) {
  const std::string job =
      agentrt::ReadWholeFile(agentrt::RunDir(run_dir).SlurmJobIdPath(), 256).value_or("");
  return job.substr(0, job.find('\n'));
}

// Asks the allocation's controller to stop (the same SIGTERM a local stop
// sends) and waits for the job to end. Returns false when the job has already
// ended (or SLURM no longer knows it), so the caller reports the last status.
bool StopSlurmRun(const std::string& run_dir, const std::string& job, bool no_wait,
                  double timeout_s) {
  auto runner = agentrt::slurm::MakeProcessRunner();
  agentrt::slurm::SlurmClient client(*runner);
  auto records = client.ShowJob(job);
  if (!records.ok()) return false;
  bool live = false;
  for (const auto& record : *records) live = live || !agentrt::slurm::IsTerminal(record.state);
  if (!live) return false;
  agentrt::Status sent = client.Cancel(job, {.signal = "TERM", .batch_only = true});
  if (!sent.ok())
    Fail("stop", sent.WithContext("cannot signal SLURM job " + job + " of " + run_dir));
  std::fputs(fmt::format("stop requested (SLURM job {})\n", job).c_str(), stdout);
  if (no_wait) return true;
  auto done = client.WaitForJobs({job}, timeout_s);
  if (!done.ok()) Fail("stop", done.status());
  auto status = agentrt::ReadRunStatusFile(agentrt::RunDir(run_dir).StatusPath());
  if (status.ok()) {
    std::fputs(
        fmt::format("run {} {}\n", status->run, agentrt::RunStateName(status->state)).c_str(),
        stdout);
  }
  return true;
}

}  // namespace

void RegisterStop(CLI::App& app) {
  struct Options {
    std::string run_dir;
    bool no_wait = false;
    double timeout_s = 120;
  };
  auto opts = std::make_shared<Options>();
  CLI::App* cmd = app.add_subcommand("stop", "Stop a running run (agents checkpoint, then exit)");
  cmd->add_option("run_dir", opts->run_dir, "the run directory")->required();
  cmd->add_flag("--no-wait", opts->no_wait, "return once the stop is requested");
  cmd->add_option("--timeout-s", opts->timeout_s, "how long to wait for the run to end");
  cmd->callback([opts] {
    if (const std::string job = SlurmJobOf(opts->run_dir);
        !job.empty() && StopSlurmRun(opts->run_dir, job, opts->no_wait, opts->timeout_s)) {
      return;
    }
    const pid_t pid = agentrt::LiveControllerPid(opts->run_dir);
    if (pid == 0) {
      auto status = agentrt::ReadRunStatusFile(agentrt::RunDir(opts->run_dir).StatusPath());
      if (!status.ok())
        Fail("stop", status.status().WithContext("is " + opts->run_dir + " a run directory?"));
      if (status->state == agentrt::RunState::kRunning) {
        // Its last record says running, but nobody holds the controller's lock.
        Fail("stop", agentrt::FailedPrecondition(fmt::format(
                         "the controller (pid {}) of run {} is gone: nothing is left to stop (its "
                         "agents ended with it); `agentctl resume {}` continues the run",
                         status->controller_pid, status->run, opts->run_dir)));
      }
      std::fputs(fmt::format("run {} is not running (state {})\n", status->run,
                             agentrt::RunStateName(status->state))
                     .c_str(),
                 stdout);
      return;
    }
    if (::kill(pid, SIGTERM) != 0) {
      Fail("stop",
           agentrt::ErrnoStatus(errno, fmt::format("cannot signal the controller (pid {})", pid)));
    }
    std::fputs(fmt::format("stop requested (controller pid {})\n", pid).c_str(), stdout);
    if (opts->no_wait) return;
    const auto deadline = std::chrono::steady_clock::now() +
                          std::chrono::milliseconds(static_cast<int64_t>(opts->timeout_s * 1000));
    while (agentrt::LiveControllerPid(opts->run_dir) != 0) {
      if (std::chrono::steady_clock::now() > deadline) {
        Fail("stop",
             agentrt::DeadlineExceeded(fmt::format(
                 "the run in {} did not end within {} s; it is still stopping (controller pid {})",
                 opts->run_dir, opts->timeout_s, pid)));
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    auto status = agentrt::ReadRunStatusFile(agentrt::RunDir(opts->run_dir).StatusPath());
    if (status.ok()) {
      std::fputs(
          fmt::format("run {} {}\n", status->run, agentrt::RunStateName(status->state)).c_str(),
          stdout);
    }
  });
}

}  // namespace agentctl
