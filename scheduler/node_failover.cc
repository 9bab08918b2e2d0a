#include "scheduler/node_failover.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <utility>

namespace agentrt {

NodeFailover::NodeFailover(std::vector<NodeSpec> nodes) : nodes_(std::move(nodes)) {}

const NodeSpec* NodeFailover::Find(const std::string& name) const {
  for (const NodeSpec& n : nodes_) {
    if (n.name == name) return &n;
  }
  return nullptr;
}

NodeFailover::NodeUse NodeFailover::UsedOn(const Plan& plan, const std::string& node,
                                           const AgentPlan* except) {
  NodeUse use;
  for (const AgentPlan& a : plan.agents) {
    if (&a == except) continue;
    for (const Placement& p : a.placement) {
      if (p.node != node) continue;
      use.gpus.insert(p.gpus.begin(), p.gpus.end());
      use.ranks += p.ranks.size();
    }
  }
  return use;
}

std::vector<std::string> NodeFailover::Spares(const Plan& plan,
                                              const std::set<std::string>& down) const {
  std::set<std::string> used;
  for (const AgentPlan& a : plan.agents) {
    for (const Placement& p : a.placement) used.insert(p.node);
    // A shrunk agent's lost nodes stay its own: it grows back onto them.
    for (const Placement& p : a.planned_placement) used.insert(p.node);
  }
  std::vector<std::string> out;
  for (const NodeSpec& n : nodes_) {
    if (!used.count(n.name) && !down.count(n.name) && !failed_.count(n.name)) out.push_back(n.name);
  }
  return out;
}

FailoverDecision NodeFailover::Relocate(Plan& plan, const std::string& agent,
                                        const std::set<std::string>& down) {
  failed_.insert(down.begin(), down.end());
  FailoverDecision d;
  AgentPlan* a = nullptr;
  for (AgentPlan& candidate : plan.agents) {
    if (candidate.name == agent) a = &candidate;
  }
  if (a == nullptr) return d;
  for (const Placement& p : a->placement) {
    if (failed_.count(p.node)) d.failed.push_back(p.node);
  }
  if (d.failed.empty()) return d;

  // Whole spares, and the spares this controller already moved agents of the
  // same failed node to: those take more while they have room, and are tried
  // first, so that whole spares are kept for what needs them. (Only agents of
  // one failed node share: the planner gives each node's agents their own
  // port blocks, not agents of different nodes.)
  std::vector<std::string> spares = Spares(plan, down);
  std::vector<Placement> placement = a->placement;
  std::vector<std::pair<std::string, std::string>> taken;  // spare, failed node
  for (Placement& p : placement) {
    if (!failed_.count(p.node)) continue;
    const size_t gpus = p.gpus.size();
    const size_t ranks = p.ranks.size();
    std::vector<std::string> candidates;
    for (const auto& [spare, from] : given_) {
      const bool mine = std::any_of(placement.begin(), placement.end(),
                                    [&](const Placement& q) { return q.node == spare; });
      if (from == p.node && !mine && !down.count(spare) && !failed_.count(spare))
        candidates.push_back(spare);
    }
    candidates.insert(candidates.end(), spares.begin(), spares.end());
    NodeUse used;  // of the last node tried: the spare, once one fits
    auto fits = [&](const std::string& name) {
      const NodeSpec* n = Find(name);
      if (n == nullptr || (!a->gpu_type.empty() && n->gpu_type != a->gpu_type)) return false;
      used = UsedOn(plan, name, a);
      return static_cast<size_t>(n->gpus) >= used.gpus.size() + gpus &&
             (n->cpus <= 0 || static_cast<size_t>(n->cpus) >= used.ranks + ranks);
    };
    auto spare = std::find_if(candidates.begin(), candidates.end(), fits);
    if (spare == candidates.end()) {
      d.kind = FailoverDecision::Kind::kNoSpare;
      d.moved_to.clear();
      d.reason = fmt::format(
          "no spare node left for its {} rank(s){} of failed node {} ({} spare node(s) free)",
          ranks,
          gpus > 0
              ? fmt::format(" and {} {}GPU(s)", gpus, a->gpu_type.empty() ? "" : a->gpu_type + " ")
              : "",
          p.node, spares.size());
      Shrink(*a, &d);
      return d;
    }
    d.moved_to.push_back(*spare);
    taken.emplace_back(*spare, p.node);
    p.node = *spare;
    int next = 0;  // the spare's free GPUs, lowest first
    for (int& g : p.gpus) {
      while (used.gpus.count(next)) ++next;
      g = next++;
    }
    std::erase(spares, *spare);  // an agent's nodes stay distinct
  }
  given_.insert(taken.begin(), taken.end());
  a->placement = std::move(placement);
  FollowFirstNode(*a);
  d.kind = FailoverDecision::Kind::kMoved;
  return d;
}

void NodeFailover::FollowFirstNode(AgentPlan& a) const {
  a.ports.node = a.placement.front().node;
  const NodeSpec* first = Find(a.ports.node);
  a.master_addr = first != nullptr ? first->Address() : a.ports.node;
}

void NodeFailover::Shrink(AgentPlan& a, FailoverDecision* d) const {
  const int min_ranks = a.restart.elastic_min_ranks;
  if (min_ranks <= 0) return;
  std::vector<Placement> kept;
  int left = 0;
  for (const Placement& p : a.placement) {
    if (failed_.count(p.node)) continue;
    kept.push_back(p);
    left += static_cast<int>(p.ranks.size());
  }
  if (left < min_ranks) {
    d->reason += fmt::format(
        "; restart.elastic needs at least {} rank(s), its healthy nodes hold {}", min_ranks, left);
    return;
  }
  int next = 0;
  int gpus = 0;
  std::vector<std::string> nodes;
  for (Placement& p : kept) {
    for (int& r : p.ranks) r = next++;
    gpus += static_cast<int>(p.gpus.size());
    nodes.push_back(p.node);
  }
  if (a.planned_ranks == 0) {
    a.planned_ranks = a.ranks;
    a.planned_placement = a.placement;
  }
  d->kind = FailoverDecision::Kind::kShrunk;
  d->reason += fmt::format(
      "; it goes on with the {} rank(s) on {} ({} planned, restart.elastic.min_ranks {})", left,
      fmt::join(nodes, ","), a.planned_ranks, min_ranks);
  a.ranks = left;
  a.gpus = gpus;
  a.placement = std::move(kept);
  FollowFirstNode(a);
}

namespace {

// Whether another agent than `a` has any of `p`'s GPUs on `p`'s node.
bool GpusTaken(const Plan& plan, const AgentPlan& a, const Placement& p) {
  for (const AgentPlan& other : plan.agents) {
    if (&other == &a) continue;
    for (const Placement& q : other.placement) {
      if (q.node != p.node) continue;
      for (const int g : q.gpus) {
        if (std::find(p.gpus.begin(), p.gpus.end(), g) != p.gpus.end()) return true;
      }
    }
  }
  return false;
}

}  // namespace

std::vector<std::pair<std::string, FailoverDecision>> NodeFailover::PlaceStrays(
    Plan& plan, const std::set<std::string>& down) {
  std::vector<std::pair<std::string, FailoverDecision>> out;
  for (size_t i = 0; i < plan.agents.size(); ++i) {
    std::set<std::string> gone = down;
    bool stray = false;
    for (const Placement& p : plan.agents[i].placement) {
      if (Find(p.node) == nullptr || down.count(p.node)) {
        gone.insert(p.node);
        stray = true;
      }
    }
    if (!stray) continue;
    const std::string name = plan.agents[i].name;
    out.emplace_back(name, Relocate(plan, name, gone));
  }
  return out;
}

std::vector<std::string> NodeFailover::GrowBack(Plan& plan, const std::set<std::string>& down) {
  std::vector<std::string> grown;
  for (AgentPlan& a : plan.agents) {
    if (a.planned_placement.empty()) continue;
    int planned = 0;
    for (const Placement& p : a.planned_placement) planned += static_cast<int>(p.ranks.size());
    if (planned != a.planned_ranks) continue;  // not a placement this agent had: leave it
    // Every planned node in the allocation, up, and none of its planned GPUs
    // given to another agent meanwhile (agents may share a node, not a GPU).
    const bool back = std::all_of(a.planned_placement.begin(), a.planned_placement.end(),
                                  [&](const Placement& p) {
                                    return Find(p.node) != nullptr && !down.count(p.node) &&
                                           !failed_.count(p.node) && !GpusTaken(plan, a, p);
                                  });
    if (!back) continue;
    a.ranks = a.planned_ranks;
    a.gpus = 0;
    for (const Placement& p : a.planned_placement) a.gpus += static_cast<int>(p.gpus.size());
    a.placement = std::move(a.planned_placement);
    a.planned_placement.clear();
    a.planned_ranks = 0;
    FollowFirstNode(a);
    grown.push_back(a.name);
  }
  return grown;
}

}  // namespace agentrt
