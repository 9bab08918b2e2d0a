// `agentctl run FILE [--cluster inventory.yaml] [--set key=value]...` — plan,
// create the run directory, start the bus, launch every agent on this machine,
// supervise (restart from checkpoints), stream progress, and exit 0 only when
// every agent succeeded. Also the hidden `agentctl exec-rank`, the wrapper that
// mpirun starts in front of each rank of an MPI agent (scheduler/process.h).
//
// `--backend slurm` submits one allocation (slurm/alloc_script.h) whose batch
// shell runs the hidden `--backend slurm-steps --run-dir DIR` mode: the same
// controller, with every agent launched as a job step (slurm/srun_backend.h).
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <thread>
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
#include "slurm/alloc_script.h"
#include "slurm/command_runner.h"
#include "slurm/slurm_client.h"
#include "slurm/srun_backend.h"
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

// Inside a SLURM allocation: USR2 is the preemption / time-limit warning.
void InstallPreemptionHandler() {
  struct sigaction sa {};
  sa.sa_handler = OnStopSignal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = 0;
  sigaction(SIGUSR2, &sa, nullptr);
}

std::string SignalLabel(int sig) {
  return sig == SIGINT ? "SIGINT" : sig == SIGUSR2 ? "SIGUSR2 (preemption)" : "SIGTERM";
}

void Print(const std::string& s) {
  std::fputs(s.c_str(), stdout);
  std::fflush(stdout);
}

// The agents of the plan as the run controller supervises them.
std::vector<agentrt::SupervisedAgent> SupervisedAgents(const agentrt::Plan& plan,
                                                       const agentrt::RunDir& dir,
                                                       const std::string& bus_address,
                                                       const std::string& telemetry,
                                                       const std::string& local_node = "") {
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
    // Local runs: every rank runs here; plan node names need not resolve. SLURM
    // runs: the agent's first node, by name, unless that is this node.
    l.master_addr = local_node.empty() || l.ranks.front().node == local_node ? "127.0.0.1"
                                                                             : l.ranks.front().node;
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
  std::string run_dir;  // --backend slurm-steps: the run directory made by --backend slurm
  bool detach = false;  // --backend slurm: return once submitted
  int cpus_per_rank = 1;
};

int Supervise(agentrt::Plan plan, const agentrt::RunDir& dir, const RunOptions& opts, bool in_slurm);
int SubmitSlurm(const RunOptions& opts, const agentrt::Config& config);
int RunInAllocation(const RunOptions& opts);

