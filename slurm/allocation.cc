#include "slurm/allocation.h"

#include <set>

#include "scheduler/hostlist.h"
#include "slurm/slurm_client.h"

namespace agentrt::slurm {

Result<std::vector<SlurmNode>> AllocationNodes(CommandRunner& runner, const EnvLookup& env) {
  SlurmClient slurm(runner);
  AGENTRT_ASSIGN_OR_RETURN(const std::string text, slurm.ShowNodesText());
  AGENTRT_ASSIGN_OR_RETURN(std::vector<SlurmNode> nodes, ParseScontrolNodes(text));
  const std::optional<std::string> list = env("SLURM_JOB_NODELIST");
  if (!list) return nodes;
  AGENTRT_ASSIGN_OR_RETURN(const std::vector<std::string> mine, ExpandHostlist(*list));
  std::vector<SlurmNode> out;
  for (const std::string& name : mine) {
    for (const auto& n : nodes) {
      if (n.spec.name == name) out.push_back(n);
    }
  }
  return out;
}

RunDriverOptions AllocationDriverOptions(const Plan& plan, const std::string& local_node,
                                         CommandRunner& runner, const EnvLookup& env,
                                         std::string* warning) {
  RunDriverOptions options;
  options.local_node = local_node;
  auto allocation = AllocationNodes(runner, env);
  if (!allocation.ok()) {
    *warning = "cannot read the allocation's nodes (" + allocation.status().message() +
               "); no node failover";
  }
  bool multi_node = allocation.ok() && allocation->size() > 1;
  for (const auto& a : plan.agents) {
    for (const auto& p : a.placement)
      multi_node = multi_node || (!local_node.empty() && p.node != local_node);
  }
  if (!multi_node) return options;
  std::string addr = local_node;
  if (allocation.ok()) {
    for (const auto& n : *allocation) {
      if (n.spec.name == local_node && !n.spec.addr.empty()) addr = n.spec.addr;
    }
  }
  options.bus_listen_host = "0.0.0.0";
  options.bus_advertised_host = addr;
  options.telemetry_host = addr;
  if (!allocation.ok()) return options;
  for (const auto& n : *allocation) options.allocation_nodes.push_back(n.spec);
  options.down_nodes = [&runner, env]() -> Result<std::set<std::string>> {
    AGENTRT_ASSIGN_OR_RETURN(const auto nodes, AllocationNodes(runner, env));
    std::set<std::string> down;
    for (const auto& n : nodes) {
      if (!n.usable) down.insert(n.spec.name);
    }
    return down;
  };
  return options;
}

}  // namespace agentrt::slurm
