// The partition planner: Config + Inventory → Plan, or the reason it cannot be
// done. A pure, deterministic function (same input, same plan).
//
// Guarantees (checked by tests/scheduler/planner_property_test.cc):
//   - no (node, GPU) pair is given to two agents; no port twice on one node;
//   - the bus port is never inside an agent's block;
//   - an agent with at most a node's worth of GPUs stays on one node, and inside
//     one NVLink domain whenever some domain can hold it when it is placed
//     (agents are placed largest first, best fit, so fragmentation does not
//     starve the big ones);
//   - an agent needing more GPUs than any node has gets whole nodes, shared with
//     no other agent;
//   - CPU agents (gpus: 0) get ports and CPU slots (one per rank) but no GPUs;
//     CPU counts are enforced unless the inventory allows oversubscription
//     (local machine), in which case the plan carries a warning;
//   - pinned agents (`nodes:`) are placed only on their nodes.
#pragma once

#include <functional>
#include <string>
#include <variant>

#include "plan/config.h"
#include "plan/plan.h"
#include "plan/port_lease.h"
#include "scheduler/inventory.h"

namespace agentrt {

struct PlanOptions {
  // The run directory the plan is for, when it exists already; recorded as
  // plan.run_dir. Paths in the plan (checkpoint_dir) are relative to it.
  std::string run_dir;
};

// Why no plan exists: the agent that could not be placed and what is short.
struct Infeasible {
  std::string agent;   // empty when the problem is not one agent's (e.g. no nodes)
  std::string reason;  // "six needs 6 GPUs; 4 free in total on node03"
};

// PlanResult{plan | infeasible(reason)}.
class PlanResult {
 public:
  PlanResult(Plan plan) : v_(std::move(plan)) {}      // NOLINT(google-explicit-constructor)
  PlanResult(Infeasible why) : v_(std::move(why)) {}  // NOLINT(google-explicit-constructor)

  bool feasible() const { return std::holds_alternative<Plan>(v_); }
  const Plan& plan() const& { return std::get<Plan>(v_); }
  Plan&& plan() && { return std::get<Plan>(std::move(v_)); }
  const Infeasible& infeasible() const { return std::get<Infeasible>(v_); }

  // The plan, or RESOURCE_EXHAUSTED with the reason.
  Result<Plan> ToResult() &&;

 private:
  std::variant<Plan, Infeasible> v_;
};

PlanResult MakePlan(const Config& config, const Inventory& inventory,
                    const PlanOptions& options = {});

// Leases (plan/port_lease.h) every port of `plan` that is used on this machine,
// for as long as `leases` lives: the bus port first, then the port block of
// every agent `here` accepts (every agent for the local backend: they all run
// on this machine whatever the plan's node names). A block another run holds
// moves to a free block of `ports` (and MASTER_PORT with it); a fixed bus
// port (plan.bus.fixed_port: bus.port set in the config) never moves: in use,
// it is an error. ResourceExhausted names the agent and the range to widen when
// no block is left; AlreadyExists names the holder of a fixed bus port.
Status LeaseRunPorts(Plan& plan, const PortConfig& ports,
                     const std::function<bool(const AgentPlan&)>& here, PortLeases& leases);

}  // namespace agentrt
