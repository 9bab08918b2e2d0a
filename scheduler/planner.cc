#include "scheduler/planner.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <bit>
#include <cctype>
#include <climits>
#include <cstdint>
#include <map>
#include <numeric>
#include <optional>
#include <set>
#include <span>
#include <tuple>
#include <unordered_map>

#include "plan/run_dir.h"

namespace agentrt {

Result<Plan> PlanResult::ToResult() && {
  if (feasible()) return std::move(*this).plan();
  return ResourceExhausted(infeasible().reason);
}

namespace {

constexpr int kUnlimited = INT_MAX;

struct DomainState {
  std::uint64_t free_mask = 0;  // bit g set = GPU g free
  int size = 0;
  int Free() const { return std::popcount(free_mask); }
};

// Dense bf16 peak of one GPU of `type`, TFLOP/s (vendor data sheets), 989 (H100) when unknown.
double GpuPeakTflops(const std::string& type, const PeakConfig& peak) {
  if (peak.gpu_tflops > 0) return peak.gpu_tflops;
  static const std::map<std::string, double> kPeak = {
      {"h100", 989}, {"h200", 989}, {"b200", 2250}, {"a100", 312}, {"l40s", 362}};
  std::string lower = type;
  for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  auto it = kPeak.find(lower);
  return it != kPeak.end() ? it->second : 989;
}

struct NodeState {
  const NodeSpec* spec = nullptr;
  std::vector<DomainState> domains;
  int free_gpus = 0;
  int cpus_free = kUnlimited;  // kUnlimited when the node does not state CPUs
  int ranks = 0;               // ranks placed here (for the oversubscription warning)
  int next_block = 0;          // port blocks [0, next_block) are taken
  int reserved_block = -1;     // the bus's block on this node, if any
  bool exclusive = false;      // held whole by a multi-node agent
  bool used = false;           // anything placed here
};

// Best-fit index over (node, domain) by free GPU count, and over nodes by free
// GPU count. Sets keep the order deterministic (lowest node first).
class FreeIndex {
 public:
  void Init(const std::vector<NodeState>& nodes, int max_gpus) {
    by_domain_.assign(static_cast<size_t>(max_gpus) + 1, {});
    by_node_.assign(static_cast<size_t>(max_gpus) + 1, {});
    for (size_t n = 0; n < nodes.size(); ++n) {
      for (size_t d = 0; d < nodes[n].domains.size(); ++d) {
        by_domain_[static_cast<size_t>(nodes[n].domains[d].Free())].insert(Key(n, d));
      }
      by_node_[static_cast<size_t>(nodes[n].free_gpus)].insert(static_cast<int>(n));
    }
  }
  // Moves re-link the set's node rather than free and allocate one.
  void MoveDomain(size_t n, size_t d, int from, int to) {
    if (from == to) return;
    by_domain_[static_cast<size_t>(to)].insert(
        by_domain_[static_cast<size_t>(from)].extract(Key(n, d)));
  }
  void MoveNode(size_t n, int from, int to) {
    if (from == to) return;
    by_node_[static_cast<size_t>(to)].insert(
        by_node_[static_cast<size_t>(from)].extract(static_cast<int>(n)));
  }
  const std::set<std::int64_t>& DomainsWithFree(int f) const {
    return by_domain_[static_cast<size_t>(f)];
  }
  const std::set<int>& NodesWithFree(int f) const { return by_node_[static_cast<size_t>(f)]; }
  int MaxFree() const { return static_cast<int>(by_node_.size()) - 1; }

  static std::int64_t Key(size_t n, size_t d) {
    return static_cast<std::int64_t>(n) * 64 + static_cast<std::int64_t>(d);
  }
  static size_t NodeOf(std::int64_t key) { return static_cast<size_t>(key / 64); }
  static size_t DomainOf(std::int64_t key) { return static_cast<size_t>(key % 64); }

 private:
  std::vector<std::set<std::int64_t>> by_domain_;
  std::vector<std::set<int>> by_node_;
};

class Planner {
 public:
  Planner(const Config& config, const Inventory& inventory, const PlanOptions& options)
      : config_(config), inventory_(inventory), options_(options) {}