int Run(const RunOptions& opts) {
  if (opts.backend == "slurm-steps") return RunInAllocation(opts);
  if (opts.file.empty()) Fail("run", agentrt::InvalidArgument("no agents.yaml given"));
  agentrt::LoadOptions load;
  load.overrides = opts.overrides;
  auto config = agentrt::LoadConfigFile(opts.file, load);
  if (!config.ok()) Fail("run", config.status());
  if (opts.backend == "slurm") return SubmitSlurm(opts, *config);
  if (opts.backend != "local") {
    Fail("run", agentrt::InvalidArgument("unknown backend '" + opts.backend +
                                         "'; use --backend local or --backend slurm "
                                         "(or `agentctl sbatch` for job arrays)"));
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
  return Supervise(std::move(plan), *dir, opts, /*in_slurm=*/false);
}

// Hosts the bus and supervises every agent until the run ends: on this machine
// (local backend), or inside a SLURM allocation with one job step per agent launch.
int Supervise(agentrt::Plan plan, const agentrt::RunDir& run_dir, const RunOptions& opts, bool in_slurm) {
  const agentrt::RunDir* dir = &run_dir;
  InstallSignalHandlers();
  if (in_slurm) InstallPreemptionHandler();
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
  // A requeued SLURM run keeps the secret it made on its first start.
  agentrt::Result<std::string> secret = agentrt::Internal("no secret");
  if (in_slurm && std::filesystem::exists(dir->SecretPath())) {
    std::ifstream in(dir->SecretPath(), std::ios::binary);
    std::stringstream bytes;
    bytes << in.rdbuf();
    secret = bytes.str();
    if (!in || secret->empty()) Fail("run", agentrt::Internal("cannot read " + dir->SecretPath()));
  } else {
    secret = dir->CreateSecret();
  }
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
  // In an allocation spanning several nodes the bus listens on every interface
  // and agents reach it by this node's name.
  const char* node_env = std::getenv("SLURMD_NODENAME");
  const std::string local_node = in_slurm && node_env != nullptr ? node_env : "";
  bool multi_node = false;
  for (const auto& a : plan.agents) {
    for (const auto& p : a.placement) multi_node = multi_node || (!local_node.empty() && p.node != local_node);
  }
  if (multi_node) bus_options.host = "0.0.0.0";
  auto bus = agentrt::BusServer::Start(bus_options, *secret, AclOf(plan));
  if (!bus.ok() && plan.bus.port != 0) {
    std::fputs(fmt::format("agentctl run: warning: bus port {} unavailable ({}); using a free port\n",
                           plan.bus.port, bus.status().message()).c_str(), stderr);
    bus_options.port = 0;
    bus = agentrt::BusServer::Start(bus_options, *secret, AclOf(plan));
  }
  if (!bus.ok()) Fail("run", bus.status().WithContext("cannot start the message bus"));
  plan.bus.host = multi_node ? local_node : "127.0.0.1";
  plan.bus.port = (*bus)->port();
  const std::string bus_address = plan.bus.host + ":" + std::to_string(plan.bus.port);
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
  auto runner = agentrt::slurm::MakeProcessRunner();
  std::unique_ptr<agentrt::LaunchBackend> backend;
  if (in_slurm) {
    agentrt::slurm::SrunOptions srun;
    srun.cpus_per_rank = opts.cpus_per_rank;
    for (const auto& a : plan.agents) {
      if (a.backend == agentrt::GroupBackend::kMpi && a.ranks > 1) srun.mpi_agents.push_back(a.name);
    }
    backend = agentrt::slurm::MakeSrunBackend(agentrt::MakePosixSpawner(), runner.get(), srun);
  } else {
    backend = agentrt::MakeLocalBackend(agentrt::MakePosixSpawner(), backend_options);
  }
  auto clock = agentrt::MakeSteadyClock();
  agentrt::RunController controller(
      plan.run, dir->path(),
      SupervisedAgents(plan, *dir, in_slurm ? bus_address : (*bus)->address(), (*telemetry)->endpoint(),
                       local_node),
      backend.get(),
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
                                  SignalLabel(sig)));
        controller.RequestStop(SignalLabel(sig));
      } else if (sig != SIGUSR2) {
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
  const char* job = std::getenv("SLURM_JOB_ID");
  if (in_slurm && g_last_signal.load() == SIGUSR2 && job != nullptr) {
    // Preempted or near the time limit: every agent has checkpointed; come back.
    Print(fmt::format("agentctl run: requeueing job {}; agents resume from their checkpoints\n", job));
    auto out = runner->Run({"scontrol", "requeue", job}, 60);
    if (!out.ok() || out->exit_code != 0) {
      std::fputs(fmt::format("agentctl run: scontrol requeue {} failed: {}\n", job,
                             out.ok() ? out->err : out.status().message()).c_str(), stderr);
      return controller.ExitCode();
    }
    return 0;
  }
  return controller.ExitCode();
}

