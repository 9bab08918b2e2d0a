// agentctl — plan, run and inspect multi-agent RL training runs.
#include <fmt/format.h>

#include <cstdio>
#include <string_view>

#include "plan/rank_exec.h"
#include "scheduler/process.h"
#include "tools/agent-worker/settings.h"
#include "tools/agentctl/commands.h"

namespace agentctl {

agentrt::LoadOptions ConfigLoadOptions(const std::vector<std::string>& overrides) {
  agentrt::LoadOptions options;
  options.overrides = overrides;
  options.args_validators["agent-worker"] =
      [](const nlohmann::json& args) -> std::optional<agentrt::ArgsProblem> {
    auto problem = agentrt::worker::CheckArgs(args);
    if (!problem) return std::nullopt;
    return agentrt::ArgsProblem{problem->first, problem->second};
  };
  return options;
}

void Fail(std::string_view command, const agentrt::Status& status, int code) {
  std::fputs(fmt::format("agentctl {}: {}\n", command, status.message()).c_str(), stderr);
  Exit(code);
}

}  // namespace agentctl

int main(int argc, char** argv) {
  // The rank wrapper (plan/rank_exec.h) when agentrt-exec-rank is not installed
  // next to agentctl: internal, so neither parsed by CLI11 nor listed by --help.
  if (argc > 1 && std::string_view(argv[1]) == "exec-rank") {
    return agentrt::ExecRankMain(argc - 1, argv + 1);
  }
  // Agents (any backend, any node sharing this install) can `import agentrt`.
  agentrt::ExposePythonPackage();
  CLI::App app{"agentctl: plan, run and inspect multi-agent RL training runs"};
  app.set_version_flag("--version", "agentctl " AGENTRT_VERSION);
  app.require_subcommand(1);
#define AGENTCTL_REGISTER(name) agentctl::Register##name(app);
  AGENTCTL_COMMANDS(AGENTCTL_REGISTER)
#undef AGENTCTL_REGISTER
  CLI11_PARSE(app, argc, argv);
  return 0;
}