  PlanResult Run() {
    if (inventory_.nodes.empty()) {
      return Infeasible{"",
                        fmt::format("the inventory ({}) has no usable nodes", inventory_.source)};
    }
    InitNodes();
    const PortConfig& ports = config_.cluster.ports;

    // The bus: first node, first block unless a fixed port is asked for.
    Plan plan;
    plan.run = config_.run.name;
    plan.run_dir = options_.run_dir;
    plan.bus.host = inventory_.nodes[0].name;
    plan.bus.settings = config_.bus;
    plan.bus.port = config_.bus.port == 0 ? ports.first : config_.bus.port;
    plan.bus.fixed_port = config_.bus.port != 0;
    plan.ports = ports;
    plan.bus.settings.port = plan.bus.port;
    if (plan.bus.port >= ports.first && plan.bus.port < ports.first + blocks_ * ports.per_agent) {
      nodes_[0].reserved_block = (plan.bus.port - ports.first) / ports.per_agent;
    }

    // Placement order: pinned first (most constrained), then multi-node, then
    // by GPUs and ranks, largest first; config order breaks ties.
    std::vector<std::tuple<int, int, int, int, size_t>> keys(config_.agents.size());
    for (size_t i = 0; i < keys.size(); ++i) {
      const AgentConfig& a = config_.agents[i];
      keys[i] = {a.nodes.empty() ? 1 : 0, a.gpus > max_gpus_ ? 0 : 1, -a.gpus, -a.ranks, i};
    }
    std::sort(keys.begin(), keys.end());
    std::vector<size_t> order(keys.size());
    for (size_t k = 0; k < keys.size(); ++k) order[k] = std::get<4>(keys[k]);

    plan.agents.resize(config_.agents.size());
    for (size_t i : order) {
      const AgentConfig& agent = config_.agents[i];
      AgentPlan& out = plan.agents[i];
      CopySettings(agent, static_cast<int>(i), out);
      used_by_agent_.clear();
      std::optional<Infeasible> why = Place(agent, out);
      if (why) return *why;
      // The partition's theoretical peak: its GPUs (by the type of their node), or its CPU ranks.
      out.peak_flops = 0;
      for (size_t k = 0; k < out.placement.size(); ++k) {
        const Placement& p = out.placement[k];
        const NodeSpec& spec = *nodes_[used_by_agent_[k]].spec;
        out.peak_flops += agent.gpus > 0 ? static_cast<double>(p.gpus.size()) * 1e12 *
                                               GpuPeakTflops(spec.gpu_type, config_.cluster.peak)
                                         : static_cast<double>(p.ranks.size()) * 1e9 *
                                               config_.cluster.peak.cpu_rank_gflops;
      }
    }

    Finish(plan);
    return plan;
  }

 private:
  // Every node's free GPUs, CPUs and NVLink domains, and the index over them.
  void InitNodes() {
    blocks_ = config_.cluster.ports.BlockCount();
    int max_gpus = 0;
    nodes_.resize(inventory_.nodes.size());
    for (size_t n = 0; n < inventory_.nodes.size(); ++n) {
      const NodeSpec& spec = inventory_.nodes[n];
      NodeState& s = nodes_[n];
      s.spec = &spec;
      s.free_gpus = spec.gpus;
      s.cpus_free = spec.cpus > 0 ? spec.cpus : kUnlimited;
      for (const std::vector<int>& ids : spec.nvlink_domains) {
        DomainState d;
        for (int g : ids) d.free_mask |= std::uint64_t{1} << g;
        d.size = static_cast<int>(ids.size());
        s.domains.push_back(d);
      }
      max_gpus = std::max(max_gpus, spec.gpus);
      index_of_.emplace(spec.name, n);
    }
    index_.Init(nodes_, max_gpus);
    max_gpus_ = max_gpus;
  }

  // What the plan carries of `agent`'s settings, as they are.
  void CopySettings(const AgentConfig& agent, int index, AgentPlan& out) const {
    out.name = agent.name;
    out.index = index;
    out.ranks = agent.ranks;
    out.gpus = agent.gpus;
    out.gpu_type = agent.gpu_type;
    out.backend = ResolveGroupBackend(agent.backend, agent.gpus, agent.ranks);
    out.command = agent.command;
    out.env = agent.env;
    out.args = agent.args;
    out.restart = agent.restart;
    out.checkpoint = agent.checkpoint;
    out.group = agent.group;
    out.checkpoint_dir = RunDir::RelativeCheckpointDir(agent.name);
    out.workdir = agent.workdir.empty() ? RunDir::RelativeWorkDir(agent.name) : agent.workdir;
  }

