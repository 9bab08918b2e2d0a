// Property tests: thousands of random clusters and agent mixes; every plan is
// checked against every guarantee of scheduler/planner.h, and every refusal
// must name an agent and say what is short.
#include <fmt/format.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <map>
#include <random>
#include <set>
#include <string>

#include "scheduler/planner.h"

namespace agentrt {
namespace {

struct Scenario {
  Config config;
  Inventory inventory;
  // Unlimited CPUs, plenty of ports, no pins: only GPUs constrain the plan, so
  // the NVLink-domain guarantee can be checked against the final free state.
  bool only_gpus_constrain = false;
};

int Pick(std::mt19937_64& rng, std::initializer_list<int> choices) {
  std::uniform_int_distribution<size_t> d(0, choices.size() - 1);
  return *(choices.begin() + static_cast<std::ptrdiff_t>(d(rng)));
}
int Between(std::mt19937_64& rng, int lo, int hi) {
  return std::uniform_int_distribution<int>(lo, hi)(rng);
}
bool Chance(std::mt19937_64& rng, double p) { return std::bernoulli_distribution(p)(rng); }

std::vector<std::vector<int>> RandomDomains(std::mt19937_64& rng, int gpus) {
  std::vector<std::vector<int>> domains;
  if (gpus == 0) return domains;
  int size = gpus;
  if (gpus >= 2) size = Pick(rng, {gpus, gpus / 2, gpus >= 4 ? 2 : gpus / 2, 1});
  if (size < 1) size = 1;
  for (int g = 0; g < gpus; g += size) {
    std::vector<int> d;
    for (int k = g; k < std::min(gpus, g + size); ++k) d.push_back(k);
    domains.push_back(std::move(d));
  }
  return domains;
}

Scenario RandomScenario(std::mt19937_64& rng, bool only_gpus) {
  Scenario s;
  s.only_gpus_constrain = only_gpus;
  Config& c = s.config;
  const int nodes = Between(rng, 1, 12);
  for (int n = 0; n < nodes; ++n) {
    NodeSpec node;
    node.name = fmt::format("n{:02}", n);
    node.gpus = Pick(rng, {0, 1, 2, 4, 4, 8, 8, 8});
    node.cpus = only_gpus || Chance(rng, 0.3) ? 0 : Between(rng, 1, 32);
    node.nvlink_domains = RandomDomains(rng, node.gpus);
    c.cluster.nodes.push_back(std::move(node));
  }
  const int agents = Between(rng, 1, 30);
  c.cluster.ports.per_agent = Pick(rng, {1, 4, 16});
  c.cluster.ports.first = 20000;
  const int blocks = only_gpus ? agents + 2 : Between(rng, 2, agents + 2);
  c.cluster.ports.last =
      c.cluster.ports.first + blocks * c.cluster.ports.per_agent - 1 + Between(rng, 0, 3);
  if (!only_gpus && Chance(rng, 0.3))
    c.bus.port = Between(rng, c.cluster.ports.first, c.cluster.ports.last);
  for (int a = 0; a < agents; ++a) {
    AgentConfig agent;
    agent.name = fmt::format("agent-{}", a);
    agent.index = a;
    agent.gpus = Pick(rng, {0, 0, 1, 1, 1, 2, 2, 3, 4, 4, 6, 8, 16});
    agent.ranks = agent.gpus > 0 ? agent.gpus * Pick(rng, {1, 1, 2}) : Between(rng, 1, 4);
    if (!only_gpus && Chance(rng, 0.15)) {
      for (int k = Between(rng, 1, 3); k > 0; --k) {
        std::string pin =
            Chance(rng, 0.05) ? "ghost" : fmt::format("n{:02}", Between(rng, 0, nodes - 1));
        if (std::find(agent.nodes.begin(), agent.nodes.end(), pin) == agent.nodes.end())
          agent.nodes.push_back(pin);
      }
    }
    c.agents.push_back(std::move(agent));
  }
  s.inventory = InventoryFromCluster(c.cluster, "random");
  s.inventory.oversubscribe_cpus = !only_gpus && Chance(rng, 0.2);
  return s;
}

// Checks every guarantee; returns "" or the first violation.
std::string Violation(const Scenario& s, const Plan& plan) {
  const Config& c = s.config;
  const PortConfig& ports = c.cluster.ports;
  std::map<std::string, const NodeSpec*> nodes;
  for (const NodeSpec& n : s.inventory.nodes) nodes[n.name] = &n;
  if (plan.agents.size() != c.agents.size()) return "agent count differs";
  if (plan.bus.host != s.inventory.nodes.front().name) return "bus not on the first node";

  std::set<std::pair<std::string, int>> gpus_taken;
  std::map<std::pair<std::string, int>, std::string> port_owner;  // (node, port) → agent
  std::map<std::string, std::set<std::string>> agents_on_node;
  std::map<std::string, int> ranks_on_node;
  for (size_t i = 0; i < plan.agents.size(); ++i) {
    const AgentPlan& a = plan.agents[i];
    const AgentConfig& want = c.agents[i];
    const std::string who = a.name;
    if (a.name != want.name || a.index != static_cast<int>(i) || a.ranks != want.ranks ||
        a.gpus != want.gpus) {
      return who + ": identity differs from the config";
    }
    if (a.placement.empty()) return who + ": no placement";
    int gpu_count = 0;
    std::vector<int> all_ranks;
    int allowed_max_gpus = 0;
    for (const NodeSpec& n : s.inventory.nodes) {
      if (want.nodes.empty() || std::count(want.nodes.begin(), want.nodes.end(), n.name)) {
        allowed_max_gpus = std::max(allowed_max_gpus, n.gpus);
      }
    }
    for (const Placement& p : a.placement) {
      auto it = nodes.find(p.node);
      if (it == nodes.end()) return who + ": unknown node " + p.node;
      if (!want.nodes.empty() && !std::count(want.nodes.begin(), want.nodes.end(), p.node)) {
        return who + ": placed on " + p.node + " outside its pin list";
      }
      for (int g : p.gpus) {
        if (g < 0 || g >= it->second->gpus)
          return fmt::format("{}: GPU {} does not exist on {}", who, g, p.node);
        if (!gpus_taken.insert({p.node, g}).second)
          return fmt::format("{}: ({}, GPU {}) given twice", who, p.node, g);
      }
      gpu_count += static_cast<int>(p.gpus.size());
      if (want.gpus > 0 &&
          p.ranks.size() != p.gpus.size() * static_cast<size_t>(want.ranks / want.gpus)) {
        return who + ": ranks on a node do not match its GPUs";
      }
      if (want.gpus == 0 && !p.gpus.empty()) return who + ": a CPU agent got GPUs";
      all_ranks.insert(all_ranks.end(), p.ranks.begin(), p.ranks.end());
      agents_on_node[p.node].insert(who);
      ranks_on_node[p.node] += static_cast<int>(p.ranks.size());
      // Ports: the same block on every node of the agent, unique per node.
      for (int port = a.ports.first; port <= a.ports.last; ++port) {
        auto [owner, inserted] = port_owner.emplace(std::make_pair(p.node, port), who);
        if (!inserted)
          return fmt::format("{}: port {} on {} already given to {}", who, port, p.node,
                             owner->second);
      }
    }
    if (gpu_count != want.gpus) return who + ": wrong GPU count";
    std::sort(all_ranks.begin(), all_ranks.end());
    for (int r = 0; r < static_cast<int>(all_ranks.size()); ++r) {
      if (all_ranks[static_cast<size_t>(r)] != r ||
          static_cast<int>(all_ranks.size()) != want.ranks) {
        return who + ": ranks are not 0..ranks-1";
      }
    }
    if (a.ports.last - a.ports.first + 1 != ports.per_agent || a.ports.first < ports.first ||
        a.ports.last > ports.last || (a.ports.first - ports.first) % ports.per_agent != 0) {
      return who + ": port block outside the range or off the grid";
    }
    if (a.ports.node != a.placement[0].node || a.master_addr != a.placement[0].node ||
        a.master_port != a.ports.first) {
      return who + ": master address/port is not the first node's block";
    }
    if (plan.bus.host == a.placement[0].node ||
        std::any_of(a.placement.begin(), a.placement.end(),
                    [&](const Placement& p) { return p.node == plan.bus.host; })) {
      if (plan.bus.port >= a.ports.first && plan.bus.port <= a.ports.last)
        return who + ": block holds the bus port";
    }
    if (want.gpus > 0 && want.gpus <= allowed_max_gpus && a.placement.size() != 1)
      return who + ": a sub-node agent spans nodes";
    if (a.backend == GroupBackend::kAuto) return who + ": backend not resolved";
  }
  // Multi-node agents hold their nodes alone.
  for (size_t i = 0; i < plan.agents.size(); ++i) {
    const AgentPlan& a = plan.agents[i];
    if (a.placement.size() < 2) continue;
    for (const Placement& p : a.placement) {
      if (agents_on_node[p.node].size() != 1)
        return a.name + ": shares a whole node of a multi-node agent";
    }
  }
  // CPU slots.
  if (!s.inventory.oversubscribe_cpus) {
    for (const auto& [name, ranks] : ranks_on_node) {
      if (nodes[name]->cpus > 0 && ranks > nodes[name]->cpus)
        return fmt::format("{}: {} ranks on {} CPUs", name, ranks, nodes[name]->cpus);
    }
  }
  // NVLink: an agent split across domains only when no domain could hold it.
  if (s.only_gpus_constrain) {
    int largest_free_domain = 0;
    for (const NodeSpec& n : s.inventory.nodes) {
      bool whole = false;
      for (const AgentPlan& a : plan.agents) {
        if (a.placement.size() > 1 &&
            std::any_of(a.placement.begin(), a.placement.end(),
                        [&](const Placement& p) { return p.node == n.name; }))
          whole = true;
      }
      if (whole) continue;
      for (const std::vector<int>& d : n.nvlink_domains) {
        int free = 0;
        for (int g : d) free += gpus_taken.count({n.name, g}) ? 0 : 1;
        largest_free_domain = std::max(largest_free_domain, free);
      }
    }
    for (const AgentPlan& a : plan.agents) {
      if (a.placement.size() != 1 || a.gpus == 0) continue;
      const NodeSpec* n = nodes[a.placement[0].node];
      std::set<size_t> used;
      for (int g : a.placement[0].gpus) {
        for (size_t d = 0; d < n->nvlink_domains.size(); ++d) {
          if (std::count(n->nvlink_domains[d].begin(), n->nvlink_domains[d].end(), g))
            used.insert(d);
        }
      }
      if (used.size() > 1 && a.gpus <= largest_free_domain) {
        return fmt::format(
            "{}: split over {} NVLink domains though a domain with {} free GPUs is left", a.name,
            used.size(), largest_free_domain);
      }
    }
  }
  return "";
}

TEST_CASE("planner guarantees hold over thousands of random clusters and agent mixes") {
  std::mt19937_64 rng(20260101);
  int feasible = 0, infeasible = 0;
  for (int trial = 0; trial < 3000; ++trial) {
    const bool only_gpus = trial % 2 == 0;
    Scenario s = RandomScenario(rng, only_gpus);
    PlanResult r = MakePlan(s.config, s.inventory);
    INFO("trial " << trial);
    if (r.feasible()) {
      ++feasible;
      std::string v = Violation(s, r.plan());
      INFO(PlanToTable(r.plan()));
      REQUIRE(v == "");
      if (trial % 10 == 0) {
        PlanResult again = MakePlan(s.config, s.inventory);
        REQUIRE(again.feasible());
        REQUIRE(PlanToJsonString(again.plan()) == PlanToJsonString(r.plan()));  // deterministic
        Result<Plan> back = PlanFromJsonString(PlanToJsonString(r.plan()));
        REQUIRE(back.ok());
        REQUIRE(PlanToJsonString(*back) == PlanToJsonString(r.plan()));
      }
    } else {
      ++infeasible;
      const Infeasible& why = r.infeasible();
      REQUIRE_FALSE(why.agent.empty());
      REQUIRE(s.config.FindAgent(why.agent) != nullptr);
      REQUIRE_THAT(why.reason, Catch::Matchers::StartsWith(why.agent + " "));
      PlanResult again = MakePlan(s.config, s.inventory);
      REQUIRE_FALSE(again.feasible());
      REQUIRE(again.infeasible().reason == why.reason);
    }
  }
  // Both outcomes were exercised in earnest.
  CHECK(feasible > 500);
  CHECK(infeasible > 200);
}

TEST_CASE("power-of-two agents that fit are all placed, each inside one NVLink domain") {
  std::mt19937_64 rng(7);
  for (int trial = 0; trial < 1000; ++trial) {
    Scenario s;
    s.only_gpus_constrain = true;
    Config& c = s.config;
    const int nodes = Between(rng, 1, 16);
    for (int n = 0; n < nodes; ++n) {
      NodeSpec node;
      node.name = fmt::format("g{:03}", n);
      node.gpus = 8;
      node.nvlink_domains = {{0, 1, 2, 3}, {4, 5, 6, 7}};
      c.cluster.nodes.push_back(std::move(node));
    }
    int capacity = 8 * nodes;
    int used = 0;
    for (int a = 0; used < capacity; ++a) {
      int g = Pick(rng, {1, 1, 1, 2, 2, 4, 4, 8, 16});
      if (used + g > capacity) g = 1;
      if (Chance(rng, 0.05)) break;  // sometimes leave room
      AgentConfig agent;
      agent.name = fmt::format("a{}", a);
      agent.index = a;
      agent.gpus = g;
      agent.ranks = g;
      c.agents.push_back(std::move(agent));
      used += g;
    }
    if (c.agents.empty()) continue;
    c.cluster.ports.last = c.cluster.ports.first + 16 * (static_cast<int>(c.agents.size()) + 2);
    s.inventory = InventoryFromCluster(c.cluster);
    PlanResult r = MakePlan(c, s.inventory);
    INFO("trial " << trial << ": " << (r.feasible() ? "" : r.infeasible().reason));
    REQUIRE(r.feasible());
    REQUIRE(Violation(s, r.plan()) == "");
    for (const AgentPlan& a : r.plan().agents) {
      if (a.gpus > 4) continue;
      const std::vector<int>& g = a.placement[0].gpus;
      REQUIRE((g.back() < 4 || g.front() >= 4));  // one domain
    }
  }
}

}  // namespace
}  // namespace agentrt
