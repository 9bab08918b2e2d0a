// `agentctl run FILE [--cluster inventory.yaml] [--set key=value]...` — plan,
// create the run directory, start the bus, launch every agent on this machine,
// supervise (restart from checkpoints), stream progress, and exit 0 only when
// every agent succeeded. Also the hidden `agentctl exec-rank`, the wrapper that
// mpirun starts in front of each rank of an MPI agent (scheduler/process.h).
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "comms/auth.h"
#include "comms/bus_server.h"
#include "comms/telemetry.h"
#include "scheduler/inventory.h"
#include "scheduler/loader.h"
#include "scheduler/local_backend.h"
#include "scheduler/planner.h"
#include "scheduler/process.h"
#include "scheduler/process_exec_rank.h"
#include "scheduler/run_controller.h"
#include "scheduler/run_dir.h"
#include "tools/agentctl/commands.h"

namespace agentctl {
namespace {

std::atomic<int> g_stop_signals{0};
std::atomic<int> g_last_signal{0};

void OnStopSignal(int sig) {
  g_last_signal.store(sig);
  g_stop_signals.fetch_add(1);
}

void InstallSignalHandlers() {
  struct sigaction sa {};
  sa.sa_handler = OnStopSignal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = 0;  // no SA_RESTART: let a blocking poll return early
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  signal(SIGPIPE, SIG_IGN);
}

void Print(const std::string& s) {
  std::fputs(s.c_str(), stdout);
  std::fflush(stdout);
}

// The agents of the plan as the run controller supervises them.
std::vector<agentrt::SupervisedAgent> SupervisedAgents(const agentrt::Plan& plan,
                                                       const agentrt::RunDir& dir,
                                                       const std::string& bus_address,
                                                       const std::string& telemetry) {
  std::vector<agentrt::SupervisedAgent> out;
  for (const auto& ap : plan.agents) {
    agentrt::SupervisedAgent s;
    agentrt::AgentLaunch& l = s.launch;
    l.name = ap.name;
    l.index = ap.index;
    for (const auto& p : ap.placement) {
      for (size_t i = 0; i < p.ranks.size(); ++i) {
        l.ranks.push_back({p.ranks[i], static_cast<int>(i), static_cast<int>(p.ranks.size()), p.node,
                           p.gpus});
      }
    }
    std::sort(l.ranks.begin(), l.ranks.end(),
              [](const auto& a, const auto& b) { return a.rank < b.rank; });
    l.command = ap.command;
    l.env = ap.env;
    l.master_addr = "127.0.0.1";  // every rank runs here; plan node names need not resolve
    l.master_port = ap.master_port;
    l.ports_first = ap.ports.first;
    l.ports_last = ap.ports.last;
    l.run_dir = dir.path();
    l.checkpoint_dir = ap.checkpoint_dir;
    l.log_dir = dir.LogDir(ap.name);
    l.bus_address = bus_address;
    l.token_file = dir.TokenPath(ap.name);
    l.telemetry_endpoint = telemetry;
    l.use_mpirun = ap.backend == agentrt::GroupBackend::kMpi && ap.ranks > 1 && ap.gpus == 0;
    s.restart = ap.restart;
    out.push_back(std::move(s));
  }
  return out;
}

agentrt::BusAcl AclOf(const agentrt::Plan& plan) {
  agentrt::BusAcl acl;
  for (const auto& a : plan.agents) acl.agents.push_back(a.name);
  for (const auto& c : plan.channels) acl.channels.push_back({c.topic, c.publishers, c.subscribers});
  return acl;
}

// Progress on the terminal: the table redrawn in place on a TTY, periodic plain
// tables otherwise; events (state changes) always as their own lines.
class Display {
 public:
  Display(bool tty, double interval_s, bool quiet) : tty_(tty), interval_s_(interval_s), quiet_(quiet) {}

  void Event(const std::string& line) {
    if (quiet_) return;
    Clear();
    Print(line + "\n");
    drawn_lines_ = 0;
  }

