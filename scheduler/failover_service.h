// The run driver's node failover, a service of its own (inside an allocation,
// when someone can say which nodes are down): before the supervisor relaunches
// a failed agent it asks this service, which moves the agent's ranks off a
// down node onto a spare (scheduler/node_failover.h), rewrites plan.json, or
// holds the relaunch and asks for a requeue when no spare fits.
#pragma once

#include <functional>
#include <set>
#include <string>
#include <vector>

#include "common/status.h"
#include "plan/plan.h"
#include "plan/run_dir.h"
#include "scheduler/node_failover.h"
#include "scheduler/run_controller.h"

namespace agentrt {

class RunObserver;

// Which nodes are down now (SLURM's view).
using DownNodes = std::function<Result<std::set<std::string>>()>;

// Where the run's agents find the bus and telemetry (what a moved agent's
// launch is made with).
struct RunEndpoints {
  std::string bus_address;
  std::string telemetry_endpoint;
  std::string local_node;  // inside an allocation: this node
};

class FailoverService {
 public:
  // `plan` and `observer` outlive the service; `nodes` is every node of the
  // allocation (the plan's and the spares).
  FailoverService(Plan* plan, RunDir dir, std::vector<NodeSpec> nodes, DownNodes down_nodes,
                  RunEndpoints endpoints, RunObserver* observer);

  // What to do before `launch` is relaunched: nothing (relaunch where it was;
  // also when nobody can say which nodes are down), its ranks moved to spares
  // (`launch` rewritten), or hold with a reason and the failed nodes. Once
  // any node was seen down, every launch it advises overlaps the job's other
  // steps (AgentLaunch::overlap_steps).
  RelaunchAdvice Advise(AgentLaunch& launch);

 private:
  Plan* plan_;
  RunDir dir_;
  NodeFailover failover_;
  DownNodes down_nodes_;
  RunEndpoints endpoints_;
  RunObserver* observer_;
  bool allocation_shrunk_ = false;  // a node of the allocation was seen down
};

}  // namespace agentrt
