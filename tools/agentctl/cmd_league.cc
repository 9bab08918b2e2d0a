// `agentctl league RUN_DIR [--json]` — a run's league and population-based
// training: ratings, the payoff table and the lineage of PBT exploits, from
// RUN_DIR/league/state.json (the league's last commit) and lineage.jsonl.
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "plan/plan.h"
#include "plan/run_dir.h"
#include "scheduler/league.h"
#include "scheduler/league_service.h"
#include "tools/agentctl/commands.h"

namespace agentctl {

void RegisterLeague(CLI::App& app) {
  auto opts = std::make_shared<RunDirOptions>();
  CLI::App* cmd =
      AddRunDirCommand(app, "league", "Show a run's league ratings, payoff table and PBT lineage",
                       *opts, "print {\"state\": state.json, \"lineage\": [lineage.jsonl lines]}");
  cmd->callback([opts] {
    const agentrt::RunDir dir(opts->run_dir);
    auto plan = agentrt::ReadPlanFile(dir.PlanPath());
    if (!plan.ok())
      Fail("league", plan.status().WithContext("is " + opts->run_dir + " a run directory?"));
    if (!plan->league.enabled() && plan->pbt.empty()) {
      Fail("league",
           agentrt::NotFound("run " + plan->run + " has neither league: nor pbt: in its config"));
    }
    std::optional<agentrt::LeagueState> state;
    if (plan->league.enabled()) {
      auto read = agentrt::ReadLeagueState(plan->league, dir.LeagueStatePath());
      if (read.ok()) {
        state = std::move(*read);
      } else if (read.status().code() != agentrt::StatusCode::kNotFound) {
        Fail("league", read.status());
      }
    }
    auto read_lineage = agentrt::ReadLineageFile(dir.LineagePath());
    if (!read_lineage.ok()) Fail("league", read_lineage.status());
    const std::vector<agentrt::LineageRecord>& lineage = *read_lineage;
    if (opts->json) {
      nlohmann::json out = {{"state", state ? state->ToJson() : nlohmann::json()},
                            {"lineage", nlohmann::json::array()}};
      for (const agentrt::LineageRecord& l : lineage) out["lineage"].push_back(l.ToJson());
      std::fputs((out.dump(2) + "\n").c_str(), stdout);
      return;
    }
    if (plan->league.enabled() && !state) std::fputs("league: no result committed yet\n", stdout);
    std::fputs(agentrt::FormatLeague(state ? &*state : nullptr, lineage).c_str(), stdout);
    if (!plan->pbt.empty() && lineage.empty()) std::fputs("pbt: no exploit yet\n", stdout);
  });
}

}  // namespace agentctl
