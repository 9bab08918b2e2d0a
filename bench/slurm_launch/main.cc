// bench_slurm_launch: time from submitting a run to the moment every rank of
// its 4 agents (two of 2 ranks x 2 GPUs, two of 1 rank x 1 GPU) is running,
// on a real SLURM (the test cluster, started here when SLURM_CONF is unset).
//
//   agentrt:  `agentctl sbatch agents.yaml -o DIR --submit`: plan, scripts,
//             credentials, the bus job, two job arrays, each task waiting for
//             the bus address, then `agentctl array-task` per rank.
//   anchor:   plain SLURM: one `sbatch` of a script that `srun --exact`s the
//             same four groups of no-op ranks (no bus, no plan).
//   alloc:    `agentctl run --backend slurm --detach agents.yaml`: plan on the live
//             cluster, one allocation whose batch shell is the run controller
//             (bus included), every agent a `srun --exact` step (same anchor).
// Each rank writes its start time (CLOCK_REALTIME) to a file and exits; the
// figure is the latest of those minus the submit time. Medians of --reps runs.
//
// Usage: bench_slurm_launch [--reps N]   (default 5)
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "bench/figure.h"
#include "slurm/command_runner.h"
#include "slurm/slurm_client.h"

namespace fs = std::filesystem;
using agentrt::slurm::CommandRunner;
using agentrt::slurm::SlurmClient;

using agentrt::bench::Median;

namespace {

constexpr int kRanks = 6;  // 2 + 2 + 1 + 1

double Now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "bench_slurm_launch: %s\n", what.c_str());
  std::exit(1);
}

void WriteFile(const fs::path& p, const std::string& text) {
  std::ofstream out(p);
  out << text;
  if (!out) Die("cannot write " + p.string());
}

std::string ReadFile(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// Waits (bounded) until `dir` holds kRanks start files; returns the latest time in them.
double WaitForRanks(const fs::path& dir, double timeout_s) {
  const double deadline = Now() + timeout_s;
  while (Now() < deadline) {
    std::vector<double> times;
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(dir, ec)) {
      if (e.path().extension() != ".start") continue;
      std::string t = ReadFile(e.path());
      if (!t.empty() && t.back() == '\n') times.push_back(std::atof(t.c_str()));
    }
    if (static_cast<int>(times.size()) >= kRanks)
      return *std::max_element(times.begin(), times.end());
    usleep(10 * 1000);
  }
  Die(fmt::format("not every rank started within {} s (see {})", timeout_s, dir.string()));
}

// The rank: note the start time, exit. Written atomically (rename) so the
// reader never sees half a number.
constexpr const char* kRank = R"sh(#!/bin/bash
f="$1/${2:-$AGENTRT_AGENT}.${SLURM_PROCID}"
date +%s.%N >"$f.tmp" && mv "$f.tmp" "$f.start"
)sh";

}  // namespace