  void Table(const agentrt::RunStatus& status, double now_s, bool force = false) {
    if (quiet_) return;
    if (!force && now_s - last_s_ < (tty_ ? 0.5 : interval_s_)) return;
    last_s_ = now_s;
    const std::string table = agentrt::RenderStatusTable(status, tty_ ? 160 : 0);
    Clear();
    Print(table);
    if (tty_) drawn_lines_ = static_cast<int>(std::count(table.begin(), table.end(), '\n'));
  }

 private:
  void Clear() {
    if (!tty_ || drawn_lines_ == 0) return;
    std::string s;
    for (int i = 0; i < drawn_lines_; ++i) s += "\x1b[1A\x1b[2K";
    Print(s);
    drawn_lines_ = 0;
  }

  bool tty_;
  double interval_s_;
  bool quiet_;
  double last_s_ = -1e9;
  int drawn_lines_ = 0;
};

struct RunOptions {
  std::string file;
  std::string cluster;
  std::vector<std::string> overrides;
  std::string backend = "local";
  double status_interval_s = 30;
  bool quiet = false;
};

int Run(const RunOptions& opts) {
  agentrt::LoadOptions load;
  load.overrides = opts.overrides;
  auto config = agentrt::LoadConfigFile(opts.file, load);
  if (!config.ok()) Fail("run", config.status());
  if (opts.backend != "local") {
    Fail("run", agentrt::InvalidArgument("backend '" + opts.backend +
                                         "' is not available in `agentctl run` yet; use --backend local, "
                                         "or `agentctl sbatch` for SLURM"));
  }
  agentrt::Inventory inventory;
  if (!opts.cluster.empty()) {
    agentrt::Status applied = agentrt::ApplyClusterFile(opts.cluster, *config);
    if (!applied.ok()) Fail("run", applied);
    inventory = agentrt::InventoryFromCluster(config->cluster, opts.cluster);
  } else if (!config->cluster.nodes.empty()) {
    inventory = agentrt::InventoryFromCluster(config->cluster, opts.file + " cluster:");
  } else {
    inventory = agentrt::LocalInventory(agentrt::DetectLocalMachine());
  }
  // Plan once to fail before anything is created, then again with the real run dir.
  agentrt::PlanResult trial = agentrt::MakePlan(*config, inventory);
  if (!trial.feasible()) {
    Fail("run", agentrt::ResourceExhausted(fmt::format("infeasible on {}: {}", inventory.source,
                                                       trial.infeasible().reason)),
         kExitInfeasible);
  }
  auto dir = agentrt::RunDir::Create(config->run.dir, config->run.name, std::chrono::system_clock::now());
  if (!dir.ok()) Fail("run", dir.status());
  agentrt::PlanOptions plan_options;
  plan_options.run_dir = dir->path();
  agentrt::Plan plan = agentrt::MakePlan(*config, inventory, plan_options).plan();
  plan.run_dir = dir->path();
  for (const auto& w : plan.warnings) std::fputs(fmt::format("agentctl run: warning: {}\n", w).c_str(), stderr);

  InstallSignalHandlers();
  agentrt::Status pid_written =
      agentrt::WriteFileAtomic(dir->ControllerPidPath(), std::to_string(::getpid()) + "\n");
  if (!pid_written.ok()) Fail("run", pid_written);
  // controller.pid lives exactly as long as this controller (also when a step below fails).
  struct PidFileGuard {
    std::string path;
    ~PidFileGuard() {
      std::error_code ec;
      std::filesystem::remove(path, ec);
    }
  } pid_guard{dir->ControllerPidPath()};

  // Credentials: one run secret (never printed, never in env or argv), one token file per agent.
  auto secret = dir->CreateSecret();
  if (!secret.ok()) Fail("run", secret.status());
  for (const auto& a : plan.agents) {
    agentrt::Status s = agentrt::WriteTokenFile(dir->TokenPath(a.name), a.name,
                                                agentrt::DeriveAgentToken(*secret, a.name));
    if (!s.ok()) Fail("run", s);
  }

  // The bus, on the plan's port, or any free one when that is taken.
  agentrt::BusServerOptions bus_options;
  bus_options.host = "127.0.0.1";
  bus_options.port = plan.bus.port;
  bus_options.broker.limits.max_message_bytes = plan.bus.settings.max_message_bytes;
  bus_options.broker.retention_messages = plan.bus.settings.retention;
  bus_options.broker.retention_bytes = plan.bus.settings.retention_bytes;
  if (plan.bus.settings.tls) {
    bus_options.tls_cert_file = plan.bus.settings.cert_file;
    bus_options.tls_key_file = plan.bus.settings.key_file;
  }
  auto bus = agentrt::BusServer::Start(bus_options, *secret, AclOf(plan));
  if (!bus.ok() && plan.bus.port != 0) {
    std::fputs(fmt::format("agentctl run: warning: bus port {} unavailable ({}); using a free port\n",
                           plan.bus.port, bus.status().message()).c_str(), stderr);
    bus_options.port = 0;
    bus = agentrt::BusServer::Start(bus_options, *secret, AclOf(plan));
  }
  if (!bus.ok()) Fail("run", bus.status().WithContext("cannot start the message bus"));
  plan.bus.host = "127.0.0.1";
  plan.bus.port = (*bus)->port();
  agentrt::Status plan_written = agentrt::WritePlanFile(plan, dir->PlanPath());
  if (!plan_written.ok()) Fail("run", plan_written);

  std::string endpoint = dir->TelemetryIpcEndpoint();
  if (endpoint.empty()) endpoint = "tcp://127.0.0.1:*";
  auto telemetry = agentrt::TelemetryReceiver::Bind(endpoint);
  if (!telemetry.ok()) Fail("run", telemetry.status().WithContext("cannot bind telemetry at " + endpoint));
  const double start_unix_s = agentrt::UnixTimeSeconds();
  auto metrics = agentrt::MetricsWriter::Open(dir->MetricsPath(), start_unix_s);
  if (!metrics.ok()) Fail("run", metrics.status());

  agentrt::LocalBackendOptions backend_options;
  // The small wrapper next to agentctl when it is there, else agentctl itself.
  const std::string bin_dir = agentrt::SelfExecutableDir();
  if (::access((bin_dir + "/agentrt-exec-rank").c_str(), X_OK) == 0) {
    backend_options.rank_exec = {bin_dir + "/agentrt-exec-rank"};
  } else {
    backend_options.rank_exec = {bin_dir + "/agentctl", "exec-rank"};
  }
  auto backend = agentrt::MakeLocalBackend(agentrt::MakePosixSpawner(), backend_options);
  auto clock = agentrt::MakeSteadyClock();
  agentrt::RunController controller(
      plan.run, dir->path(),
      SupervisedAgents(plan, *dir, (*bus)->address(), (*telemetry)->endpoint()), backend.get(),
      clock.get());

  const bool tty = ::isatty(STDOUT_FILENO) == 1;
  Display display(tty, opts.status_interval_s, opts.quiet);
  display.Event(fmt::format("run {}: {} agents, run dir {}, bus {}", plan.run, plan.agents.size(),
                            dir->path(), (*bus)->address()));

  agentrt::RunStatus last_shown;
  auto write_status = [&] {
    agentrt::RunStatus s = controller.status();
    s.controller_pid = ::getpid();
    s.started_unix_s = start_unix_s;
    s.updated_unix_s = agentrt::UnixTimeSeconds();
    agentrt::Status w = agentrt::WriteRunStatusFile(s, dir->StatusPath());
    if (!w.ok()) std::fputs(fmt::format("agentctl run: warning: {}\n", w.message()).c_str(), stderr);
  };
  // One line per agent state change, with the reason when there is one.
  auto report_changes = [&](double t) {
    const auto& now = controller.status();
    for (size_t i = 0; i < now.agents.size(); ++i) {
      const auto& a = now.agents[i];
      const bool is_new = i >= last_shown.agents.size();
      if (!is_new && last_shown.agents[i].state == a.state &&
          last_shown.agents[i].restarts == a.restarts) {
        continue;
      }
      std::string line = fmt::format("[{:7.1f}s] {} {}", t, a.name, agentrt::AgentStateName(a.state));
      if (a.state == agentrt::AgentState::kRunning) {
        line += fmt::format(" (restart {}, pids", a.restarts);
        for (const auto& r : a.ranks) line += fmt::format(" {}", r.pid);
        line += fmt::format(", MASTER_PORT {})", a.master_port);
      } else if (!a.reason.empty() && a.state != agentrt::AgentState::kSucceeded) {
        line += ": " + a.reason;
      }
      display.Event(line);
    }
    last_shown = now;
  };

  controller.Start();
  write_status();
  const double t0 = clock->NowSeconds();
  uint64_t written_state = controller.state_version();
  uint64_t written_any = controller.version();
  double written_at = t0;
  int stops_seen = 0;
  report_changes(0);
  while (!controller.Finished()) {
    auto messages = (*telemetry)->Poll(std::chrono::milliseconds(100));
    if (messages.ok()) {
      for (const auto& m : *messages) {
        controller.OnTelemetry(m);
        if (m.type == agentrt::TelemetryType::kMetrics) (void)(*metrics)->Write(m);
      }
      if (!messages->empty()) (void)(*metrics)->Flush();
    }
    const int stops = g_stop_signals.load();
    if (stops > stops_seen) {
      stops_seen = stops;
      const int sig = g_last_signal.load();
      if (!controller.stop_requested()) {
        display.Event(fmt::format("agentctl run: {} received: stopping every agent (SIGTERM, then SIGKILL "
                                  "after each agent's grace_s; press Ctrl-C again to kill now)",
                                  sig == SIGINT ? "SIGINT" : "SIGTERM"));
        controller.RequestStop(sig == SIGINT ? "SIGINT" : "SIGTERM");
      } else {
        display.Event("agentctl run: second stop signal: killing every agent now");
        for (const auto& a : plan.agents) (void)backend->Signal(a.name, SIGKILL);
      }
    }
    controller.Tick();
    const double now = clock->NowSeconds();
    if (controller.state_version() != written_state ||
        (controller.version() != written_any && now - written_at >= 1.0)) {
      if (controller.state_version() != written_state) report_changes(now - t0);
      write_status();
      written_state = controller.state_version();
      written_any = controller.version();
      written_at = now;
    }
    display.Table(controller.status(), now);
  }
  report_changes(clock->NowSeconds() - t0);
  write_status();
  (void)(*metrics)->Flush();
  display.Table(controller.status(), clock->NowSeconds(), /*force=*/true);
  (*bus)->Shutdown(std::chrono::milliseconds(1000));
  const std::string summary = controller.Summary();
  if (!summary.empty()) std::fputs(summary.c_str(), stderr);
  Print(fmt::format("run {} {}; status: agentctl status {}\n", plan.run,
                    agentrt::RunStateName(controller.status().state), dir->path()));
  return controller.ExitCode();
}

}  // namespace

void RegisterRun(CLI::App& app) {
  auto opts = std::make_shared<RunOptions>();
  CLI::App* cmd = app.add_subcommand(
      "run", "Plan, start the bus, launch and supervise every agent; exit 0 when all succeeded");
  cmd->add_option("file", opts->file, "agents.yaml")->required();
  cmd->add_option("--cluster", opts->cluster, "inventory YAML with a cluster: block (e.g. fake GPUs)");
  cmd->add_option("--set", opts->overrides, "override a setting: key.path=value (repeatable)");
  cmd->add_option("--backend", opts->backend, "launch backend (local)");
  cmd->add_option("--status-interval-s", opts->status_interval_s,
                  "seconds between progress tables when stdout is not a terminal");
  cmd->add_flag("--quiet", opts->quiet, "no progress output; only the summary");
  cmd->callback([opts] { Exit(Run(*opts)); });

  // Hidden: the wrapper mpirun runs in front of every rank of an MPI agent.
  auto exec = std::make_shared<std::pair<std::string, std::vector<std::string>>>();
  CLI::App* wrapper = app.add_subcommand("exec-rank", "");  // empty description: not listed
  wrapper->add_option("--log-dir", exec->first, "write stdout/stderr to DIR/rank<RANK>.log");
  wrapper->add_option("command", exec->second, "program (absolute path) and arguments")->required();
  wrapper->callback([exec] { Exit(agentrt::ExecRank(exec->first, exec->second)); });
}

}  // namespace agentctl
