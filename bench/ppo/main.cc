// bench_ppo: PPO end-to-end training throughput on cartpole — env steps
// collected and learned from per second, rollout and update included — with
// 1 rank and with 2 ranks (MPI group; each rank has its own 8 envs, gradients
// averaged, so 2 ranks do twice the samples per update). Anchor: the 1-rank
// figure. Each figure is the median of 3 runs of 20 updates after 1 warm-up.
//
//   bench_ppo                         parent: runs both, prints the figures
//   bench_ppo --worker N_UPDATES      one rank of a world (single or under mpirun)
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "agent_runtime/group.h"
#include "bench/figure.h"
#include "learners/ppo_trainer.h"

namespace {

using agentrt::bench::Median;
using agentrt::bench::SelfPath;

constexpr int kUpdates = 20;

// Trains `updates` updates after one warm-up; returns the group's samples/s.
double Train(agentrt::Group& group, int updates) {
  const nlohmann::json args = {{"env", "cartpole"}, {"num_envs", 8},    {"rollout_steps", 128},
                               {"epochs", 4},       {"minibatches", 4}, {"seed", 1}};
  auto config = agentrt::PpoTrainerConfig::FromJson(args);
  auto trainer = config.ok()
                     ? agentrt::PpoTrainer::Make(*config, group)
                     : agentrt::Result<std::unique_ptr<agentrt::PpoTrainer>>(config.status());
  if (!trainer.ok()) {
    std::fprintf(stderr, "bench_ppo: %s\n", trainer.status().ToString().c_str());
    std::exit(1);
  }
  auto check = [](const agentrt::Status& s) {
    if (!s.ok()) {
      std::fprintf(stderr, "bench_ppo: %s\n", s.ToString().c_str());
      std::exit(1);
    }
  };
  check((*trainer)->Iterate(nullptr));
  check(group.Barrier());
  const int64_t before = (*trainer)->env_steps();
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < updates; ++i) check((*trainer)->Iterate(nullptr));
  check(group.Barrier());
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return static_cast<double>((*trainer)->env_steps() - before) / s;
}

int Worker(int updates) {
  agentrt::GroupOptions o;
  o.backend = agentrt::GroupBackend::kMpi;
  o.agent = "bench-ppo";
  auto group = agentrt::MakeGroup(o);
  if (!group.ok()) {
    std::fprintf(stderr, "bench_ppo: %s\n", group.status().ToString().c_str());
    return 1;
  }
  const double sps = Train(**group, updates);
  if ((*group)->rank() == 0) std::printf("samples_per_s %.1f\n", sps);
  return 0;
}

double TwoRanks() {
  const std::string cmd = std::string(AGENTRT_MPIEXEC) +
                          " --oversubscribe --allow-run-as-root -np 2 '" + SelfPath() +
                          "' --worker " + std::to_string(kUpdates);
  FILE* p = ::popen(cmd.c_str(), "r");
  if (p == nullptr) return 0.0;
  double sps = 0.0;
  char line[512];
  while (std::fgets(line, sizeof line, p) != nullptr) {
    if (std::sscanf(line, "samples_per_s %lf", &sps) != 1) std::fputs(line, stderr);
  }
  const int rc = ::pclose(p);
  if (rc != 0) std::fprintf(stderr, "bench_ppo: mpirun -np 2 exited with %d\n", rc);
  return rc == 0 ? sps : 0.0;
}

void Figure(const std::string& metric, double value, double anchor_value) {
  agentrt::bench::PrintFigure("ppo", metric, value, "samples/s",
                              "ppo_cartpole_samples_per_s_1_rank", anchor_value);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc >= 3 && std::strcmp(argv[1], "--worker") == 0) return Worker(std::atoi(argv[2]));
  ::setenv("OMPI_MCA_rmaps_base_oversubscribe", "1", 0);
  ::setenv("OMPI_MCA_btl_vader_single_copy_mechanism", "none", 0);
  // The group's collectives poll; on a machine with more runnable threads
  // than cores a rank that yields lets its peer run (measured: ~1.7x here).
  ::setenv("OMPI_MCA_mpi_yield_when_idle", "1", 0);
  std::vector<double> one, two;
  for (int rep = 0; rep < 3; ++rep) {
    auto group = agentrt::MakeSingleRankGroup("bench-ppo");
    one.push_back(Train(*group, kUpdates));
    two.push_back(TwoRanks());
  }
  std::fprintf(stderr, "bench_ppo: 1 rank %.0f samples/s, 2 ranks %.0f samples/s\n", Median(one),
               Median(two));
  Figure("ppo_cartpole_samples_per_s_1_rank", Median(one), Median(one));
  Figure("ppo_cartpole_samples_per_s_2_ranks", Median(two), Median(one));
  return 0;
}
