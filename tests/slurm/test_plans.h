// Plans built by hand for the SLURM tests: agents of a few resource shapes on
// one node, as the planner would place them.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <utility>

#include "plan/agent_env.h"
#include "plan/plan.h"

namespace agentrt::slurm::testing {

// Adds an agent named `name` with `gpus` GPUs and `ranks` ranks on `node`,
// port block `first`..`first+15`, checkpoint dir under `run_dir`.
inline void AddAgent(Plan& plan, const std::string& name, int gpus, int ranks,
                     const std::string& node, int first, const std::string& run_dir,
                     std::vector<std::string> command = {"agent-worker"}) {
  AgentPlan a;
  a.name = name;
  a.index = static_cast<int>(plan.agents.size());
  a.ranks = ranks;
  a.gpus = gpus;
  Placement p;
  p.node = node;
  for (int r = 0; r < ranks; ++r) p.ranks.push_back(r);
  a.placement.push_back(p);
  a.ports = {node, first, first + 15};
  a.master_addr = node;
  a.master_port = first;
  a.checkpoint_dir = run_dir + "/checkpoints/" + name;
  a.backend =
      gpus > 0 ? GroupBackend::kNccl : (ranks > 1 ? GroupBackend::kMpi : GroupBackend::kSingle);
  a.command = std::move(command);
  plan.agents.push_back(std::move(a));
}

// An environment of `vars` (the launcher's variables a test sets).
inline EnvLookup MapLookup(std::map<std::string, std::string> vars) {
  return [vars = std::move(vars)](const std::string& name) -> std::optional<std::string> {
    auto it = vars.find(name);
    return it == vars.end() ? std::nullopt : std::optional<std::string>(it->second);
  };
}

}  // namespace agentrt::slurm::testing
