// bench_launch — how fast `agentctl run` brings a run up, and what supervising
// it costs.
//
//   1. launch: time from starting `agentctl run` (8 agents x 2 ranks) until
//      every one of the 16 ranks has sent its first heartbeat — as CPU agents
//      (8 mpiruns, the default for multi-rank CPU agents) and as GPU agents on
//      a fake-GPU inventory (16 processes spawned directly) —
//      against `mpirun -np 16` of the same no-op program (the anchor), both
//      measured here by a probe socket every rank also reports to. Median of
//      --reps runs each.
//   2. controller CPU: agentctl's own CPU time (utime+stime from /proc) over
//      --cpu-window-s seconds while the 16 ranks heartbeat once a second, in %
//      of one core, against the goal of 2 %.
//
// With --noop-agent this binary is the agent: it sends "hello" and a heartbeat
// to AGENTRT_TELEMETRY (when set) and to BENCH_PROBE, then heartbeats every
// second until SIGTERM.
#include <fmt/format.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "bench/figure.h"
#include "comms/telemetry.h"
#include "scheduler/process.h"

namespace {
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

using agentrt::bench::Median;

std::atomic<bool> g_stop{false};
void OnTerm(int) { g_stop.store(true); }

std::string Env(const char* name, const char* fallback = "") {
  const char* v = std::getenv(name);
  return v != nullptr ? v : fallback;
}

int NoopAgent() {
  signal(SIGTERM, OnTerm);
  signal(SIGINT, OnTerm);
  agentrt::TelemetryMessage m;
  m.agent = Env("AGENTRT_AGENT", "mpirun");
  m.rank = std::atoi(Env("RANK", Env("OMPI_COMM_WORLD_RANK", "0").c_str()).c_str());
  m.restart_count = std::atoi(Env("AGENTRT_RESTART_COUNT", "0").c_str());
  m.pid = ::getpid();
  m.step = 0;
  std::vector<std::unique_ptr<agentrt::TelemetrySender>> senders;
  for (const std::string& endpoint : {Env("AGENTRT_TELEMETRY"), Env("BENCH_PROBE")}) {
    if (endpoint.empty()) continue;
    auto s = agentrt::TelemetrySender::Connect(endpoint);
    if (!s.ok()) {
      std::fprintf(stderr, "noop agent: %s\n", s.status().ToString().c_str());
      return 2;
    }
    senders.push_back(std::move(*s));
  }
  auto send = [&](agentrt::TelemetryType type) {
    m.type = type;
    m.time = agentrt::UnixTimeSeconds();
    for (auto& s : senders) s->Send(m);
  };
  send(agentrt::TelemetryType::kHello);
  while (!g_stop.load()) {
    send(agentrt::TelemetryType::kHeartbeat);
    for (int i = 0; i < 10 && !g_stop.load(); ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  send(agentrt::TelemetryType::kBye);
  return 0;
}

// Waits until `want` distinct (agent, rank) hellos arrived at the probe; seconds, or -1.
double WaitForRanks(agentrt::TelemetryReceiver& probe, size_t want, Clock::time_point start,
                    double timeout_s) {
  std::set<std::pair<std::string, int>> seen;
  while (seen.size() < want) {
    if (std::chrono::duration<double>(Clock::now() - start).count() > timeout_s) return -1;
    auto msgs = probe.Poll(std::chrono::milliseconds(20));
    if (!msgs.ok()) continue;
    for (const auto& m : *msgs) seen.insert({m.agent, m.rank});
  }
  return std::chrono::duration<double>(Clock::now() - start).count();
}

void Drain(agentrt::TelemetryReceiver& probe) {
  for (int i = 0; i < 5; ++i) (void)probe.Poll(std::chrono::milliseconds(10));
}

void StopAndReap(pid_t pid, int sig) {
  ::kill(pid, sig);
  const auto deadline = Clock::now() + std::chrono::seconds(30);
  int status = 0;
  while (::waitpid(pid, &status, WNOHANG) == 0) {
    if (Clock::now() > deadline) {
      ::kill(-pid, SIGKILL);
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      return;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

// utime + stime of `pid`, seconds.
double CpuSeconds(pid_t pid) {
  std::FILE* f = std::fopen(("/proc/" + std::to_string(pid) + "/stat").c_str(), "r");
  if (f == nullptr) return 0;
  char buf[1024] = {};
  const size_t n = std::fread(buf, 1, sizeof buf - 1, f);
  std::fclose(f);
  const char* close = std::strrchr(buf, ')');
  if (n == 0 || close == nullptr) return 0;
  unsigned long utime = 0, stime = 0;
  // Fields after "pid (comm)": state ppid pgrp session tty tpgid flags minflt cminflt majflt
  // cmajflt utime stime
  if (std::sscanf(close + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu", &utime,
                  &stime) != 2)
    return 0;
  return static_cast<double>(utime + stime) / static_cast<double>(::sysconf(_SC_CLK_TCK));
}

}  // namespace

int main(int argc, char** argv) {
  bool noop = false;
  int reps = 3;
  int agents = 8;
  int ranks = 2;
  double cpu_window_s = 10;
  std::string agentctl = agentrt::SelfExecutableDir() + "/../bin/agentctl";
  // --noop-agent: be the no-op agent (used by the benchmark itself)
  // --reps N (runs of each launcher; median), --agents N, --ranks N,
  // --cpu-window-s S (window of the controller CPU measurement), --agentctl PATH
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const bool has_value = i + 1 < argc;
    if (a == "--noop-agent") {
      noop = true;
    } else if (a == "--reps" && has_value) {
      reps = std::atoi(argv[++i]);
    } else if (a == "--agents" && has_value) {
      agents = std::atoi(argv[++i]);
    } else if (a == "--ranks" && has_value) {
      ranks = std::atoi(argv[++i]);
    } else if (a == "--cpu-window-s" && has_value) {
      cpu_window_s = std::atof(argv[++i]);
    } else if (a == "--agentctl" && has_value) {
      agentctl = argv[++i];
    } else {
      std::fprintf(stderr,
                   "usage: bench_launch [--reps N] [--agents N] [--ranks N] [--cpu-window-s S] "
                   "[--agentctl PATH]\n");
      return 2;
    }
  }
  if (noop) return NoopAgent();

  const int total = agents * ranks;
  const std::string self = fs::canonical("/proc/self/exe").string();
  agentctl = fs::weakly_canonical(agentctl).string();
  auto mpirun = agentrt::ResolveExecutable("mpirun", Env("PATH"), {});
  if (!mpirun.ok() || !fs::exists(agentctl)) {
    std::fprintf(stderr, "bench_launch: needs mpirun and %s\n", agentctl.c_str());
    return 1;
  }
  const fs::path work = fs::temp_directory_path() / ("bench_launch-" + std::to_string(::getpid()));
  fs::create_directories(work);
  auto probe = agentrt::TelemetryReceiver::Bind("tcp://127.0.0.1:*");
  if (!probe.ok()) {
    std::fprintf(stderr, "bench_launch: %s\n", probe.status().ToString().c_str());
    return 1;
  }
  const std::string probe_endpoint = (*probe)->endpoint();
  ::setenv("BENCH_PROBE", probe_endpoint.c_str(), 1);

  // The anchor: one mpirun of all 16 ranks.
  std::vector<double> anchor_s;
  for (int r = 0; r < reps; ++r) {
    Drain(**probe);
    const auto start = Clock::now();
    const pid_t pid = agentrt::bench::SpawnLogged(
        {*mpirun, "--oversubscribe", "--allow-run-as-root", "--bind-to", "none", "-np",
         std::to_string(total), "-x", "BENCH_PROBE", self, "--noop-agent"},
        (work / "mpirun.log").string());
    const double t = WaitForRanks(**probe, static_cast<size_t>(total), start, 60);
    StopAndReap(pid, SIGTERM);
    if (t < 0) {
      std::fprintf(stderr,
                   "bench_launch: mpirun -np %d: not every rank reported within 60 s (see %s)\n",
                   total, (work / "mpirun.log").c_str());
      return 1;
    }
    anchor_s.push_back(t);
    std::fprintf(stderr, "mpirun -np %d: all ranks up in %.1f ms\n", total, t * 1e3);
  }

  // agentctl run, two ways: CPU agents (each its own `mpirun -np 2` world, the
  // default for multi-rank CPU agents) and GPU agents on a fake-GPU inventory
  // (ranks spawned directly, one process each; the no-op agent touches no GPU).
  const std::string inventory = (work / "inventory.yaml").string();
  {
    std::ofstream inv(inventory);
    inv << "cluster:\n  nodes:\n    - {name: localhost, gpus: " << total << ", cpus: " << total
        << "}\n";
  }
  struct Variant {
    std::string name;
    int gpus;
    std::vector<double> up_s;
    std::vector<double> cpu_pct;
  };
  std::vector<Variant> variants = {{"mpirun", 0, {}, {}}, {"direct", ranks, {}, {}}};
  for (auto& v : variants) {
    const std::string yaml_path = (work / (v.name + ".yaml")).string();
    {
      std::ofstream y(yaml_path);
      y << "run: {name: bench, dir: " << (work / "runs").string() << "}\n"
        << "defaults:\n  restart: {max_restarts: 0, heartbeat_timeout_s: 60, grace_s: 5}\n"
        << "agents:\n  - name: noop\n    replicas: " << agents << "\n    gpus: " << v.gpus
        << "\n    ranks: " << ranks << "\n    command: [" << self
        << ", --noop-agent]\n    env: {BENCH_PROBE: \"" << probe_endpoint << "\"}\n";
    }
    for (int r = 0; r < reps; ++r) {
      Drain(**probe);
      const auto start = Clock::now();
      std::vector<std::string> cmd = {agentctl, "run", yaml_path, "--quiet"};
      if (v.gpus > 0) cmd.insert(cmd.end(), {"--cluster", inventory});
      const pid_t pid = agentrt::bench::SpawnLogged(cmd, (work / "agentctl.log").string());
      const double t = WaitForRanks(**probe, static_cast<size_t>(total), start, 60);
      if (t < 0) {
        StopAndReap(pid, SIGTERM);
        std::fprintf(
            stderr,
            "bench_launch: agentctl run (%s): not every rank reported within 60 s (see %s)\n",
            v.name.c_str(), (work / "agentctl.log").c_str());
        return 1;
      }
      v.up_s.push_back(t);
      std::fprintf(stderr, "agentctl run (%d x %d, %s): all ranks up in %.1f ms\n", agents, ranks,
                   v.name.c_str(), t * 1e3);
      if (r == 0) {  // CPU use once per variant, over a window after start-up settled
        std::this_thread::sleep_for(std::chrono::seconds(2));
        const double c0 = CpuSeconds(pid);
        const auto w0 = Clock::now();
        std::this_thread::sleep_for(
            std::chrono::milliseconds(static_cast<int64_t>(cpu_window_s * 1000)));
        const double c1 = CpuSeconds(pid);
        const double wall = std::chrono::duration<double>(Clock::now() - w0).count();
        v.cpu_pct.push_back(100.0 * (c1 - c0) / wall);
        std::fprintf(stderr,
                     "controller CPU while %d ranks heartbeat: %.2f %% of a core over %.1f s\n",
                     total, v.cpu_pct.back(), wall);
      }
      StopAndReap(pid, SIGTERM);
    }
  }
  fs::remove_all(work);

  const double anchor_ms = Median(anchor_s) * 1e3;
  for (const auto& v : variants) {
    const double ms = Median(v.up_s) * 1e3;
    agentrt::bench::PrintFigure(
        "launch", fmt::format("time_to_first_heartbeat_all_ranks_{}x{}_{}", agents, ranks, v.name),
        ms, "ms", fmt::format("mpirun -np {} (same no-op program)", total), anchor_ms);
  }
  const double cpu = Median(variants[0].cpu_pct);
  agentrt::bench::PrintFigure("launch", fmt::format("controller_cpu_{}_ranks_heartbeating", total),
                              cpu, "% of one core", "goal: 2% of one core", 2.0);
  return 0;
}
