// `agentctl validate FILE` — schema check; every error names file:line:column.
#include <fmt/format.h>

#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "scheduler/loader.h"
#include "tools/agentctl/commands.h"

namespace agentctl {

void RegisterValidate(CLI::App& app) {
  struct Options {
    std::string file;
    std::vector<std::string> overrides;
    bool settings = false;
  };
  auto opts = std::make_shared<Options>();
  CLI::App* cmd = app.add_subcommand(
      "validate", "Check an agents.yaml; exit 0 and a summary, or 1 and the error");
  cmd->add_option("file", opts->file, "agents.yaml to check");
  cmd->add_option("--set", opts->overrides, "override a setting: key.path=value (repeatable)");
  cmd->add_flag("--settings", opts->settings,
                "list every setting with its type, default and meaning");
  cmd->callback([opts] {
    if (opts->settings) {
      std::fputs(agentrt::DescribeSettings().c_str(), stdout);
      if (opts->file.empty()) return;
    }
    if (opts->file.empty())
      Fail("validate", agentrt::InvalidArgument("missing FILE (agents.yaml to check)"));
    const agentrt::LoadOptions load = ConfigLoadOptions(opts->overrides);
    agentrt::Result<agentrt::Config> config = agentrt::LoadConfigFile(opts->file, load);
    if (!config.ok()) Fail("validate", config.status());
    const agentrt::Config& c = *config;
    for (const std::string& w : agentrt::ConfigWarnings(c))
      std::fputs(fmt::format("agentctl validate: warning: {}\n", w).c_str(), stderr);
    std::fputs(
        fmt::format(
            "ok: {} agents ({} ranks, {} GPUs), {} channels, {} cluster nodes described; {}\n",
            c.agents.size(), c.TotalRanks(), c.TotalGpus(), c.channels.size(),
            c.cluster.nodes.size(), opts->file)
            .c_str(),
        stdout);
  });
}

}  // namespace agentctl
