// bench_scale — how the controller's cost grows with the number of agents.
//
//   1. Real agents (--real, e.g. 100,1000,2000): `agentctl run` of N
//      agentrt-test-agent agents (1 rank each; a step, a metrics report and a
//      heartbeat a second, a checkpoint every 5 s). Figures: the launch rate
//      (agents per second from start until every agent has reported, read from
//      status.json) against plain fork/exec of the same binary N times (the
//      anchor, same run), and agentctl's CPU (ms per agent-second) and RSS
//      (KiB per agent) over --window-s seconds once all run.
//   2. Simulated agents (--simulated, e.g. 1000,10000): the real controller
//      (RunDriver: telemetry intake with signature checks, supervision,
//      status.json, metrics.jsonl) with the spawner faked; a load generator
//      process (this binary with --generate) speaks the real telemetry
//      protocol with each agent's real token: per agent and second a
//      heartbeat and a metrics report, a checkpoint every 5 s. Figures: CPU
//      per agent-second and RSS per agent of this process (the controller),
//      and messages accepted against messages sent. While the run goes on,
//      the views of it are timed (median of 3): `agentctl status` (text and
//      --json), the dashboard's page load (the page, /api/run, /api/names
//      and one metric's series for the table's first page of agents, as the
//      page asks for them; cold: the dashboard's first, which reads the
//      run's whole metrics history) and /metrics, and
//      `agentctl export --csv` of the run's metrics (goal: 1 s each).
//   3. Agents that report 100 times a second (--flood N, real): N test agents
//      stepping every 10 ms with a metrics report per step. Figures: the
//      slowest agent's steps per second against the slowest of the same
//      agents, same run, reporting every 100th step (the sender never waits
//      for the controller, so back-pressure must not slow it; the anchor
//      holds the sleep's overshoot and the CPU the agents share), and
//      agentctl's RSS against the same count at one report a second.
// Every figure says whether it comes from real or simulated agents.
#include <fcntl.h>
#include <fmt/format.h>
#include <httplib.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zmq.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "bench/figure.h"
#include "common/clock.h"
#include "common/file_util.h"
#include "comms/auth.h"
#include "comms/telemetry.h"
#include "dashboard/server.h"
#include "plan/run_dir.h"
#include "scheduler/loader.h"
#include "scheduler/run_driver.h"
#include "scheduler/status.h"

namespace {
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using agentrt::bench::PrintFigure;

[[noreturn]] void Die(const std::string& why) {
  std::fprintf(stderr, "bench_scale: %s\n", why.c_str());
  std::exit(1);
}

double Seconds(Clock::time_point since) {
  return std::chrono::duration<double>(Clock::now() - since).count();
}

std::vector<int> Sizes(const std::string& list) {
  std::vector<int> out;
  std::stringstream in(list);
  for (std::string item; std::getline(in, item, ',');)
    if (!item.empty()) out.push_back(std::stoi(item));
  return out;
}

// utime + stime of a process, seconds.
double ProcessCpuSeconds(pid_t pid) {
  const std::string text = agentrt::ReadWholeFile(fmt::format("/proc/{}/stat", pid)).value_or("");
  const size_t close = text.rfind(')');
  if (close == std::string::npos) return 0;
  std::istringstream fields(text.substr(close + 2));
  std::string f;
  double ticks = 0;
  for (int i = 3; fields >> f; ++i) {
    if (i == 14 || i == 15) ticks += std::stod(f);
    if (i == 15) break;
  }
  return ticks / static_cast<double>(::sysconf(_SC_CLK_TCK));
}

double RssKiB(pid_t pid) {
  std::ifstream in(fmt::format("/proc/{}/status", pid));
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stod(line.substr(6));
  }
  return 0;
}

pid_t Spawn(const std::vector<std::string>& argv, const std::string& log) {
  const pid_t pid = agentrt::bench::SpawnLogged(argv, log);
  if (pid < 0) Die("fork");
  return pid;
}

