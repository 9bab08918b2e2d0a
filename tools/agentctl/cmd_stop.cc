// `agentctl stop RUN_DIR [--no-wait] [--timeout-s S]` — ends a run: SIGTERM to
// its controller (RUN_DIR/controller.pid), which asks every agent to stop
// (checkpoint first), waits each agent's grace period, then kills.
#include <signal.h>

#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>

#include <fmt/format.h>

#include "scheduler/run_dir.h"
#include "scheduler/status.h"
#include "tools/agentctl/commands.h"

namespace agentctl {

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
    const pid_t pid = agentrt::LiveControllerPid(opts->run_dir);
    if (pid == 0) {
      auto status = agentrt::ReadRunStatusFile(opts->run_dir + "/status.json");
      if (!status.ok()) Fail("stop", status.status().WithContext("is " + opts->run_dir + " a run directory?"));
      std::fputs(fmt::format("run {} is not running (state {})\n", status->run,
                             agentrt::RunStateName(status->state)).c_str(), stdout);
      return;
    }
    if (::kill(pid, SIGTERM) != 0) {
      Fail("stop", agentrt::ErrnoStatus(errno, fmt::format("cannot signal the controller (pid {})", pid)));
    }
    std::fputs(fmt::format("stop requested (controller pid {})\n", pid).c_str(), stdout);
    if (opts->no_wait) return;
    const auto deadline = std::chrono::steady_clock::now() +
                          std::chrono::milliseconds(static_cast<int64_t>(opts->timeout_s * 1000));
    while (agentrt::LiveControllerPid(opts->run_dir) != 0) {
      if (std::chrono::steady_clock::now() > deadline) {
        Fail("stop", agentrt::DeadlineExceeded(fmt::format(
                         "the run in {} did not end within {} s; it is still stopping (controller pid {})",
                         opts->run_dir, opts->timeout_s, pid)));
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    auto status = agentrt::ReadRunStatusFile(opts->run_dir + "/status.json");
    if (status.ok()) {
      std::fputs(fmt::format("run {} {}\n", status->run, agentrt::RunStateName(status->state)).c_str(),
                 stdout);
    }
  });
}

}  // namespace agentctl