  // Channels, the nodes used, league, PBT and every warning.
  void Finish(Plan& plan) const {
    for (const ChannelConfig& c : config_.channels)
      plan.channels.push_back({c.topic, c.publishers, c.subscribers, c.keep_last});
    for (const NodeState& n : nodes_) {
      if (n.used) plan.nodes.push_back({n.spec->name, n.spec->gpus, n.spec->nvlink_domains});
    }
    plan.league = config_.league;
    plan.pbt = config_.pbt;
    plan.trust_slurm_binding = config_.slurm.trust_slurm_binding;
    plan.warnings = inventory_.warnings;
    plan.warnings.insert(plan.warnings.end(), warnings_.begin(), warnings_.end());
    for (std::string& w : ConfigWarnings(config_)) plan.warnings.push_back(std::move(w));
    for (const NodeState& n : nodes_) {
      if (n.spec->cpus > 0 && n.ranks > n.spec->cpus) {
        plan.warnings.push_back(fmt::format(
            "node {}: {} ranks on {} CPUs (oversubscribed: fine for a demo, slow for training)",
            n.spec->name, n.ranks, n.spec->cpus));
      }
    }
  }

  // The allowed nodes for `agent` as a mask; empty = every node (not pinned),
  // which keeps the common case free of per-agent O(nodes) work.
  std::optional<Infeasible> Allowed(const AgentConfig& agent, std::vector<bool>& allowed) {
    allowed.clear();
    if (auto why = Pinned(agent, allowed)) return why;
    if (agent.gpu_type.empty()) return std::nullopt;
    if (allowed.empty()) allowed.assign(nodes_.size(), true);
    std::map<std::string, std::vector<std::string>> types;  // type -> nodes, for the message
    bool any = false;
    for (size_t n = 0; n < nodes_.size(); ++n) {
      const NodeSpec& spec = *nodes_[n].spec;
      if (spec.gpus > 0)
        types[spec.gpu_type.empty() ? "(untyped)" : spec.gpu_type].push_back(spec.name);
      allowed[n] = allowed[n] && spec.gpu_type == agent.gpu_type;
      any = any || allowed[n];
    }
    if (any) return std::nullopt;
    std::string present;
    for (const auto& [type, names] : types) {
      present += fmt::format("{}{} ({} node{})", present.empty() ? "" : ", ", type, names.size(),
                             names.size() == 1 ? "" : "s");
    }
    return Infeasible{agent.name,
                      fmt::format("{} asks for gpu_type '{}', which no {}node has; GPU types "
                                  "present: {}",
                                  agent.name, agent.gpu_type, agent.nodes.empty() ? "" : "allowed ",
                                  present.empty() ? "none (no node has GPUs)" : present)};
  }

  // The nodes `agent` is pinned to (agents[].nodes) as a mask; empty = not pinned.
  std::optional<Infeasible> Pinned(const AgentConfig& agent, std::vector<bool>& allowed) {
    if (agent.nodes.empty()) return std::nullopt;
    allowed.assign(nodes_.size(), false);
    for (const std::string& name : agent.nodes) {
      auto it = index_of_.find(name);
      if (it == index_of_.end()) {
        return Infeasible{
            agent.name,
            fmt::format("{} is pinned to node '{}', which is not in the inventory ({}: {} nodes)",
                        agent.name, name, inventory_.source, nodes_.size())};
      }
      allowed[it->second] = true;
    }
    return std::nullopt;
  }

  static bool Allows(const std::vector<bool>& allowed, size_t n) {
    return allowed.empty() || allowed[n];
  }

  bool CpuFits(const NodeState& n, int ranks) const {
    return inventory_.oversubscribe_cpus || n.cpus_free == kUnlimited || n.cpus_free >= ranks;
  }
  // The next free port block on `n`, or -1.
  int NextBlock(const NodeState& n) const {
    int b = n.next_block;
    if (b == n.reserved_block) ++b;
    return b < blocks_ ? b : -1;
  }
  bool Eligible(size_t n, const std::vector<bool>& allowed, int ranks) const {
    const NodeState& s = nodes_[n];
    return Allows(allowed, n) && !s.exclusive && CpuFits(s, ranks) && NextBlock(s) >= 0;
  }

