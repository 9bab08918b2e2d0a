// bench/dashboard: a big run's dashboard, served by the real server and read
// over HTTP, each figure with its anchor from the same run.
//
//   load       200 agents and 1,000,000 metric points (metrics.jsonl): the
//              first page load's API calls (run view + the chart's series,
//              decimated), cold index; anchor: reading the same files once
//   again      the same calls once the index is warm; anchor: the goal, 1 s
//   idle_cpu   the dashboard's CPU while nobody looks, % of a core over 5 s;
//              anchor: the goal, 2 %
//
//   bench_dashboard [--quick]
#include <httplib.h>
#include <sys/resource.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

#include "bench/figure.h"
#include "dashboard/server.h"
#include "plan/plan.h"
#include "plan/run_dir.h"
#include "scheduler/status.h"

namespace {

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double CpuSeconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e6;
}

void Figure(const char* metric, double value, const char* unit, const char* anchor,
            double anchor_value) {
  agentrt::bench::PrintFigure("dashboard", metric, value, unit, anchor, anchor_value);
}

[[noreturn]] void Die(const std::string& why) {
  std::fprintf(stderr, "bench_dashboard: %s\n", why.c_str());
  std::exit(1);
}

}  // namespace

int main(int argc, char** argv) {
  const bool quick = argc > 1 && std::string(argv[1]) == "--quick";
  const int agents = 200;
  const int64_t points = quick ? 200000 : 1000000;
  const int metrics_per_line = 5;
  char tmpl[] = "/tmp/agentrt-bench-dashboard.XXXXXX";
  if (::mkdtemp(tmpl) == nullptr) Die("mkdtemp failed");
  const std::string dir = tmpl;
  const agentrt::RunDir run(dir);

  agentrt::Plan plan;
  plan.run = "big";
  plan.run_dir = dir;
  agentrt::RunStatus status;
  status.run = "big";
  status.run_dir = dir;
  status.started_unix_s = 1.0;
  status.updated_unix_s = 2.0;
  for (int i = 0; i < agents; ++i) {
    agentrt::AgentPlan a;
    a.name = "agent-" + std::to_string(i);
    a.index = i;
    a.ranks = 8;
    a.placement.push_back(
        {"node" + std::to_string(i / 1), {0, 1, 2, 3, 4, 5, 6, 7}, {0, 1, 2, 3, 4, 5, 6, 7}});
    a.ports = {"node" + std::to_string(i), 20000 + 16 * i, 20015 + 16 * i};
    a.command = {"agent-worker"};
    a.checkpoint_dir = "checkpoints/" + a.name;
    plan.agents.push_back(a);
    agentrt::AgentStatus s;
    s.name = a.name;
    s.state = agentrt::AgentState::kRunning;
    s.step = 1000;
    for (int r = 0; r < 8; ++r)
      s.ranks.push_back({r, 1000 + r, "node" + std::to_string(i), {}, 1.5});
    status.agents.push_back(s);
  }
  if (auto s = agentrt::WriteRunPlan(plan, run.path()); !s.ok()) Die(s.ToString());
  if (auto s = agentrt::WriteRunStatusFile(status, run.StatusPath()); !s.ok()) Die(s.ToString());
  {
    std::ofstream f(run.MetricsPath());
    const int64_t lines = points / metrics_per_line;
    for (int64_t l = 0; l < lines; ++l) {
      const int a = static_cast<int>(l % agents);
      const int64_t step = l / agents;
      f << "{\"agent\":\"agent-" << a << "\",\"metrics\":{\"loss\":" << 1.0 / (step + 1)
        << ",\"reward\":" << step * 0.01 << ",\"entropy\":1.2,\"kl\":0.001,\"lr\":0.0003},"
        << "\"rank\":0,\"run_time\":" << step << ",\"step\":" << step
        << ",\"time\":1796150000.5}\n";
    }
  }
  const auto bytes = std::filesystem::file_size(run.MetricsPath());

  auto dash = agentrt::Dashboard::Start(dir, {});
  if (!dash.ok()) Die(dash.status().ToString());
  httplib::Client client("127.0.0.1", (*dash)->port());
  client.set_read_timeout(60, 0);
  auto load = [&] {
    const double t0 = Now();
    for (const char* path :
         {"/", "/api/run", "/api/names", "/api/series?metric=reward&points=1000"}) {
      auto r = client.Get(path);
      if (!r || r->status != 200) Die(std::string("GET ") + path + " failed");
    }
    return Now() - t0;
  };
  double read_s = 0;
  {
    const double t0 = Now();
    std::ifstream f(run.MetricsPath(), std::ios::binary);
    std::string all((std::istreambuf_iterator<char>(f)), {});
    read_s = Now() - t0;
    if (all.size() != bytes) Die("short read");
  }
  const double cold = load();
  double warm = 1e9;
  for (int i = 0; i < 5; ++i) warm = std::min(warm, load());
  const double c0 = CpuSeconds(), w0 = Now();
  std::this_thread::sleep_for(std::chrono::seconds(quick ? 2 : 5));
  const double idle = (CpuSeconds() - c0) / (Now() - w0) * 100.0;
  (*dash)->Stop();
  std::filesystem::remove_all(dir);
  std::fprintf(stderr,
               "bench_dashboard: %d agents, %lld points (%.0f MB of metrics.jsonl): first load "
               "%.3f s, warm %.3f s, idle %.2f%% of a core\n",
               agents, static_cast<long long>(points), static_cast<double>(bytes) / 1e6, cold, warm,
               idle);
  Figure("first_load_200_agents_1M_points", cold, "s", "read_metrics_file_once", read_s);
  Figure("warm_load_200_agents_1M_points", warm, "s", "goal", 1.0);
  Figure("idle_cpu", idle, "% of a core", "goal", 2.0);
  return 0;
}
