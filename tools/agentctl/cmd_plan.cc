// `agentctl plan FILE [--cluster inventory.yaml] [--json]` — the partition plan;
// no side effects.
#include <fmt/format.h>

#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "scheduler/inventory.h"
#include "scheduler/loader.h"
#include "scheduler/planner.h"
#include "slurm/command_runner.h"
#include "slurm/slurm_client.h"
#include "tools/agentctl/commands.h"

namespace agentctl {

void RegisterPlan(CLI::App& app) {
  struct Options {
    std::string file;
    std::string cluster;
    std::string scontrol;
    std::string run_dir;
    std::vector<std::string> overrides;
    bool json = false;
  };
  auto opts = std::make_shared<Options>();
  CLI::App* cmd = app.add_subcommand(
      "plan",
      "Show which node, GPUs, ranks and ports every agent gets (exit 2 when it cannot be placed)");
  cmd->add_option("file", opts->file, "agents.yaml")->required();
  cmd->add_option(
      "--cluster", opts->cluster,
      "inventory YAML with a cluster: block (overrides the config's; default: the config's "
      "cluster, else this machine)");
  cmd->add_option("--scontrol", opts->scontrol,
                  "plan on SLURM's nodes: a file holding `scontrol show node -o` output, or '-' "
                  "to run scontrol now (usable nodes of slurm.partition only)")
      ->excludes("--cluster");
  cmd->add_option("--run-dir", opts->run_dir,
                  "plan for this run directory (recorded as run_dir; paths are relative to it)");
  cmd->add_option("--set", opts->overrides, "override a setting: key.path=value (repeatable)");
  cmd->add_flag("--json", opts->json, "print the plan as JSON");
  cmd->callback([opts] {
    const agentrt::LoadOptions load = ConfigLoadOptions(opts->overrides);
    agentrt::Result<agentrt::Config> config = agentrt::LoadConfigFile(opts->file, load);
    if (!config.ok()) Fail("plan", config.status());
    agentrt::InventoryRequest request;
    request.config_file = opts->file;
    request.cluster_file = opts->cluster;
    request.scontrol = opts->scontrol;
    auto runner = agentrt::slurm::MakeProcessRunner();
    agentrt::slurm::SlurmClient slurm(*runner);
    agentrt::Result<agentrt::Inventory> inventory =
        agentrt::ResolveInventory(*config, request, [&slurm] { return slurm.ShowNodesText(); });
    if (!inventory.ok()) Fail("plan", inventory.status());
    const agentrt::Plan plan = PlanOrFail("plan", *config, *inventory, opts->run_dir);
    if (opts->json) {
      // The table shows warnings itself; with --json they go to stderr too so a pipe still sees
      // them.
      for (const std::string& w : plan.warnings)
        std::fputs(fmt::format("agentctl plan: warning: {}\n", w).c_str(), stderr);
      std::fputs((agentrt::PlanToJsonString(plan) + "\n").c_str(), stdout);
    } else {
      std::fputs(
          fmt::format("inventory: {} ({} nodes)\n", inventory->source, inventory->nodes.size())
              .c_str(),
          stdout);
      std::fputs(agentrt::PlanToTable(plan).c_str(), stdout);
    }
  });
}

agentrt::Plan PlanOrFail(std::string_view command, const agentrt::Config& config,
                         const agentrt::Inventory& inventory, const std::string& run_dir) {
  agentrt::PlanOptions options;
  options.run_dir = run_dir;
  agentrt::PlanResult result = agentrt::MakePlan(config, inventory, options);
  if (!result.feasible()) {
    Fail(command,
         agentrt::ResourceExhausted(
             fmt::format("infeasible on {}: {}", inventory.source, result.infeasible().reason)),
         kExitInfeasible);
  }
  return std::move(result).plan();
}

}  // namespace agentctl