// `--backend slurm-steps`: the batch shell of the allocation.
int RunInAllocation(const RunOptions& opts) {
  if (opts.run_dir.empty()) Fail("run", agentrt::InvalidArgument("--backend slurm-steps needs --run-dir"));
  agentrt::RunDir dir(opts.run_dir);
  auto plan = agentrt::ReadPlanFile(dir.PlanPath());
  if (!plan.ok()) Fail("run", plan.status());
  const char* restarts = std::getenv("SLURM_RESTART_COUNT");
  if (restarts != nullptr && std::string(restarts) != "0") {
    Print(fmt::format("agentctl run: job restart {} of run {}: resuming every agent from its checkpoint\n",
                      restarts, plan->run));
  }
  // The plan numbers GPUs as if the node were ours alone; SLURM may have given the
  // job others (another job holds 0-2). On this node, the plan's k-th GPU becomes
  // the job's k-th (SLURM_JOB_GPUS), so agents stay pairwise disjoint inside the
  // job and never touch another job's GPUs. Other nodes keep the plan's numbers.
  const char* job_gpus = std::getenv("SLURM_JOB_GPUS");
  const char* node = std::getenv("SLURMD_NODENAME");
  if (job_gpus != nullptr && node != nullptr) {
    std::vector<int> granted;
    std::stringstream list(job_gpus);
    for (std::string g; std::getline(list, g, ',');) {
      if (!g.empty()) granted.push_back(std::atoi(g.c_str()));
    }
    std::vector<int> planned;
    for (const auto& a : plan->agents) {
      for (const auto& p : a.placement) {
        if (p.node == node) planned.insert(planned.end(), p.gpus.begin(), p.gpus.end());
      }
    }
    std::sort(planned.begin(), planned.end());
    planned.erase(std::unique(planned.begin(), planned.end()), planned.end());
    if (!planned.empty() && granted.size() >= planned.size()) {
      for (auto& a : plan->agents) {
        for (auto& p : a.placement) {
          if (p.node != node) continue;
          for (int& g : p.gpus) {
            g = granted[std::lower_bound(planned.begin(), planned.end(), g) - planned.begin()];
          }
        }
      }
    } else if (!planned.empty()) {
      std::fputs(fmt::format("agentctl run: warning: SLURM gave the job GPUs {} on {}, fewer than the "
                             "plan's {}; keeping the plan's GPU numbers\n",
                             job_gpus, node, planned.size()).c_str(), stderr);
    }
  }
  return Supervise(std::move(*plan), dir, opts, /*in_slurm=*/true);
}