  void TakeGpus(size_t n, std::uint64_t mask_per_domain_taken, size_t d) {
    NodeState& s = nodes_[n];
    DomainState& dom = s.domains[d];
    const int before = dom.Free();
    dom.free_mask &= ~mask_per_domain_taken;
    index_.MoveDomain(n, d, before, dom.Free());
    const int node_before = s.free_gpus;
    s.free_gpus -= before - dom.Free();
    index_.MoveNode(n, node_before, s.free_gpus);
  }

  // Lowest `count` free GPUs of a domain, as a mask.
  static std::uint64_t LowestFree(std::uint64_t free_mask, int count) {
    std::uint64_t out = 0;
    for (int k = 0; k < count; ++k) {
      std::uint64_t bit = free_mask & (~free_mask + 1);
      out |= bit;
      free_mask &= ~bit;
    }
    return out;
  }

  void AssignPorts(AgentPlan& out, std::span<const size_t> nodes) {
    int block = 0;
    for (bool again = true; again;) {
      again = false;
      for (size_t n : nodes) block = std::max(block, NextBlock(nodes_[n]));
      for (size_t n : nodes) {
        if (nodes_[n].reserved_block == block) {
          ++block;
          again = true;
        }
      }
    }
    for (size_t n : nodes) nodes_[n].next_block = block + 1;
    const PortConfig& ports = config_.cluster.ports;
    out.ports.node = nodes_[nodes.front()].spec->name;
    out.ports.first = ports.first + block * ports.per_agent;
    out.ports.last = out.ports.first + ports.per_agent - 1;
    // Rank 0's node, as every node of the agent reaches it.
    out.master_addr = nodes_[nodes.front()].spec->Address();
    out.master_port = out.ports.first;
  }

  // Every placement of an agent calls this once, in placement order.
  void UseNode(size_t n, int ranks) {
    used_by_agent_.push_back(n);
    NodeState& s = nodes_[n];
    if (s.cpus_free != kUnlimited) s.cpus_free -= std::min(ranks, s.cpus_free);
    s.ranks += ranks;
    s.used = true;
  }

  std::optional<Infeasible> Place(const AgentConfig& agent, AgentPlan& out) {
    std::vector<bool> allowed;
    if (auto why = Allowed(agent, allowed)) return why;
    int max_allowed_gpus = max_gpus_;
    if (!allowed.empty()) {
      max_allowed_gpus = 0;
      for (size_t n = 0; n < nodes_.size(); ++n) {
        if (allowed[n]) max_allowed_gpus = std::max(max_allowed_gpus, nodes_[n].spec->gpus);
      }
    }
    if (agent.gpus == 0) return PlaceCpu(agent, allowed, out);
    if (max_allowed_gpus == 0) {
      return Infeasible{
          agent.name,
          fmt::format("{} needs {} GPUs, but no node{} of the inventory ({}) has a GPU", agent.name,
                      agent.gpus, agent.nodes.empty() ? "" : " it is pinned to",
                      inventory_.source)};
    }
    if (agent.gpus > max_allowed_gpus) return PlaceMultiNode(agent, allowed, out);
    return PlaceSubNode(agent, allowed, out);
  }

  std::optional<Infeasible> PlaceCpu(const AgentConfig& agent, const std::vector<bool>& allowed,
                                     AgentPlan& out) {
    // Best fit on free CPU slots; nodes without a CPU count come last.
    size_t best = nodes_.size();
    for (size_t n = 0; n < nodes_.size(); ++n) {
      if (!Eligible(n, allowed, agent.ranks)) continue;
      if (best == nodes_.size() || nodes_[n].cpus_free < nodes_[best].cpus_free) best = n;
    }
    if (best == nodes_.size()) return Shortage(agent, allowed, 0);
    Placement p;
    p.node = nodes_[best].spec->name;
    for (int r = 0; r < agent.ranks; ++r) p.ranks.push_back(r);
    out.placement.push_back(std::move(p));
    UseNode(best, agent.ranks);
    AssignPorts(out, std::span<const size_t>(&best, 1));
    return std::nullopt;
  }

