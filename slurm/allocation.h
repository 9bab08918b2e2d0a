// Inside an allocation (`agentctl run --backend slurm-steps`, the batch shell
// of the job `agentctl run --backend slurm` submits): which nodes the job
// has, and how the run driver serves them: the bus and telemetry on this
// node's address when the run spans nodes, the allocation's nodes for
// failover, and which of them are down now. Through a CommandRunner, so
// tests replay scontrol's output.
#pragma once

#include <string>
#include <vector>

#include "common/status.h"
#include "plan/agent_env.h"
#include "plan/plan.h"
#include "scheduler/inventory.h"
#include "scheduler/run_driver.h"
#include "slurm/command_runner.h"

namespace agentrt::slurm {

// The nodes of this allocation (SLURM_JOB_NODELIST, every node when it is not
// set) as `scontrol show node -o` describes them now: specs, addresses,
// whether each is up.
Result<std::vector<SlurmNode>> AllocationNodes(CommandRunner& runner, const EnvLookup& env);

// The run driver's options for `plan` driven from `local_node`: on several
// nodes the bus listens on every interface and it and telemetry are reached at
// this node's NodeAddr (node names need not resolve on a cluster), and an
// agent on a failed node moves to a spare one (`down_nodes` asks scontrol
// through `runner`, which must outlive the options). When the allocation's
// nodes cannot be read, `warning` says so and there is no failover.
RunDriverOptions AllocationDriverOptions(const Plan& plan, const std::string& local_node,
                                         CommandRunner& runner, const EnvLookup& env,
                                         std::string* warning);

}  // namespace agentrt::slurm
