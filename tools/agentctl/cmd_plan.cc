// `agentctl plan FILE [--cluster inventory.yaml] [--json]` — the partition plan;
// no side effects.
#include <fmt/format.h>
#include <sys/wait.h>

#include <cerrno>
#include <cstdio>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "scheduler/inventory.h"
#include "scheduler/loader.h"
#include "scheduler/planner.h"
#include "tools/agentctl/commands.h"

namespace agentctl {
namespace {

// `scontrol show node -o` output from `path`, or from running it when path is "-".
agentrt::Result<std::string> ReadScontrol(const std::string& path) {
  std::string text;
  if (path == "-") {
    FILE* pipe = ::popen("scontrol show node -o", "r");
    if (pipe == nullptr) return agentrt::ErrnoStatus(errno, "cannot run scontrol show node -o");
    char buf[4096];
    size_t n = 0;
    while ((n = std::fread(buf, 1, sizeof(buf), pipe)) > 0) text.append(buf, n);
    const int status = ::pclose(pipe);
    if (status != 0) {
      const std::string how = WIFEXITED(status) ? fmt::format("exit code {}", WEXITSTATUS(status))
                                                : fmt::format("wait status {}", status);
      return agentrt::Unavailable(
          fmt::format("scontrol show node -o failed ({}); is SLURM installed and reachable?", how));
    }
    return text;
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) return agentrt::ErrnoStatus(errno, fmt::format("cannot read {}", path));
  std::stringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

}  // namespace

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
                  "plan for this run directory (checkpoint dirs under it)");
  cmd->add_option("--set", opts->overrides, "override a setting: key.path=value (repeatable)");
  cmd->add_flag("--json", opts->json, "print the plan as JSON (DESIGN §6)");
  cmd->callback([opts] {
    agentrt::LoadOptions load;
    load.overrides = opts->overrides;
    agentrt::Result<agentrt::Config> config = agentrt::LoadConfigFile(opts->file, load);
    if (!config.ok()) Fail("plan", config.status());
    agentrt::Inventory inventory;
    if (!opts->cluster.empty()) {
      agentrt::Status applied = agentrt::ApplyClusterFile(opts->cluster, *config);
      if (!applied.ok()) Fail("plan", applied);
      inventory = agentrt::InventoryFromCluster(config->cluster, opts->cluster);
    } else if (!opts->scontrol.empty()) {
      agentrt::Result<std::string> text = ReadScontrol(opts->scontrol);
      if (!text.ok()) Fail("plan", text.status());
      agentrt::Result<std::vector<agentrt::SlurmNode>> nodes = agentrt::ParseScontrolNodes(*text);
      if (!nodes.ok()) Fail("plan", nodes.status());
      inventory = agentrt::InventoryFromSlurm(*nodes, config->slurm.partition);
    } else if (!config->cluster.nodes.empty()) {
      inventory = agentrt::InventoryFromCluster(config->cluster, opts->file + " cluster:");
    } else {
      inventory = agentrt::LocalInventory(agentrt::DetectLocalMachine());
    }
    agentrt::PlanOptions plan_options;
    plan_options.run_dir = opts->run_dir;
    agentrt::PlanResult result = agentrt::MakePlan(*config, inventory, plan_options);
    if (!result.feasible()) {
      Fail("plan",
           agentrt::ResourceExhausted(
               fmt::format("infeasible on {}: {}", inventory.source, result.infeasible().reason)),
           kExitInfeasible);
    }
    const agentrt::Plan& plan = result.plan();
    if (opts->json) {
      // The table shows warnings itself; with --json they go to stderr too so a pipe still sees
      // them.
      for (const std::string& w : plan.warnings)
        std::fputs(fmt::format("agentctl plan: warning: {}\n", w).c_str(), stderr);
      std::fputs((agentrt::PlanToJsonString(plan) + "\n").c_str(), stdout);
    } else {
      std::fputs(fmt::format("inventory: {} ({} nodes)\n", inventory.source, inventory.nodes.size())
                     .c_str(),
                 stdout);
      std::fputs(agentrt::PlanToTable(plan).c_str(), stdout);
    }
  });
}

}  // namespace agentctl
