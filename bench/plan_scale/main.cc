// bench_plan_scale: plan 10,000 agents of mixed sizes (1, 2, 4, 8, 16 GPUs) on
// 2,000 nodes x 8 GPUs with two 4-GPU NVLink domains each (16,000 GPUs, all
// of them asked for), and report
//   - planning time, median of several runs, against the anchor: SLURM's
//     scheduler is documented at about 500 jobs/s, so 10,000 placements take
//     it ~20 s (a documented figure: a SLURM controller cannot be timed here);
//   - the share of sub-node agents (<= 4 GPUs) kept inside one NVLink domain
//     (goal: 100% when the total fits).
// The same at ten times the size (100,000 agents on 20,000 nodes) shows how
// planning grows (goal: under 200 ms).
// Usage: bench_plan_scale [runs=5]
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "bench/figure.h"
#include "scheduler/planner.h"

namespace {

using agentrt::AgentConfig;
using agentrt::Config;
using agentrt::NodeSpec;

// `scale` times 2,000 nodes and 10,000 agents.
Config MakeConfig(int scale) {
  Config c;
  c.run.name = "plan-scale";
  for (int n = 0; n < 2000 * scale; ++n) {
    NodeSpec node;
    node.name = fmt::format("gpu{:05}", n + 1);
    node.gpus = 8;
    node.cpus = 64;
    node.nvlink_domains = {{0, 1, 2, 3}, {4, 5, 6, 7}};
    c.cluster.nodes.push_back(std::move(node));
  }
  // 50x16 + 150x8 + 700x4 + 2100x2 + 7000x1 = 16,000 GPUs in 10,000 agents.
  std::vector<int> sizes;
  for (auto [gpus, count] : {std::pair{16, 50}, {8, 150}, {4, 700}, {2, 2100}, {1, 7000}}) {
    sizes.insert(sizes.end(), static_cast<size_t>(count * scale), gpus);
  }
  std::shuffle(sizes.begin(), sizes.end(), std::mt19937_64(42));
  for (size_t i = 0; i < sizes.size(); ++i) {
    AgentConfig a;
    a.name = fmt::format("agent-{}", i);
    a.base_name = "agent";
    a.replica = static_cast<int>(i);
    a.index = static_cast<int>(i);
    a.gpus = sizes[i];
    a.ranks = sizes[i];
    a.command = {"agent-worker"};
    c.agents.push_back(std::move(a));
  }
  return c;
}

// Plans `scale` x 10,000 agents `runs` times; prints the figures.
void Measure(int scale, int runs) {
  const Config config = MakeConfig(scale);
  const agentrt::Inventory inventory = agentrt::InventoryFromCluster(config.cluster, "bench");

  std::vector<double> ms;
  agentrt::Plan plan;
  for (int r = 0; r < runs; ++r) {
    auto start = std::chrono::steady_clock::now();
    agentrt::PlanResult result = agentrt::MakePlan(config, inventory);
    auto end = std::chrono::steady_clock::now();
    if (!result.feasible()) {
      std::fprintf(stderr, "bench_plan_scale: infeasible: %s\n",
                   result.infeasible().reason.c_str());
      std::exit(1);
    }
    ms.push_back(std::chrono::duration<double, std::milli>(end - start).count());
    if (r == 0) plan = std::move(result).plan();
  }
  std::sort(ms.begin(), ms.end());
  const double median = ms[ms.size() / 2];

  int sub_node = 0, in_one_domain = 0;
  for (const agentrt::AgentPlan& a : plan.agents) {
    if (a.gpus > 4) continue;
    ++sub_node;
    const std::vector<int>& g = a.placement.at(0).gpus;
    if (a.placement.size() == 1 && (g.back() < 4 || g.front() >= 4)) ++in_one_domain;
  }
  const double share = 100.0 * in_one_domain / std::max(1, sub_node);

  std::printf(
      "planned %zu agents on %zu nodes (%d GPUs) %d times: min %.1f ms, median %.1f ms, max %.1f "
      "ms\n",
      plan.agents.size(), inventory.nodes.size(), 16000 * scale, runs, ms.front(), median,
      ms.back());
  std::printf("sub-node agents inside one NVLink domain: %d of %d\n", in_one_domain, sub_node);
  const int agents = 10000 * scale;
  const double anchor_ms = agents / 500.0 * 1000.0;  // SLURM ~500 jobs/s (documented)
  const std::string size = scale == 1 ? "10k_agents_2k_nodes" : "100k_agents_20k_nodes";
  agentrt::bench::PrintFigure("plan_scale", "plan_" + size, median, "ms",
                              "slurm_scheduler_500_jobs_per_s_documented", anchor_ms);
  agentrt::bench::PrintFigure("plan_scale", "subnode_agents_in_one_nvlink_domain_" + size, share,
                              "%", "goal_all_when_total_fits", 100.0);
}

}  // namespace

int main(int argc, char** argv) {
  const int runs = argc > 1 ? std::max(1, std::atoi(argv[1])) : 5;
  Measure(1, runs);
  Measure(10, std::max(1, runs / 2));
  return 0;
}