// The anchor: N plain fork/execs of `binary --help`, all started at once,
// until every one has exited. Processes per second.
double ForkExecRate(const std::string& binary, int n) {
  const auto t0 = Clock::now();
  std::vector<pid_t> pids;
  for (int i = 0; i < n; ++i) {
    const pid_t pid = ::fork();
    if (pid < 0) Die("fork");
    if (pid == 0) {
      const int null = ::open("/dev/null", O_WRONLY);
      ::dup2(null, 1);
      ::dup2(null, 2);
      ::execl(binary.c_str(), binary.c_str(), "--help", static_cast<char*>(nullptr));
      ::_exit(127);
    }
    pids.push_back(pid);
  }
  for (pid_t pid : pids) {
    int status = 0;
    ::waitpid(pid, &status, 0);
  }
  return n / Seconds(t0);
}

// How many agents of status.json have a rank that reported (-1: unreadable).
int AgentsHeard(const std::string& status_path) {
  auto status = agentrt::ReadRunStatusFile(status_path);
  if (!status.ok()) return -1;
  return static_cast<int>(
      std::count_if(status->agents.begin(), status->agents.end(), [](const auto& a) {
        return std::any_of(a.ranks.begin(), a.ranks.end(),
                           [](const auto& r) { return r.heard_unix_s.has_value(); });
      }));
}

// Each agent's step as status.json reports it.
std::map<std::string, int64_t> AgentSteps(const std::string& status_path) {
  std::map<std::string, int64_t> out;
  if (auto status = agentrt::ReadRunStatusFile(status_path); status.ok()) {
    for (const auto& a : status->agents) out[a.name] = a.step;
  }
  return out;
}