  std::optional<Infeasible> PlaceSubNode(const AgentConfig& agent, const std::vector<bool>& allowed,
                                         AgentPlan& out) {
    const int g = agent.gpus;
    // 1. Best fit inside one NVLink domain.
    for (int f = g; f <= index_.MaxFree(); ++f) {
      for (std::int64_t key : index_.DomainsWithFree(f)) {
        size_t n = FreeIndex::NodeOf(key);
        if (!Eligible(n, allowed, agent.ranks)) continue;
        size_t d = FreeIndex::DomainOf(key);
        std::uint64_t take = LowestFree(nodes_[n].domains[d].free_mask, g);
        TakeGpus(n, take, d);
        FinishSingleNode(agent, n, take, out);
        return std::nullopt;
      }
    }
    // 2. No domain can hold it: best fit on one node, spanning as few domains
    //    as possible (fullest-free domains first).
    for (int f = g; f <= index_.MaxFree(); ++f) {
      for (int n_int : index_.NodesWithFree(f)) {
        size_t n = static_cast<size_t>(n_int);
        if (!Eligible(n, allowed, agent.ranks)) continue;
        std::vector<size_t> doms(nodes_[n].domains.size());
        std::iota(doms.begin(), doms.end(), 0);
        std::stable_sort(doms.begin(), doms.end(), [&](size_t a, size_t b) {
          return nodes_[n].domains[a].Free() > nodes_[n].domains[b].Free();
        });
        std::uint64_t all = 0;
        int left = g;
        for (size_t d : doms) {
          if (left == 0) break;
          int k = std::min(left, nodes_[n].domains[d].Free());
          std::uint64_t take = LowestFree(nodes_[n].domains[d].free_mask, k);
          TakeGpus(n, take, d);
          all |= take;
          left -= k;
        }
        FinishSingleNode(agent, n, all, out);
        return std::nullopt;
      }
    }
    return Shortage(agent, allowed, g);
  }

  // `mask`: the GPUs of node `n` the agent takes.
  void FinishSingleNode(const AgentConfig& agent, size_t n, std::uint64_t mask, AgentPlan& out) {
    Placement p;
    p.node = nodes_[n].spec->name;
    p.gpus.reserve(static_cast<size_t>(std::popcount(mask)));
    for (int gpu = 0; gpu < 64; ++gpu) {
      if (mask & (std::uint64_t{1} << gpu)) p.gpus.push_back(gpu);
    }
    p.ranks.resize(static_cast<size_t>(agent.ranks));
    std::iota(p.ranks.begin(), p.ranks.end(), 0);
    out.placement.push_back(std::move(p));
    UseNode(n, agent.ranks);
    AssignPorts(out, std::span<const size_t>(&n, 1));
  }

  std::optional<Infeasible> PlaceMultiNode(const AgentConfig& agent,
                                           const std::vector<bool>& allowed, AgentPlan& out) {
    // Whole, untouched nodes, largest first (lowest index among equals), until
    // the GPUs are covered. A whole node's free count is its GPU count, so the
    // free-GPU index lists them in that order without a pass over every node.
    auto whole = [&](size_t n) {
      const NodeState& s = nodes_[n];
      return Allows(allowed, n) && !s.used && !s.exclusive && s.spec->gpus > 0 &&
             s.free_gpus == s.spec->gpus && NextBlock(s) >= 0;
    };
    const int ranks_per_gpu = agent.ranks / agent.gpus;
    std::vector<size_t> chosen;
    int covered = 0;
    for (int f = index_.MaxFree(); f >= 1 && covered < agent.gpus; --f) {
      for (int n_int : index_.NodesWithFree(f)) {
        if (covered >= agent.gpus) break;
        const size_t n = static_cast<size_t>(n_int);
        if (!whole(n)) continue;
        int here = std::min(nodes_[n].spec->gpus, agent.gpus - covered);
        if (!CpuFits(nodes_[n], here * ranks_per_gpu)) continue;
        chosen.push_back(n);
        covered += here;
      }
    }
    if (covered < agent.gpus) {
      int free_nodes = 0, free_gpus = 0;
      for (size_t n = 0; n < nodes_.size(); ++n) {
        if (!whole(n)) continue;
        ++free_nodes;
        free_gpus += nodes_[n].spec->gpus;
      }
      return Infeasible{
          agent.name,
          fmt::format("{} needs {} GPUs on whole nodes; only {} whole free node(s) with {} GPUs "
                      "in all are left{}",
                      agent.name, agent.gpus, free_nodes, free_gpus, PinScope(agent))};
    }
    int held = 0;
    for (size_t n : chosen) held += nodes_[n].spec->gpus;
    if (held > agent.gpus) {
      warnings_.push_back(fmt::format(
          "agent {} needs {} GPUs and holds {} whole nodes with {}: {} GPUs stay idle (an agent "
          "larger than a node gets whole nodes); give it {} GPUs to use them all",
          agent.name, agent.gpus, chosen.size(), held, held - agent.gpus, held));
    }
    int rank = 0;
    covered = 0;
    for (size_t n : chosen) {
      NodeState& s = nodes_[n];
      int here = std::min(s.spec->gpus, agent.gpus - covered);
      covered += here;
      Placement p;
      p.node = s.spec->name;
      int left = here;
      for (size_t d = 0; d < s.domains.size() && left > 0; ++d) {
        int k = std::min(left, s.domains[d].Free());
        std::uint64_t take = LowestFree(s.domains[d].free_mask, k);
        TakeGpus(n, take, d);
        left -= k;
      }
      for (int gpu = 0; gpu < s.spec->gpus; ++gpu) {
        bool taken = true;
        for (const DomainState& dom : s.domains) {
          if (dom.free_mask & (std::uint64_t{1} << gpu)) taken = false;
        }
        if (taken) p.gpus.push_back(gpu);
      }
      for (int r = 0; r < here * ranks_per_gpu; ++r) p.ranks.push_back(rank++);
      UseNode(n, here * ranks_per_gpu);
      s.exclusive = true;
      out.placement.push_back(std::move(p));
    }
    AssignPorts(out, chosen);
    return std::nullopt;
  }

