#include "scheduler/run_driver.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <thread>

#include "common/file_util.h"
#include "common/net.h"
#include "comms/auth.h"
#include "comms/bus_server.h"
#include "comms/run_ca.h"
#include "comms/telemetry.h"
#include "plan/records.h"
#include "scheduler/broker_process.h"
#include "scheduler/control_inbox.h"
#include "scheduler/league_service.h"
#include "scheduler/pbt_service.h"
#include "scheduler/planner.h"
#include "scheduler/status_writer.h"

namespace agentrt {

namespace {

// The plan of `config` on its inventory; ResourceExhausted when infeasible.
Result<std::pair<Plan, std::string>> PlanOnInventory(Config& config,
                                                     const InventoryRequest& inventory_request,
                                                     const ScontrolReader& read_scontrol) {
  AGENTRT_ASSIGN_OR_RETURN(const Inventory inventory,
                           ResolveInventory(config, inventory_request, read_scontrol));
  PlanResult planned = MakePlan(config, inventory);
  if (!planned.feasible()) {
    return ResourceExhausted(
        fmt::format("infeasible on {}: {}", inventory.source, planned.infeasible().reason));
  }
  return std::pair{std::move(planned).plan(), inventory.source};
}

// Leases every port of `plan` in `dir` (when asked to).
Result<std::unique_ptr<PortLeases>> LeasePlanPorts(Plan& plan, const RunDir& dir,
                                                   const PrepareOptions& options) {
  if (!options.lease_ports) return std::unique_ptr<PortLeases>();
  AGENTRT_ASSIGN_OR_RETURN(auto l, PortLeases::Open(dir.path(), options.lease_dir));
  AGENTRT_RETURN_IF_ERROR(LeaseRunPorts(
      plan, plan.ports, [](const AgentPlan&) { return true; }, *l));
  return l;
}

}  // namespace

Result<PreparedRun> PrepareRun(Config& config, const InventoryRequest& inventory_request,
                               const ScontrolReader& read_scontrol, const PrepareOptions& options) {
  AGENTRT_ASSIGN_OR_RETURN(auto planned, PlanOnInventory(config, inventory_request, read_scontrol));
  AGENTRT_ASSIGN_OR_RETURN(RunDir dir, RunDir::Create(config.run.dir, config.run.name,
                                                      std::chrono::system_clock::now()));
  Plan plan = std::move(planned.first);
  plan.run_dir = dir.path();
  auto leases = LeasePlanPorts(plan, dir, options);
  if (!leases.ok()) {
    std::error_code ec;
    std::filesystem::remove_all(dir.path(), ec);  // nothing was started: leave nothing behind
    return leases.status().WithContext("cannot lease the run's ports on this machine");
  }
  return PreparedRun{std::move(plan), std::move(dir), planned.second, std::move(leases).value()};
}

Result<PreparedRun> PrepareReplan(Config& config, const InventoryRequest& inventory_request,
                                  const RunDir& dir, const std::string& run_name,
                                  const PrepareOptions& options) {
  AGENTRT_ASSIGN_OR_RETURN(auto planned, PlanOnInventory(config, inventory_request, nullptr));
  Plan plan = std::move(planned.first);
  plan.run = run_name;
  plan.run_dir = dir.path();
  auto leases = LeasePlanPorts(plan, dir, options);
  if (!leases.ok()) {
    return leases.status().WithContext("cannot lease the new plan's ports on this machine");
  }
  return PreparedRun{std::move(plan), dir, planned.second, std::move(leases).value()};
}

namespace {

// One agent of the plan, as SupervisedAgentsOf describes; `launcher_visible`:
// the CUDA_VISIBLE_DEVICES of a local run's agentctl (nullptr: none).
SupervisedAgent SupervisedAgentOf(const AgentPlan& ap, const RunDir& dir,
                                  const std::string& bus_address, const std::string& bus_ca_file,
                                  const std::string& telemetry_endpoint,
                                  const std::string& local_node, const char* launcher_visible) {
  SupervisedAgent s;
  AgentLaunch& l = s.launch;
  l.name = ap.name;
  l.index = ap.index;
  for (const Placement& p : ap.placement) {
    for (size_t i = 0; i < p.ranks.size(); ++i) {
      l.ranks.push_back(
          {p.ranks[i], static_cast<int>(i), static_cast<int>(p.ranks.size()), p.node, p.gpus});
    }
  }
  std::sort(l.ranks.begin(), l.ranks.end(),
            [](const RankLaunch& a, const RankLaunch& b) { return a.rank < b.rank; });
  l.command = ap.command;
  l.env = ap.env;
  // Local runs: every rank runs here; plan node names need not resolve.
  // Inside an allocation: the plan's address of the agent's first node (its
  // NodeAddr, else its name), unless every rank runs on this node.
  const bool here =
      local_node.empty() || std::all_of(l.ranks.begin(), l.ranks.end(),
                                        [&](const RankLaunch& r) { return r.node == local_node; });
  l.master_addr =
      here ? "127.0.0.1" : (!ap.master_addr.empty() ? ap.master_addr : l.ranks.front().node);
  l.master_port = ap.master_port;
  l.ports_first = ap.ports.first;
  l.ports_last = ap.ports.last;
  l.run_dir = dir.path();
  l.checkpoint_dir = dir.Resolve(ap.checkpoint_dir);
  l.workdir = dir.Resolve(ap.workdir);
  l.log_dir = dir.LogDir(ap.name);
  l.bus_address = bus_address;
  l.token_file = dir.TokenPath(ap.name);
  l.bus_ca_file = bus_ca_file;
  l.telemetry_endpoint = telemetry_endpoint;
  l.use_mpirun = LaunchesThroughMpi(ap.backend, ap.ranks);
  l.planned_ranks = ap.planned_ranks;
  if (launcher_visible != nullptr) l.launcher_visible_devices = launcher_visible;
  s.restart = ap.restart;
  s.group = ap.group;
  s.peak_flops = ap.peak_flops;
  return s;
}

}  // namespace

std::vector<SupervisedAgent> SupervisedAgentsOf(const Plan& plan, const RunDir& dir,
                                                const std::string& bus_address,
                                                const std::string& telemetry_endpoint,
                                                const std::string& local_node) {
  // A local run: the plan numbers the GPUs agentctl sees (read once for all agents).
  const char* visible = local_node.empty() ? std::getenv("CUDA_VISIBLE_DEVICES") : nullptr;
  std::vector<SupervisedAgent> out;
  for (const AgentPlan& ap : plan.agents) {
    out.push_back(SupervisedAgentOf(ap, dir, bus_address, plan.bus.settings.ClientCaFile(),
                                    telemetry_endpoint, local_node, visible));
  }
  return out;
}

RunDriver::RunDriver(Plan plan, RunDir dir, LaunchBackend* backend, const Clock* clock,
                     RunObserver* observer, const StopRequests* stops, RunDriverOptions options,
                     std::unique_ptr<PortLeases> leases)
    : plan_(std::move(plan)),
      dir_(std::move(dir)),
      backend_(backend),
      clock_(clock),
      observer_(observer),
      stops_(stops),
      options_(std::move(options)),
      leases_(std::move(leases)) {}

RunDriver::~RunDriver() {
  if (bus_) bus_->Shutdown(std::chrono::milliseconds(1000));
  // controller.pid lives exactly as long as this controller (also when Start failed).
  if (pid_file_written_) {
    std::error_code ec;
    std::filesystem::remove(dir_.ControllerPidPath(), ec);
  }
}

Status RunDriver::Start() {
  // One start-up order: the run's lock and credentials, the bus, telemetry
  // intake, the league service, the supervisor (with failover), the status
  // writer with the first status (every agent pending), PBT (which first
  // recovers an exploit a dead controller left half-written), the launches
  // (the status kept current meanwhile) and the control inbox.
  // One controller per run, and `agentctl status` can tell whether it lives.
  AGENTRT_ASSIGN_OR_RETURN(lock_, ControllerLock::Acquire(dir_));
  AGENTRT_RETURN_IF_ERROR(
      WriteFileAtomic(dir_.ControllerPidPath(), std::to_string(::getpid()) + "\n"));
  pid_file_written_ = true;
  // Credentials: one run secret (never printed, never in env or argv), the
  // bus's TLS (the run's CA and what it signs), one token file per agent. A
  // requeued or resumed run keeps the secret and CA it made first.
  AGENTRT_ASSIGN_OR_RETURN(const std::string secret, dir_.LoadOrCreateSecret());
  AGENTRT_RETURN_IF_ERROR(ResolveBusTls());
  AGENTRT_RETURN_IF_ERROR(WriteAgentTokens(dir_, secret, plan_));
  AGENTRT_RETURN_IF_ERROR(StartBus());
  AGENTRT_RETURN_IF_ERROR(StartTelemetry(secret));
  AGENTRT_RETURN_IF_ERROR(StartLeague(secret));
  StartSupervisor();
  StartStatusWriter();
  StartPbt();
  LaunchAgents();
  StartControlInbox();
  return Status::Ok();
}

// The bus: the run's broker process (broker_process.h) on the plan's port (an
// auto one moves past a port an outsider holds); it reads plan.json, which
// says where it listens.
Status RunDriver::StartBus() {
  // The broker's settings are checked here, where an error can name them.
  AGENTRT_RETURN_IF_ERROR(BrokerOptionsFor(plan_.bus.settings, dir_.BusLogDir()).status());
  BrokerProcessOptions bus_options;
  bus_options.program = options_.broker_program.empty() ? SelfExecutableDir() + "/agentrt-bus"
                                                        : options_.broker_program;
  bus_options.listen_host = options_.bus_listen_host;
  bus_options.advertised_host = options_.bus_advertised_host;
  bus_options.port = plan_.bus.port;
  auto start = [&]() -> Result<std::unique_ptr<BrokerProcess>> {
    plan_.bus.host = options_.bus_advertised_host;
    plan_.bus.port = bus_options.port;
    plan_.bus.settings.port = bus_options.port;
    AGENTRT_RETURN_IF_ERROR(WriteRunPlan(plan_, dir_.path()));
    return BrokerProcess::Start(dir_, bus_options);
  };
  auto bus = start();
  // An auto port that a process outside agentrt's leases holds: the next free one.
  for (int tries = 0; !bus.ok() && bus.status().code() == StatusCode::kAlreadyExists &&
                      !plan_.bus.fixed_port && leases_ && tries < 20;
       ++tries) {
    const int taken = bus_options.port;
    leases_->Release(taken, taken).IgnoreError();  // ours; held by an outsider
    int next = -1;
    for (int p = taken + 1; p <= plan_.ports.last && next < 0; ++p) {
      if (leases_->Free(p, p)) next = p;
    }
    if (next < 0 || !leases_->Acquire(next, next).ok()) break;
    observer_->Warn(fmt::format(
        "agentctl run: bus port {} is used by a program outside agentrt; the bus takes {}\n", taken,
        next));
    bus_options.port = next;
    bus = start();
  }
  if (!bus.ok()) {
    return bus.status().WithContext(
        plan_.bus.fixed_port
            ? fmt::format("cannot start the message bus on bus.port {} (set another, or auto)",
                          plan_.bus.port)
            : std::string("cannot start the message bus"));
  }
  bus_ = std::move(bus).value();
  for (const std::string& note : bus_->recovery_notes())
    observer_->Warn("agentctl run: " + note + "\n");
  bus_address_ = plan_.bus.host + ":" + std::to_string(plan_.bus.port);
  return Status::Ok();
}

// A broker that died is started again (on its port, with its log); the user
// is told when it died and when it serves again.
void RunDriver::SuperviseBroker() {
  for (const std::string& line : bus_->Supervise()) observer_->Warn("agentctl run: " + line + "\n");
}

// bus.tls decided for this start (comms/run_ca.h): the run's CA, and with
// bus.mtls a certificate for each client.
Status RunDriver::ResolveBusTls() {
  std::vector<std::string> clients = {kLeagueServiceName};
  for (const AgentPlan& a : plan_.agents) clients.push_back(a.name);
  // The broker process signs its own certificate with the run's CA, anew at
  // each start, for the host it advertises (agentrt-bus --plan): a requeued
  // run may serve from another node.
  return PrepareBusTls(dir_, plan_.bus, !IsLoopbackHost(options_.bus_listen_host), clients);
}

// Telemetry intake (signed with the agents' tokens) and metrics.jsonl.
Status RunDriver::StartTelemetry(const std::string& secret) {
  std::string endpoint = options_.telemetry_host.empty()
                             ? dir_.TelemetryIpcEndpoint()
                             : "tcp://" + options_.telemetry_host + ":*";
  if (endpoint.empty()) endpoint = "tcp://127.0.0.1:*";
  TelemetryReceiverOptions telemetry_options;
  for (const AgentPlan& a : plan_.agents) {
    telemetry_options.tokens[a.name] = DeriveAgentToken(secret, a.name);
  }
  auto telemetry = TelemetryReceiver::Bind(endpoint, std::move(telemetry_options));
  if (!telemetry.ok())
    return telemetry.status().WithContext("cannot bind telemetry at " + endpoint);
  telemetry_ = std::move(telemetry).value();
  start_unix_s_ = UnixTimeSeconds();
  AGENTRT_ASSIGN_OR_RETURN(metrics_, MetricsWriter::Open(dir_.MetricsPath(), start_unix_s_));
  return Status::Ok();
}

// The league service, a client of the run's own bus (plan.league).
Status RunDriver::StartLeague(const std::string& secret) {
  if (!plan_.league.enabled()) return Status::Ok();
  LeagueServiceOptions league;
  league.bus_address = bus_address_;
  league.credential = RunCredential(dir_, secret, kLeagueServiceName, plan_.bus.settings.mtls);
  league.state_path = dir_.LeagueStatePath();
  league.bus.tls_ca_file = plan_.bus.settings.ClientCaFile();
  auto service = LeagueService::Start(plan_.league, std::move(league));
  if (!service.ok()) return service.status().WithContext("cannot start the league service");
  league_ = std::move(service).value();
  return Status::Ok();
}

// The supervisor of every agent (relaunching on a spare node when one fails,
// with failover), before it launches them.
void RunDriver::StartSupervisor() {
  controller_ = std::make_unique<RunController>(
      plan_.run, dir_.path(),
      SupervisedAgentsOf(plan_, dir_, bus_address_, telemetry_->endpoint(), options_.local_node),
      backend_, clock_);
  observer_->Event(fmt::format("run {}: {} agents, run dir {}, bus {}", plan_.run,
                               plan_.agents.size(), dir_.path(), bus_address_));
  if (options_.down_nodes) {
    failover_ = std::make_unique<FailoverService>(
        &plan_, dir_, options_.allocation_nodes, options_.down_nodes,
        RunEndpoints{bus_address_, telemetry_->endpoint(), options_.local_node}, observer_);
    controller_->SetRelaunchAdvisor(
        [this](AgentLaunch& launch) { return failover_->Advise(launch); });
  }
  if (options_.resume_from) controller_->Resume(*options_.resume_from);
}

void RunDriver::LaunchAgents() {
  controller_->Start([this] {
    TakeTelemetry(std::chrono::milliseconds(0));
    status_->Update();
  });
  status_->Update();
  stops_seen_ = stops_ != nullptr ? stops_->count() : 0;
}

// status.json and the agents' state lines, from the supervisor's first status on.
void RunDriver::StartStatusWriter() {
  status_ = std::make_unique<StatusWriter>(dir_.StatusPath(), controller_.get(), bus_.get(),
                                           start_unix_s_, clock_, observer_);
  status_->Start();
}

// PBT, once the supervisor whose agents it replaces is up, and before they
// launch: an exploit a dead controller left without its lineage line is
// recovered first, so its recipient starts with its new hyperparameters.
void RunDriver::StartPbt() {
  if (plan_.pbt.empty()) return;
  RecoverExploits(&plan_, dir_, observer_);
  pbt_ = std::make_unique<PbtService>(&plan_, dir_, controller_.get(), league_.get(), clock_,
                                      observer_);
}

// Stop and restart requests from RUN_DIR/control, once there is a supervisor to ask.
void RunDriver::StartControlInbox() {
  control_ = std::make_unique<ControlInbox>(dir_, controller_.get(), clock_, observer_);
}

void RunDriver::CheckMetrics(const Status& s) {
  if (s.ok() || metrics_failed_) return;
  metrics_failed_ = true;
  observer_->Warn("agentctl run: warning: " + s.message() +
                  ": metrics.jsonl misses lines from here on (disk full?)\n");
}

namespace {

std::string SignalLabel(int sig) {
  return sig == SIGINT ? "SIGINT" : sig == SIGUSR2 ? "SIGUSR2 (preemption)" : "SIGTERM";
}

}  // namespace

bool RunDriver::TakeTelemetry(std::chrono::milliseconds timeout) {
  // Real time, not clock_: this paces the process's wake-ups. A caller that
  // may not wait (between launches) takes none before the next batch is due.
  const auto next = took_telemetry_at_ + kTelemetryBatch;
  if (std::chrono::steady_clock::now() < next) {
    if (timeout.count() == 0) return false;
    std::this_thread::sleep_until(next);
  }
  if (!telemetry_->PollInto(&telemetry_batch_, timeout).ok() || telemetry_batch_.empty())
    return false;
  took_telemetry_at_ = std::chrono::steady_clock::now();
  for (const TelemetryMessage& m : telemetry_batch_) {
    controller_->OnTelemetry(m);
    if (m.type == TelemetryType::kMetrics) {
      CheckMetrics(metrics_->Write(m));
      if (pbt_) pbt_->OnReport(m);
    }
  }
  CheckMetrics(metrics_->Flush());
  return true;
}

bool RunDriver::Step() {
  if (controller_->Finished()) return false;
  // Supervision walks every agent: while telemetry streams in, at most every
  // kSuperviseIntervalS, so its cost does not grow with how often agents report.
  const bool idle = !TakeTelemetry(options_.poll);
  const double now = clock_->NowSeconds();
  if (!idle && now - supervised_at_ < kSuperviseIntervalS) return !controller_->Finished();
  supervised_at_ = now;
  if (telemetry_->rejected() > rejected_seen_) {
    // Said once per burst: something without an agent's token is talking.
    observer_->Warn(fmt::format(
        "agentctl run: warning: {} telemetry message(s) at {} refused: not signed with the "
        "token of the agent they name, or replayed\n",
        telemetry_->rejected() - rejected_seen_, telemetry_->endpoint()));
    rejected_seen_ = telemetry_->rejected();
  }
  if (!controller_->requeue_reason().empty() && !controller_->stop_requested()) {
    // A node failed with no spare left: as on preemption, every agent
    // checkpoints and the allocation is requeued (last_signal() says so).
    observer_->Event("agentctl run: " + controller_->requeue_reason());
    controller_->RequestStop("requeue: " + controller_->requeue_reason());
    last_signal_ = SIGUSR2;
  }
  const int stops = stops_ != nullptr ? stops_->count() : 0;
  if (stops > stops_seen_) {
    stops_seen_ = stops;
    const int sig = stops_->last_signal();
    last_signal_ = sig;
    if (!controller_->stop_requested()) {
      observer_->Event(fmt::format(
          "agentctl run: {} received: stopping every agent (SIGTERM, then SIGKILL after each "
          "agent's grace_s; press Ctrl-C again to kill now)",
          SignalLabel(sig)));
      controller_->RequestStop(SignalLabel(sig));
    } else if (sig != SIGUSR2) {
      observer_->Event("agentctl run: second stop signal: killing every agent now");
      for (const AgentPlan& a : plan_.agents) backend_->Signal(a.name, SIGKILL).IgnoreError();
    }
  }
  controller_->Tick();
  if (pbt_) pbt_->Advance();
  if (league_) WarnLeague();
  control_->Poll();
  SuperviseBroker();
  WarnBusSyncErrors();
  status_->Update();
  observer_->Progress(controller_->status(), status_->elapsed_s(), false);
  return !controller_->Finished();
}

// The durable log's background fsyncs failing (disk full, I/O errors): batch
// mode's promise is broken; said at most once a second, once per new burst.
void RunDriver::WarnBusSyncErrors() {
  const double now = clock_->NowSeconds();
  if (now - sync_checked_at_ < 1.0) return;
  sync_checked_at_ = now;
  const std::optional<BrokerReport> report = bus_->Report();
  if (!report) return;
  if (report->pid != sync_errors_pid_) {  // a new broker counts from 0
    sync_errors_pid_ = report->pid;
    sync_errors_seen_ = 0;
  }
  const int64_t errors = report->log_sync_errors;
  if (errors <= sync_errors_seen_) return;
  observer_->Warn(fmt::format(
      "agentctl run: the bus log under {} failed {} fsync(s): messages since the last good "
      "one are not durable (disk full? I/O errors?)\n",
      dir_.BusLogDir(), errors - sync_errors_seen_));
  sync_errors_seen_ = errors;
}

int RunDriver::Finish() {
  // Telemetry still in flight (the checkpoint an agent committed as it
  // stopped): take it before the last status is written.
  for (int i = 0; i < 10; ++i) {
    if (!telemetry_->PollInto(&telemetry_batch_, std::chrono::milliseconds(20)).ok() ||
        telemetry_batch_.empty())
      break;
    for (const TelemetryMessage& m : telemetry_batch_) {
      controller_->OnTelemetry(m);
      if (m.type == TelemetryType::kMetrics) CheckMetrics(metrics_->Write(m));
    }
  }
  status_->Finish();
  CheckMetrics(metrics_->Flush());
  observer_->Progress(controller_->status(), status_->elapsed_s(), true);
  pbt_.reset();     // holds the league service (for ratings)
  league_.reset();  // its state is committed after every change
  bus_->Shutdown(std::chrono::milliseconds(3000));
  const std::string summary = controller_->Summary();
  if (!summary.empty()) observer_->Warn(summary);
  observer_->Event(fmt::format("run {} {}; status: agentctl status {}", plan_.run,
                               RunStateName(controller_->status().state), dir_.path()));
  return controller_->ExitCode();
}

int RunDriver::Run() {
  if (Status s = Start(); !s.ok()) {
    observer_->Warn("agentctl run: " + s.message() + "\n");
    return 1;
  }
  while (Step()) {
  }
  return Finish();
}

void RunDriver::WarnLeague() {
  if (league_->refused() > league_refused_seen_) {
    league_refused_seen_ = league_->refused();
    observer_->Warn("agentctl run: league: request refused: " + league_->last_error() + "\n");
  }
  if (league_->commit_failures() > league_commit_failures_seen_) {
    league_commit_failures_seen_ = league_->commit_failures();
    observer_->Warn("agentctl run: league: cannot commit " + dir_.LeagueStatePath() + ": " +
                    league_->last_error() + "\n");
  }
}

}  // namespace agentrt