// Runs `argv` to its end, its output discarded; seconds, or a failure.
double TimedRun(const std::vector<std::string>& argv) {
  const auto t0 = Clock::now();
  const pid_t pid = agentrt::bench::SpawnLogged(argv, "/dev/null");
  if (pid < 0) Die("fork");
  int status = 0;
  ::waitpid(pid, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
    Die(fmt::format("{} {} failed (exit {})", argv[0], argv[1], WEXITSTATUS(status)));
  return Seconds(t0);
}

// RSS per agent of agentctl at 1 report a second, by agent count (the flood's anchor).
std::map<int, double> rss_at_1hz;

// `step_ms` 1000: the growth curve; 10: the flood (a metrics report per step).
// The figures of one run of N real agents. The flood (`step_ms` 10) runs
// twice: its anchor reports once every 100 steps, then every step.
struct RealRun {
  double slowest_steps_per_s = 0;
};

RealRun RealAgents(const std::string& bin_dir, int n, double window_s, int step_ms = 1000,
                   int report_every = 1, double anchor_steps_per_s = 0) {
  const bool flood = step_ms < 1000;
  const bool flood_anchor = flood && report_every > 1;
  const std::string agent = bin_dir + "/agentrt-test-agent";
  const std::string work = fs::temp_directory_path() / fmt::format("agentrt-scale-{}", ::getpid());
  fs::remove_all(work);
  fs::create_directories(work);
  std::ofstream yaml(work + "/agents.yaml");
  yaml << fmt::format("run: {{name: scale{}, dir: {}/runs}}\n", n, work);
  yaml << "cluster: {ports: {first: 20000, last: 60999}}\nagents:\n";
  for (int i = 0; i < n; ++i) {
    yaml << fmt::format(
        "  - {{name: a{}, gpus: 0, ranks: 1, command: [{}, --forever, --step-ms, '{}', "
        "--ckpt-interval-s, '5', --heartbeat-ms, '{}', --report-every, '{}']}}\n",
        i, agent, step_ms, flood ? 100 : 1000, report_every);
  }
  yaml.close();

  const double anchor = ForkExecRate(agent, n);
  const auto t0 = Clock::now();
  const pid_t ctl = Spawn({bin_dir + "/agentctl", "run", "--quiet", work + "/agents.yaml"},
                          work + "/agentctl.log");
  std::string status;
  int heard = 0;
  const double limit_s = 60 + n * 0.2;
  while (heard < n) {
    if (Seconds(t0) > limit_s) {
      ::kill(-ctl, SIGKILL);
      Die(fmt::format("{} real agents: only {} reported within {:.0f} s (see {})", n, heard,
                      limit_s, work));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(250));
    if (status.empty()) {
      std::error_code ec;  // agentctl makes runs/ a moment after it starts
      for (const auto& e : fs::directory_iterator(work + "/runs", ec))
        status = e.path() / "status.json";
      continue;
    }
    heard = std::max(heard, AgentsHeard(status));
  }
  const double launch_s = Seconds(t0);
  if (!flood) {
    PrintFigure("scale", fmt::format("launch_rate_{}_real", n), n / launch_s, "agents/s",
                "fork/exec", anchor);
  }

  const double cpu0 = ProcessCpuSeconds(ctl);
  const auto steps0 = AgentSteps(status);
  const auto w0 = Clock::now();
  std::this_thread::sleep_for(std::chrono::duration<double>(window_s));
  const auto steps1 = AgentSteps(status);
  const double measured_s = Seconds(w0);
  const double cpu_ms = (ProcessCpuSeconds(ctl) - cpu0) * 1000.0;
  const double rss = RssKiB(ctl);
  RealRun result;
  if (!flood) {
    PrintFigure("scale", fmt::format("controller_cpu_{}_real", n), cpu_ms / (n * window_s),
                "ms/agent-s", "goal", 0.1);
    PrintFigure("scale", fmt::format("controller_rss_{}_real", n), rss / n, "KiB/agent", "goal",
                200);
    rss_at_1hz[n] = rss / n;
  } else {
    // status.json is written at a bounded rate (0.2 s at 100 agents) and
    // heartbeats carry the step every 0.1 s, so a window's ends are each
    // a little stale: the rate is over the steps both reads saw.
    double slowest = 1e9;
    for (const auto& [name, step] : steps1) {
      auto before = steps0.find(name);
      if (before == steps0.end() || before->second < 0) continue;
      slowest = std::min(slowest, static_cast<double>(step - before->second) / measured_s);
    }
    if (slowest > 1e8) Die(fmt::format("{} flooding agents: no steps seen", n));
    result.slowest_steps_per_s = slowest;
    std::fprintf(stderr,
                 "bench_scale: %d real agents stepping every %d ms, a report every %d: "
                 "the slowest made %.1f steps/s\n",
                 n, step_ms, report_every, slowest);
  }
  if (flood && !flood_anchor) {
    PrintFigure("scale", fmt::format("agent_rate_min_{}_real_100hz", n), result.slowest_steps_per_s,
                "steps/s", "the same agents reporting every 100th step", anchor_steps_per_s);
    const bool paired = rss_at_1hz.count(n) > 0;
    PrintFigure("scale", fmt::format("controller_rss_{}_real_100hz", n), rss / n, "KiB/agent",
                paired ? "the same count at 1 report/s" : "goal", paired ? rss_at_1hz[n] : 200.0);
    PrintFigure("scale", fmt::format("controller_cpu_{}_real_100hz", n), cpu_ms / (n * window_s),
                "ms/agent-s", "goal", 0.1);
  }

  ::kill(ctl, SIGINT);
  const auto stop0 = Clock::now();
  int wstatus = 0;
  while (::waitpid(ctl, &wstatus, WNOHANG) == 0) {
    if (Seconds(stop0) > 120) {
      ::kill(-ctl, SIGKILL);
      ::waitpid(ctl, &wstatus, 0);
      Die(fmt::format("{} real agents: agentctl did not stop within 120 s", n));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  fs::remove_all(work);
  return result;
}

// --- simulated agents ------------------------------------------------------

// The spawner faked: a launch "starts" its ranks (pids that are not
// processes), a signal ends them.
class SimulatedBackend final : public agentrt::LaunchBackend {
 public:
  agentrt::Result<agentrt::LaunchedAgent> Launch(const agentrt::AgentLaunch& a) override {
    agentrt::LaunchedAgent out;
    out.master_port = a.ports_first;
    out.process_group = next_pid_;
    for (const auto& r : a.ranks) out.ranks.push_back({r.rank, next_pid_++, r.node});
    pids_[a.name] = out.process_group;
    launches.push_back({a.name, a.token_file, a.telemetry_endpoint});
    return out;
  }
  agentrt::Status Signal(const std::string& agent, int sig) override {
    if ((sig == SIGTERM || sig == SIGKILL) && pids_.count(agent) > 0) {
      exits_.push_back({agent, 0, pids_[agent], 0, 0, ""});
      pids_.erase(agent);
    }
    return agentrt::Status::Ok();
  }
  std::vector<agentrt::AgentProcessExit> PollExits() override {
    std::vector<agentrt::AgentProcessExit> out;
    std::swap(out, exits_);
    return out;
  }
  struct Launched {
    std::string agent, token_file, endpoint;
  };
  std::vector<Launched> launches;

 private:
  pid_t next_pid_ = 4000000;
  std::map<std::string, pid_t> pids_;
  std::vector<agentrt::AgentProcessExit> exits_;
};

class QuietObserver final : public agentrt::RunObserver {
 public:
  void Event(const std::string&) override {}
  void Warn(const std::string& text) override { std::fprintf(stderr, "%s", text.c_str()); }
  void Progress(const agentrt::RunStatus&, double, bool) override {}
};

class NoStops final : public agentrt::StopRequests {
 public:
  int count() const override { return 0; }
  int last_signal() const override { return 0; }
};

// The load generator: ROSTER lines "agent token", for SECONDS seconds, each
// agent's rank 0 sends a heartbeat and a metrics report a second and a
// checkpoint every 5 s, spread evenly over the second, signed with its token,
// over 16 PUSH sockets, until SIGTERM. Prints the number of messages sent.
volatile sig_atomic_t generator_stop = 0;

int Generate(const std::string& roster_path, const std::string& endpoint, double seconds) {
  ::signal(SIGTERM, [](int) { generator_stop = 1; });
  std::vector<std::pair<std::string, std::string>> roster;
  std::ifstream in(roster_path);
  for (std::string agent, token; in >> agent >> token;) roster.emplace_back(agent, token);
  void* context = zmq_ctx_new();
  std::vector<void*> sockets;
  for (int i = 0; i < 16; ++i) {
    void* s = zmq_socket(context, ZMQ_PUSH);
    int hwm = 100000, linger = 2000;
    zmq_setsockopt(s, ZMQ_SNDHWM, &hwm, sizeof hwm);
    zmq_setsockopt(s, ZMQ_LINGER, &linger, sizeof linger);
    if (zmq_connect(s, endpoint.c_str()) != 0) Die("generator: cannot connect to " + endpoint);
    sockets.push_back(s);
  }
  uint64_t sent = 0, seq = 1;
  auto send = [&](size_t i, agentrt::TelemetryMessage& m) {
    m.agent = roster[i].first;
    m.time = agentrt::UnixTimeSeconds();
    const std::string text = agentrt::EncodeTelemetry(m, ++seq);
    const std::string mac = agentrt::HmacSha256Hex(roster[i].second, text);
    void* s = sockets[i % sockets.size()];
    if (zmq_send(s, text.data(), text.size(), ZMQ_SNDMORE | ZMQ_DONTWAIT) >= 0 &&
        zmq_send(s, mac.data(), mac.size(), ZMQ_DONTWAIT) >= 0) {
      ++sent;
    }
  };
  agentrt::TelemetryMessage m;
  m.rank = 0;
  m.pid = 4000000;
  m.type = agentrt::TelemetryType::kHello;
  for (size_t i = 0; i < roster.size(); ++i) send(i, m);
  const auto t0 = Clock::now();
  const double per_agent = 1.0 / static_cast<double>(std::max<size_t>(roster.size(), 1));
  for (int64_t second = 1; Seconds(t0) < seconds && generator_stop == 0; ++second) {
    for (size_t i = 0; i < roster.size() && generator_stop == 0; ++i) {
      const double due = static_cast<double>(second - 1) + static_cast<double>(i) * per_agent;
      const double ahead = due - Seconds(t0);
      if (ahead > 0.001) std::this_thread::sleep_for(std::chrono::duration<double>(ahead));
      m.step = second;
      m.type = agentrt::TelemetryType::kHeartbeat;
      m.metrics = nullptr;
      send(i, m);
      m.type = agentrt::TelemetryType::kMetrics;
      m.metrics = {{"loss", 1.0 / static_cast<double>(second)}, {"steps_per_s", 1.0}};
      send(i, m);
      if (second % 5 == 0) {
        m.type = agentrt::TelemetryType::kCheckpoint;
        m.metrics = nullptr;
        m.checkpoint_step = second;
        send(i, m);
      }
    }
  }
  std::printf("%llu\n", static_cast<unsigned long long>(sent));
  for (void* s : sockets) zmq_close(s);
  zmq_ctx_term(context);
  return 0;
}

void SimulatedAgents(const std::string& bin_dir, int n, double window_s) {
  const std::string work =
      fs::temp_directory_path() / fmt::format("agentrt-scale-sim-{}", ::getpid());
  fs::remove_all(work);
  fs::create_directories(work);
  std::string yaml = fmt::format(
      "run: {{name: sim{}, dir: {}/runs}}\ncluster: {{ports: {{first: 10000, last: 65000, "
      "per_agent: 4}}}}\nagents:\n",
      n, work);
  for (int i = 0; i < n; ++i)
    yaml += fmt::format("  - {{name: a{}, gpus: 0, ranks: 1, command: [simulated]}}\n", i);
  const auto start0 = Clock::now();
  auto config = agentrt::LoadConfigString(yaml);
  if (!config.ok()) Die(config.status().ToString());
  agentrt::InventoryRequest inventory;
  auto prepared = agentrt::PrepareRun(*config, inventory, nullptr);
  if (!prepared.ok()) Die(prepared.status().ToString());
  const std::string run_dir = prepared->dir.path();
  SimulatedBackend backend;
  QuietObserver observer;
  NoStops stops;
  agentrt::RunDriverOptions options;
  options.poll = std::chrono::milliseconds(50);
  options.broker_program = bin_dir + "/agentrt-bus";
  agentrt::RunDriver driver(std::move(prepared->plan), std::move(prepared->dir), &backend,
                            agentrt::SteadyClock(), &observer, &stops, options);
  if (auto s = driver.Start(); !s.ok()) Die(s.ToString());
  if (backend.launches.size() != static_cast<size_t>(n)) Die("not every agent was launched");
  std::fprintf(stderr,
               "bench_scale: %d simulated agents: planned, written and launched in %.2f s\n", n,
               Seconds(start0));

  std::ofstream roster(work + "/roster");
  for (const auto& l : backend.launches) {
    auto credential = agentrt::ReadTokenFile(l.token_file);
    if (!credential.ok()) Die(credential.status().ToString());
    roster << l.agent << " " << credential->token << "\n";
  }
  roster.close();
  const double warmup_s = 3;
  const pid_t generator =
      Spawn({agentrt::bench::SelfPath(), "--generate", work + "/roster",
             backend.launches.front().endpoint, fmt::format("{}", warmup_s + window_s + 600)},
            work + "/generator.out");
  const auto t0 = Clock::now();
  while (Seconds(t0) < warmup_s) driver.Step();
  struct rusage before {};
  ::getrusage(RUSAGE_SELF, &before);
  const auto w0 = Clock::now();
  while (Seconds(w0) < window_s) driver.Step();
  struct rusage after {};
  ::getrusage(RUSAGE_SELF, &after);
  const double measured_s = Seconds(w0);
  auto cpu = [](const rusage& r) {
    return r.ru_utime.tv_sec + r.ru_stime.tv_sec + 1e-6 * (r.ru_utime.tv_usec + r.ru_stime.tv_usec);
  };
  const double cpu_ms = (cpu(after) - cpu(before)) * 1000.0;
  PrintFigure("scale", fmt::format("controller_cpu_{}_simulated", n), cpu_ms / (n * measured_s),
              "ms/agent-s", "goal", 0.1);
  PrintFigure("scale", fmt::format("controller_rss_{}_simulated", n), RssKiB(::getpid()) / n,
              "KiB/agent", "goal", 200);
  // The views, timed on another thread while this one goes on driving the run.
  std::map<std::string, double> views;
  std::atomic<bool> views_done{false};
  std::thread viewer([&] {
    auto median3 = [](const std::function<double()>& once) {
      return agentrt::bench::Median({once(), once(), once()});
    };
    const std::string agentctl = bin_dir + "/agentctl";
    views["status"] = median3([&] { return TimedRun({agentctl, "status", run_dir}); });
    views["status_json"] = median3([&] {
      return TimedRun({agentctl, "status", "--json", run_dir});
    });
    views["export_csv"] = median3([&] {
      return TimedRun({agentctl, "export", run_dir, "--csv", work + "/metrics.csv"});
    });
    auto dash = agentrt::Dashboard::Start(run_dir, {});
    if (!dash.ok()) Die(dash.status().ToString());
    auto get = [&](const std::string& path) {
      const auto began = Clock::now();
      httplib::Client client("127.0.0.1", (*dash)->port());
      client.set_read_timeout(60, 0);
      auto r = client.Get(path);
      if (!r || r->status != 200) Die("dashboard: GET " + path + " failed");
      std::fprintf(stderr, "bench_scale: %d simulated agents: GET %s: %.0f ms, %zu bytes\n", n,
                   path.substr(0, 40).c_str(), Seconds(began) * 1000, r->body.size());
    };
    // What the page asks for as it opens; the curves are those of the table's
    // first page (100 agents).
    std::string first_page;
    for (int i = 0; i < std::min(n, 100); ++i)
      first_page += fmt::format("{}a{}", i > 0 ? "%2C" : "", i);
    auto page_load = [&] {
      const auto began = Clock::now();
      for (const std::string& path :
           {std::string("/"), std::string("/api/run"), std::string("/api/names"),
            "/api/series?metric=loss&points=1200&agents=" + first_page})
        get(path);
      return Seconds(began);
    };
    // Cold: the dashboard's first page, which reads the run's whole metrics
    // history (it grows with the run's length); then the median of three more.
    std::error_code no_size;
    const auto history = fs::file_size(agentrt::RunDir(run_dir).MetricsPath(), no_size);
    std::fprintf(stderr,
                 "bench_scale: %d simulated agents: metrics history at the cold load: %.1f MB\n", n,
                 static_cast<double>(history) / 1e6);
    views["dashboard_cold_load"] = page_load();
    views["dashboard_first_load"] = median3(page_load);
    views["metrics_endpoint"] = median3([&] {
      const auto began = Clock::now();
      get("/metrics");
      return Seconds(began);
    });
    (*dash)->Stop();
    views_done = true;
  });
  while (!views_done) driver.Step();
  viewer.join();
  for (const auto& [view, s] : views) {
    PrintFigure("scale", fmt::format("{}_{}_simulated", view, n), s * 1000.0, "ms", "goal", 1000);
  }

  int wstatus = 0;
  ::kill(generator, SIGTERM);
  while (::waitpid(generator, &wstatus, WNOHANG) == 0) driver.Step();
  for (int i = 0; i < 20; ++i) driver.Step();  // what is still in flight
  const std::string sent_text = agentrt::ReadWholeFile(work + "/generator.out").value_or("0");
  const double sent = std::strtod(sent_text.c_str(), nullptr);
  // Every agent's step as the controller last heard it, against what was sent.
  int64_t behind = 0;
  for (const auto& a : driver.controller().status().agents) behind += a.step > 0 ? 0 : 1;
  PrintFigure("scale", fmt::format("agents_heard_{}_simulated", n), static_cast<double>(n - behind),
              "agents", "agents simulated", n);
  std::fprintf(stderr, "bench_scale: %d simulated agents: %.0f messages sent\n", n, sent);
  fs::remove_all(work);
  (void)run_dir;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 5 && std::string(argv[1]) == "--generate")
    return Generate(argv[2], argv[3], std::atof(argv[4]));
  std::string real = "100,1000,2000", simulated = "1000,10000", flood = "100";
  double window_s = 10;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--real")
      real = argv[i + 1];
    else if (flag == "--simulated")
      simulated = argv[i + 1];
    else if (flag == "--flood")
      flood = argv[i + 1];
    else if (flag == "--window-s")
      window_s = std::atof(argv[i + 1]);
    else
      Die("usage: bench_scale [--real N,N] [--simulated N,N] [--flood N,N] [--window-s S]");
  }
  const std::string bin_dir =
      (fs::path(agentrt::bench::SelfPath()).parent_path().parent_path() / "bin").string();
  for (int n : Sizes(simulated)) SimulatedAgents(bin_dir, n, window_s);
  for (int n : Sizes(real)) RealAgents(bin_dir, n, window_s);
  for (int n : Sizes(flood)) {
    const RealRun anchor = RealAgents(bin_dir, n, window_s, /*step_ms=*/10, /*report_every=*/100);
    RealAgents(bin_dir, n, window_s, /*step_ms=*/10, /*report_every=*/1,
               anchor.slowest_steps_per_s);
  }
  return 0;
}