int main(int argc, char** argv) {
  int reps = 5;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--reps" && i + 1 < argc) {
      reps = std::max(1, std::atoi(argv[++i]));
    } else {
      Die("usage: bench_slurm_launch [--reps N]");
    }
  }
  const std::string self = agentrt::bench::SelfPath();
  if (self.empty()) Die("cannot find my own path");
  const fs::path bin = fs::path(self).parent_path().parent_path() / "bin";
  if (!fs::exists(bin / "agentctl") || !fs::exists(bin / "agentrt-bus")) {
    Die("build agentctl and agentrt-bus first (looked in " + bin.string() + ")");
  }

  char tmpl[] = "/tmp/agentrt-bench-slurm.XXXXXX";
  if (mkdtemp(tmpl) == nullptr) Die("mkdtemp failed");
  const fs::path work(tmpl);
  auto runner = agentrt::slurm::MakeProcessRunner();

  // A cluster of our own unless one is given.
  std::string cluster_dir;
  if (std::getenv("SLURM_CONF") == nullptr) {
    cluster_dir = (work / "cluster").string();
    auto up = runner->Run(
        {std::string(AGENTRT_SOURCE_DIR) + "/slurm/testcluster/start.sh", cluster_dir}, 180);
    if (!up.ok() || up->exit_code != 0) {
      Die("the SLURM test cluster did not start: " + (up.ok() ? up->err : up.status().message()));
    }
    setenv("SLURM_CONF", (fs::path(cluster_dir) / "slurm.conf").c_str(), 1);
  }
  auto stop_cluster = [&] {
    if (!cluster_dir.empty()) {
      (void)runner->Run(
          {std::string(AGENTRT_SOURCE_DIR) + "/slurm/testcluster/stop.sh", cluster_dir}, 120);
    }
  };
  SlurmClient slurm(*runner, {60, 0.2});

  WriteFile(work / "rank.sh", kRank);
  WriteFile(work / "agents.yaml", fmt::format(R"(run: {{name: bench, dir: {work}}}
slurm: {{time: "00:05:00"}}
agents:
  - {{name: big, replicas: 2, gpus: 2, ranks: 2, command: [bash, {work}/rank.sh, {work}/seen]}}
  - {{name: small, replicas: 2, gpus: 1, ranks: 1, command: [bash, {work}/rank.sh, {work}/seen]}}
)",
                                              fmt::arg("work", work.string())));
  WriteFile(work / "plain.sbatch",
            fmt::format(R"sh(#!/bin/bash
#SBATCH --job-name=plain
#SBATCH --ntasks={ranks}
#SBATCH --cpus-per-task=1
#SBATCH --gres=gpu:{ranks}
#SBATCH --output={work}/plain-%j.out
seen={work}/seen
srun --exact -n2 --gres=gpu:2 bash {work}/rank.sh "$seen" big-0 &
srun --exact -n2 --gres=gpu:2 bash {work}/rank.sh "$seen" big-1 &
srun --exact -n1 --gres=gpu:1 bash {work}/rank.sh "$seen" small-0 &
srun --exact -n1 --gres=gpu:1 bash {work}/rank.sh "$seen" small-1 &
wait
)sh",
                        fmt::arg("ranks", kRanks), fmt::arg("work", work.string())));

  std::vector<double> agentrt_s, plain_s, alloc_s;
  for (int r = 0; r < reps; ++r) {
    // agentrt: sbatch generation + submission, through to every rank running.
    {
      fs::path run = work / fmt::format("run{}", r);
      fs::path seen = work / "seen";
      fs::remove_all(seen);
      fs::create_directories(seen);
      double t0 = Now();
      auto out =
          runner->Run({(bin / "agentctl").string(), "sbatch", (work / "agents.yaml").string(), "-o",
                       run.string(), "--submit", "--bus-wait", "60"},
                      120);
      if (!out.ok() || out->exit_code != 0) {
        stop_cluster();
        Die("agentctl sbatch --submit failed: " + (out.ok() ? out->err : out.status().message()));
      }
      double t1 = WaitForRanks(seen, 120);
      agentrt_s.push_back(t1 - t0);
      std::vector<std::string> jobs;
      std::stringstream ids(ReadFile(run / "arrays.jobids"));
      for (std::string id; ids >> id;) jobs.push_back(id);
      auto done = slurm.WaitForJobs(jobs, 120);
      if (!done.ok()) Die(done.status().message());
      std::string bus = ReadFile(run / "bus.jobid");
      bus.erase(bus.find_last_not_of(" \n") + 1);
      (void)slurm.WaitForJobs({bus}, 60);
    }
    // agentctl run --backend slurm: plan, run dir, allocation, controller, steps.
    {
      fs::path seen = work / "seen";
      fs::remove_all(seen);
      fs::create_directories(seen);
      double t0 = Now();
      auto out = runner->Run({(bin / "agentctl").string(), "run", "--backend", "slurm", "--detach",
                              (work / "agents.yaml").string()},
                             120);
      if (!out.ok() || out->exit_code != 0) {
        stop_cluster();
        Die("agentctl run --backend slurm failed: " +
            (out.ok() ? out->out + out->err : out.status().message()));
      }
      double t1 = WaitForRanks(seen, 120);
      alloc_s.push_back(t1 - t0);
      const std::string key = "submitted job ";
      const size_t at = out->out.find(key);
      if (at == std::string::npos) Die("no job id in: " + out->out);
      const std::string job =
          out->out.substr(at + key.size(), out->out.find(' ', at + key.size()) - at - key.size());
      auto done = slurm.WaitForJobs({job}, 120);
      if (!done.ok()) Die(done.status().message());
    }
    // Anchor: plain sbatch of srun steps.
    {
      fs::path seen = work / "seen";
      fs::remove_all(seen);
      fs::create_directories(seen);
      double t0 = Now();
      auto id = slurm.Submit((work / "plain.sbatch").string(), {});
      if (!id.ok()) Die(id.status().message());
      double t1 = WaitForRanks(seen, 120);
      plain_s.push_back(t1 - t0);
      auto done = slurm.WaitForJobs({*id}, 120);
      if (!done.ok()) Die(done.status().message());
    }
    std::fprintf(
        stderr, "rep %d: agentrt sbatch %.3f s, agentrt run --backend slurm %.3f s, plain %.3f s\n",
        r, agentrt_s.back(), alloc_s.back(), plain_s.back());
  }
  stop_cluster();
  fs::remove_all(work);

  double a = Median(agentrt_s);
  double p = Median(plain_s);
  const char* anchor = "plain sbatch script srun-ing the same 6 ranks";
  agentrt::bench::PrintFigure("slurm_launch", "sbatch_array_submit_to_all_ranks_running", a, "s",
                              anchor, p);
  const double al = Median(alloc_s);
  agentrt::bench::PrintFigure("slurm_launch", "run_backend_slurm_submit_to_all_ranks_running", al,
                              "s", anchor, p);
  return 0;
}
