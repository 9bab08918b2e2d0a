// Moving an agent off a failed node (agentctl run --backend slurm with
// `slurm.spare_nodes`).
//
// The allocation holds the plan's nodes and K spare ones. When the controller
// is about to relaunch an agent after a failure and one of the agent's nodes
// is down (SLURM says DOWN, DRAIN, FAIL or NOT_RESPONDING), only that agent is
// re-planned: each of its failed nodes is replaced by a spare node of the
// allocation that is up, holds no agent (or only agents this controller moved
// there from the same failed node: they share a spare while it has room), and
// still offers what the agent had there (as many free GPUs, of its gpu_type,
// and CPU slots for its ranks). Ranks per node and the port block stay; the
// agent gets the spare's lowest free GPU ids; MASTER_ADDR follows the agent's
// first node. Agents on healthy nodes are not touched.
// With no spare that fits, an elastic agent (restart.elastic.min_ranks K)
// goes on with the ranks its healthy nodes hold, renumbered from 0 in node
// order, ranks per node as planned, if that is at least K (kShrunk: its
// restore re-shards its checkpoint); otherwise the decision is kNoSpare and
// the run requeues its allocation (RunDriver), as on preemption.
//
// A node once seen down is never given to an agent again by this run's
// controller, even if it comes back: SLURM has taken it out of the job. A
// shrunk agent grows back to its planned placement when a requeued
// allocation (a new controller) holds every node of it again (GrowBack).
//
// Pure logic over the plan: tested with hand-made plans and node sets.
// Not thread-safe.
#pragma once

#include <map>
#include <set>
#include <string>
#include <vector>

#include "plan/config.h"
#include "plan/plan.h"

namespace agentrt {

struct FailoverDecision {
  enum class Kind {
    kStay,     // none of the agent's nodes is down: relaunch where it was
    kMoved,    // the plan's entry of the agent now names spare nodes
    kNoSpare,  // a node of the agent is down and no spare fits: requeue
    kShrunk,   // no spare fits; the plan's entry now holds only its healthy nodes
  };
  Kind kind = Kind::kStay;
  std::vector<std::string> failed;    // the agent's nodes that are down
  std::vector<std::string> moved_to;  // kMoved: the spare that took failed[i]
  std::string reason;                 // kNoSpare, kShrunk: why no spare fits (and what now)
};

class NodeFailover {
 public:
  // `nodes`: every node of the allocation (the plan's and the spares).
  explicit NodeFailover(std::vector<NodeSpec> nodes);

  // The decision for agent `agent` of `plan` while `down` are down; kMoved
  // rewrites the agent's placement, ports.node and master_addr in `plan`.
  FailoverDecision Relocate(Plan& plan, const std::string& agent,
                            const std::set<std::string>& down);

  // Every shrunk agent of `plan` whose planned nodes are all in the
  // allocation and up, and whose planned GPUs no other agent has there, gets
  // its planned placement, ranks and GPUs back (its
  // restore re-shards its checkpoint); returns their names.
  std::vector<std::string> GrowBack(Plan& plan, const std::set<std::string>& down);

  // At the start of a requeued allocation: every agent planned on a node that
  // this allocation does not hold (it moved to a spare that failed since, or
  // SLURM gave the job other nodes) or that is down is relocated as after a
  // failure (Relocate). Returns the decision for each, by agent name.
  std::vector<std::pair<std::string, FailoverDecision>> PlaceStrays(
      Plan& plan, const std::set<std::string>& down);

  // Nodes of the allocation no agent of `plan` uses and none has seen fail.
  std::vector<std::string> Spares(const Plan& plan, const std::set<std::string>& down) const;

 private:
  struct NodeUse {
    std::set<int> gpus;  // GPU ids agents hold there
    size_t ranks = 0;
  };
  // What the agents of `plan` but `except` use on `node`.
  static NodeUse UsedOn(const Plan& plan, const std::string& node, const AgentPlan* except);
  const NodeSpec* Find(const std::string& name) const;
  // ports.node and master_addr follow the agent's first node.
  void FollowFirstNode(AgentPlan& a) const;
  // The elastic way out of kNoSpare (see above); `d` says which was taken.
  void Shrink(AgentPlan& a, FailoverDecision* d) const;

  std::vector<NodeSpec> nodes_;
  std::set<std::string> failed_;
  // The spares this controller moved agents to, and the failed node they came from.
  std::map<std::string, std::string> given_;
};

}  // namespace agentrt
