// `agentctl status RUN_DIR [--json]` — the state of a run from its status.json,
// while it runs and after it has ended.
#include <fmt/format.h>

#include <cstdio>
#include <memory>
#include <string>

#include "plan/plan.h"
#include "plan/run_dir.h"
#include "scheduler/league.h"
#include "scheduler/league_service.h"
#include "scheduler/status.h"
#include "tools/agentctl/commands.h"

namespace agentctl {

void RegisterStatus(CLI::App& app) {
  auto opts = std::make_shared<RunDirOptions>();
  CLI::App* cmd = AddRunDirCommand(app, "status", "Show the state of a run (running or finished)",
                                   *opts, "print status.json (shape: see scheduler/status.h)");
  cmd->callback([opts] {
    auto status = agentrt::ReadRunStatusFile(agentrt::RunDir(opts->run_dir).StatusPath());
    if (!status.ok()) {
      Fail("status", status.status().WithContext("is " + opts->run_dir + " a run directory?"));
    }
    // A run whose controller died (kill -9, power loss) still says "running"
    // in its last record; the controller's lock (plan/run_dir.h) says the truth.
    const bool alive = agentrt::ControllerRunning(opts->run_dir);
    const bool orphaned = status->state == agentrt::RunState::kRunning && !alive;
    if (opts->json) {
      // "state" is what the run is now ("controller_gone"); "recorded_state"
      // what its last record says.
      auto j = agentrt::RunStatusToJson(*status);
      j["state"] = agentrt::ShownRunState(*status, alive);
      j["recorded_state"] = agentrt::RunStateName(status->state);
      j["controller_alive"] = alive;
      std::fputs((j.dump(2) + "\n").c_str(), stdout);
    } else {
      const std::string state = orphaned ? "controller gone (its last record says running)"
                                         : std::string(agentrt::RunStateName(status->state));
      std::fputs(fmt::format("run {}: {} ({})\n", status->run, state, opts->run_dir).c_str(),
                 stdout);
      std::fputs(agentrt::RenderStatusTable(*status, 0).c_str(), stdout);
      const agentrt::RunDir dir(opts->run_dir);
      // The run's broker process: named while the run's controller runs (it
      // ends with it); its restarts, if any, after.
      if (status->bus &&
          (status->bus->broker_restarts > 0 || (alive && status->bus->broker_pid > 0))) {
        const agentrt::BusSnapshot& bus = *status->bus;
        const std::string broker = !alive               ? std::string("ended with the run")
                                   : bus.broker_pid > 0 ? fmt::format("pid {}", bus.broker_pid)
                                                        : std::string("starting again");
        std::fputs(fmt::format("bus: broker {}, restarted {} time(s) (its log: {})\n", broker,
                               bus.broker_restarts, dir.BusProcessLogPath())
                       .c_str(),
                   stdout);
      }
      // League ratings and the newest PBT exploits (`agentctl league` shows all).
      if (auto plan = agentrt::ReadPlanFile(dir.PlanPath()); plan.ok()) {
        if (plan->league.enabled()) {
          auto league = agentrt::ReadLeagueState(plan->league, dir.LeagueStatePath());
          if (league.ok()) {
            std::fputs(fmt::format("league ({} results): {}\n", league->results_applied(),
                                   agentrt::FormatRatingsLine(*league))
                           .c_str(),
                       stdout);
          }
        }
        auto read_lineage = agentrt::ReadLineageFile(dir.LineagePath());
        if (!read_lineage.ok()) {
          std::fputs(("pbt: " + read_lineage.status().message() + "\n").c_str(), stdout);
          read_lineage = std::vector<agentrt::LineageRecord>{};
        }
        const std::vector<agentrt::LineageRecord>& lineage = *read_lineage;
        for (size_t i = lineage.size() > 3 ? lineage.size() - 3 : 0; i < lineage.size(); ++i)
          std::fputs(("pbt: " + agentrt::FormatLineageLine(lineage[i]) + "\n").c_str(), stdout);
        if (!lineage.empty())
          std::fputs(fmt::format("pbt: {} exploit(s) in all: agentctl league {}\n", lineage.size(),
                                 opts->run_dir)
                         .c_str(),
                     stdout);
      }
    }
    if (orphaned) {
      std::fputs(
          fmt::format(
              "agentctl status: the controller (pid {}) of this run is gone: the run did not "
              "end cleanly and the state above is its last record; `agentctl resume {}` "
              "continues it\n",
              status->controller_pid, opts->run_dir)
              .c_str(),
          stderr);
      Exit(kExitControllerGone);
    }
  });
}

}  // namespace agentctl