// `--backend slurm`: plan on the live cluster, write and submit the allocation,
// then follow the run through RUN_DIR/status.json (or return at once with --detach).
int SubmitSlurm(const RunOptions& opts, const agentrt::Config& config) {
  auto runner = agentrt::slurm::MakeProcessRunner();
  agentrt::slurm::SlurmClient slurm(*runner);
  auto text = slurm.ShowNodesText();
  if (!text.ok()) Fail("run", text.status().WithContext("cannot read the SLURM cluster"));
  auto nodes = agentrt::ParseScontrolNodes(*text);
  if (!nodes.ok()) Fail("run", nodes.status().WithContext("scontrol show node -o"));
  const agentrt::Inventory inventory = agentrt::InventoryFromSlurm(*nodes, config.slurm.partition);
  agentrt::PlanResult trial = agentrt::MakePlan(config, inventory);
  if (!trial.feasible()) {
    Fail("run", agentrt::ResourceExhausted(fmt::format("infeasible on {}: {}; nothing submitted",
                                                       inventory.source, trial.infeasible().reason)),
         kExitInfeasible);
  }
  auto created = agentrt::RunDir::Create(config.run.dir, config.run.name, std::chrono::system_clock::now());
  if (!created.ok()) Fail("run", created.status());
  const agentrt::RunDir dir(std::filesystem::absolute(created->path()).lexically_normal().string());
  agentrt::PlanOptions plan_options;
  plan_options.run_dir = dir.path();
  agentrt::Plan plan = agentrt::MakePlan(config, inventory, plan_options).plan();
  plan.run_dir = dir.path();
  for (const auto& w : plan.warnings) std::fputs(fmt::format("agentctl run: warning: {}\n", w).c_str(), stderr);
  agentrt::Status written = agentrt::WritePlanFile(plan, dir.PlanPath());
  if (!written.ok()) Fail("run", written);

  agentrt::slurm::AllocScriptOptions script_options;
  script_options.run_dir = dir.path();
  script_options.agentctl_path = agentrt::SelfExecutableDir() + "/agentctl";
  script_options.cpus_per_rank = opts.cpus_per_rank;
  const std::string script_path = dir.path() + "/alloc.sbatch";
  written = agentrt::WriteFileAtomic(script_path,
                                     agentrt::slurm::AllocationScript(plan, config.slurm, script_options));
  if (!written.ok()) Fail("run", written);
  auto job = slurm.Submit(script_path);
  if (!job.ok()) Fail("run", job.status());
  written = agentrt::WriteFileAtomic(dir.path() + "/slurm.job_id", *job + "\n");
  if (!written.ok()) Fail("run", written);
  Print(fmt::format("run {}: submitted job {} ({} agents), run dir {}\n", plan.run, *job, plan.agents.size(),
                    dir.path()));
  if (opts.detach) {
    Print(fmt::format("follow with: agentctl status {}; stop with: scancel {}\n", dir.path(), *job));
    return 0;
  }

  InstallSignalHandlers();
  const bool tty = ::isatty(STDOUT_FILENO) == 1;
  Display display(tty, opts.status_interval_s, opts.quiet);
  auto clock = agentrt::MakeSteadyClock();
  const double t0 = clock->NowSeconds();
  int stops_seen = 0;
  std::string last_state;
  int exit_code = 0;
  for (;;) {
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    const int stops = g_stop_signals.load();
    if (stops > stops_seen) {
      // First Ctrl-C: the controller stops every agent (they checkpoint); second: cancel.
      agentrt::slurm::CancelOptions cancel;
      if (stops_seen == 0) {
        cancel.signal = "TERM";
        cancel.batch_only = true;
      }
      stops_seen = stops;
      display.Event(fmt::format("agentctl run: stopping job {}", *job));
      (void)slurm.Cancel(*job, cancel);
    }
    auto status = agentrt::ReadRunStatusFile(dir.StatusPath());
    if (status.ok()) display.Table(*status, clock->NowSeconds() - t0);
    auto records = slurm.ShowJob(*job);
    if (!records.ok() || records->empty()) {
      if (records.status().code() == agentrt::StatusCode::kNotFound) break;
      continue;
    }
    const auto& r = records->front();
    if (r.state_text != last_state) {
      display.Event(fmt::format("[{:7.1f}s] job {} {}{}", clock->NowSeconds() - t0, *job, r.state_text,
                                r.restarts > 0 ? fmt::format(" (restart {})", r.restarts) : ""));
      last_state = r.state_text;
    }
    if (agentrt::slurm::IsTerminal(r.state)) {
      exit_code = r.exit_code != 0 ? r.exit_code : (r.exit_signal != 0 ? 128 + r.exit_signal : 0);
      break;
    }
  }
  auto final_status = agentrt::ReadRunStatusFile(dir.StatusPath());
  if (final_status.ok()) display.Table(*final_status, clock->NowSeconds() - t0, /*force=*/true);
  Print(fmt::format("run {} job {} ended with exit code {}; status: agentctl status {}\n", plan.run, *job,
                    exit_code, dir.path()));
  return exit_code;
}

}  // namespace

void RegisterRun(CLI::App& app) {
  auto opts = std::make_shared<RunOptions>();
  CLI::App* cmd = app.add_subcommand(
      "run", "Plan, start the bus, launch and supervise every agent; exit 0 when all succeeded");
  cmd->add_option("file", opts->file, "agents.yaml");
  cmd->add_option("--cluster", opts->cluster, "inventory YAML with a cluster: block (e.g. fake GPUs)");
  cmd->add_option("--set", opts->overrides, "override a setting: key.path=value (repeatable)");
  cmd->add_option("--backend", opts->backend,
                  "launch backend: local, or slurm (one allocation, every agent a job step)");
  cmd->add_flag("--detach", opts->detach, "--backend slurm: return once the allocation is submitted");
  cmd->add_option("--cpus-per-rank", opts->cpus_per_rank, "--backend slurm: CPUs of every rank")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--run-dir", opts->run_dir, "")->group("");  // hidden: --backend slurm-steps
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