  // " on node03", " on its pinned nodes n1, n2", or "" for an agent that may go anywhere.
  static std::string PinScope(const AgentConfig& agent) {
    if (agent.nodes.empty()) return "";
    if (agent.nodes.size() == 1) return " on " + agent.nodes[0];
    return fmt::format(" on its pinned nodes {}", fmt::join(agent.nodes, ", "));
  }

  // Explains why no allowed node could take `agent` needing `gpus` GPUs.
  Infeasible Shortage(const AgentConfig& agent, const std::vector<bool>& allowed, int gpus) const {
    const std::string scope = PinScope(agent);
    int best_node_gpus = -1;
    std::string gpu_node;
    bool gpu_fit_somewhere = false, cpu_short = false, port_short = false;
    int best_cpus = -1;
    std::string cpu_node;
    for (size_t n = 0; n < nodes_.size(); ++n) {
      const NodeState& s = nodes_[n];
      if (!Allows(allowed, n) || s.exclusive) continue;
      if (s.free_gpus > best_node_gpus) {
        best_node_gpus = s.free_gpus;
        gpu_node = s.spec->name;
      }
      if (s.free_gpus >= gpus) {
        gpu_fit_somewhere = true;
        if (!CpuFits(s, agent.ranks))
          cpu_short = true;
        else if (NextBlock(s) < 0)
          port_short = true;
      }
      if (s.cpus_free != kUnlimited && s.cpus_free > best_cpus) {
        best_cpus = s.cpus_free;
        cpu_node = s.spec->name;
      }
    }
    if (best_node_gpus < 0) {
      return {agent.name,
              fmt::format(
                  "{} cannot be placed: every allowed node{} is held whole by a multi-node agent",
                  agent.name, scope)};
    }
    if (!gpu_fit_somewhere) {
      // No node has enough (the placer spans NVLink domains when it must): too
      // few GPUs left at all, or enough but spread over nodes.
      int total_free = 0, nodes_with_free = 0;
      for (size_t n = 0; n < nodes_.size(); ++n) {
        if (!Allows(allowed, n) || nodes_[n].exclusive || nodes_[n].free_gpus == 0) continue;
        total_free += nodes_[n].free_gpus;
        ++nodes_with_free;
      }
      if (total_free < gpus) {
        const bool one_node = agent.nodes.size() == 1 || total_free == 0;
        return {agent.name, fmt::format("{} needs {} GPUs; {} free in total{}{}", agent.name, gpus,
                                        total_free, scope,
                                        one_node ? ""
                                                 : fmt::format(" (the most on one node: {} on {})",
                                                               best_node_gpus, gpu_node))};
      }
      return {agent.name,
              fmt::format("{} needs {} GPUs on one node; the most free on one node is {} on {} "
                          "({} free in total, spread over {} nodes){}",
                          agent.name, gpus, best_node_gpus, gpu_node, total_free, nodes_with_free,
                          scope)};
    }
    if (cpu_short) {
      return {agent.name,
              fmt::format("{} needs {} CPU slots on one node{}; the most free is {} on {}{}",
                          agent.name, agent.ranks,
                          gpus > 0 ? fmt::format(" with {} free GPUs", gpus) : "", best_cpus,
                          cpu_node.empty() ? "-" : cpu_node,
                          inventory_.controller_cpu_reserved
                              ? " (one CPU of every node is kept for the run controller's task)"
                              : "")};
    }
    if (port_short) {
      const PortConfig& p = config_.cluster.ports;
      return {agent.name,
              fmt::format(
                  "{} needs a port block; ports {}-{} hold {} blocks of {} and they are all taken "
                  "on the nodes that could hold it{}; widen cluster.ports",
                  agent.name, p.first, p.last, blocks_, p.per_agent, scope)};
    }
    return {agent.name, fmt::format("{} cannot be placed{}", agent.name, scope)};
  }

  const Config& config_;
  const Inventory& inventory_;
  const PlanOptions& options_;
  std::vector<NodeState> nodes_;
  std::unordered_map<std::string, size_t> index_of_;
  std::vector<size_t> used_by_agent_;  // the nodes of the agent being placed, per placement
  FreeIndex index_;
  int blocks_ = 0;
  int max_gpus_ = 0;                   // most GPUs of any node
  std::vector<std::string> warnings_;  // said while placing (idle GPUs of whole nodes)
};

}  // namespace

PlanResult MakePlan(const Config& config, const Inventory& inventory, const PlanOptions& options) {
  Planner planner(config, inventory, options);
  return planner.Run();
}

Status LeaseRunPorts(Plan& plan, const PortConfig& ports,
                     const std::function<bool(const AgentPlan&)>& here, PortLeases& leases) {
  const std::string range = fmt::format("{}-{}", ports.first, ports.last);
  PortLeases::Batch batch(leases);  // the owner file once, with every range
  // The bus: its planned port, or (auto) any single free port of the range.
  if (plan.bus.fixed_port) {
    if (Status s = leases.Acquire(plan.bus.port, plan.bus.port); !s.ok()) {
      return s.WithContext(fmt::format("bus.port {} is not free", plan.bus.port) +
                           " (set another bus.port, or bus.port: auto)");
    }
  } else {
    int port = plan.bus.port;
    for (int p = ports.first; !leases.Free(port, port) && p <= ports.last; ++p) port = p;
    if (!leases.Free(port, port)) {
      return ResourceExhausted(fmt::format(
          "no free port for the bus in cluster.ports {}: every one is leased by other runs on this "
          "machine; widen cluster.ports (first/last)",
          range));
    }
    AGENTRT_RETURN_IF_ERROR(leases.Acquire(port, port));
    plan.bus.port = port;
    plan.bus.settings.port = port;
  }
  // The agents: each its planned block when free, else the first free block.
  const int blocks = ports.BlockCount();
  for (AgentPlan& a : plan.agents) {
    if (!here(a)) continue;
    const int width = a.ports.last - a.ports.first;
    int first = a.ports.first;
    if (!leases.Free(first, first + width)) {
      first = -1;
      for (int b = 0; b < blocks && first < 0; ++b) {
        const int f = ports.first + b * ports.per_agent;
        if (f + width <= ports.last && leases.Free(f, f + width)) first = f;
      }
      if (first < 0) {
        return ResourceExhausted(fmt::format(
            "agent {} needs a block of {} ports and every block of cluster.ports {} ({} blocks) is "
            "leased by this run or by other runs on this machine; widen cluster.ports (first/last)",
            a.name, width + 1, range, blocks));
      }
    }
    AGENTRT_RETURN_IF_ERROR(leases.Acquire(first, first + width).WithContext("agent " + a.name));
    a.master_port = MovedMasterPort(a.master_port, a.ports.first, first, first + width);
    a.ports.first = first;
    a.ports.last = first + width;
  }
  return Status::Ok();
}

}  // namespace agentrt
