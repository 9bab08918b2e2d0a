// The run driver: everything `agentctl run` does between reading agents.yaml
// and its exit code, as a library, so it is driven with a fake backend and a
// ManualClock in tests exactly as the real command drives it.
//
// Preparing (PrepareRun): config -> inventory (ResolveInventory, one rule for
// every command) -> plan (made once; checkpoint dirs are relative to the run
// dir) -> the run directory.
//
// Driving (RunDriver), on the thread that owns the children:
//   Start()   controller.pid, the run secret and one token per agent, then its
//             services in one order: the bus (the run's broker process,
//             agentrt-bus, supervised by broker_process.h: it reads the plan's
//             ACL; plan.json once its port is known), telemetry intake
//             and metrics.jsonl, the league service, the supervisor
//             (RunController: every agent's launch) with node failover
//             (failover_service.h), PBT (pbt_service.h), the control inbox
//             (control_inbox.h) and the status writer (status_writer.h);
//   Step()    one turn: telemetry in (heartbeats, metrics), stop signals (the
//             first stops every agent gracefully, a second one kills), the
//             supervisor's Tick, PBT, control requests, the broker (one that
//             died is started again), status.json;
//   Finish()  the last status, the services down, the summary; the exit code.
// What a user sees goes to a RunObserver (the terminal in agentctl); stop
// signals come from a StopRequests (the process's signal handlers in agentctl).
//
// Thread-safety: one thread drives a RunDriver (the one that spawns children,
// see launch_backend.h).
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "common/clock.h"
#include "common/status.h"
#include "plan/config.h"
#include "plan/plan.h"
#include "plan/port_lease.h"
#include "plan/run_dir.h"
#include "scheduler/failover_service.h"
#include "scheduler/inventory.h"
#include "scheduler/launch_backend.h"
#include "scheduler/run_controller.h"
#include "scheduler/status.h"

namespace agentrt {

class BrokerProcess;
class TelemetryReceiver;
class MetricsWriter;
class LeagueService;
class PbtService;
class ControlInbox;
class StatusWriter;

// A plan with the run directory made for it.
struct PreparedRun {
  Plan plan;  // plan.run_dir == dir.path()
  RunDir dir;
  std::string inventory_source;  // where the nodes came from, for messages
  // Every port of the plan, leased on this machine (null when not asked for).
  std::unique_ptr<PortLeases> leases;
};

struct PrepareOptions {
  // Lease every port of the plan on this machine (LeaseRunPorts): what a
  // local run needs. Off for `--backend slurm` on a login node.
  bool lease_ports = true;
  std::string lease_dir = DefaultPortLeaseDir();
};

// ResolveInventory, MakePlan (once), RunDir::Create under config.run.dir, and
// the port leases. An infeasible plan is ResourceExhausted ("infeasible on
// <inventory>: <why>") and creates nothing; a plan whose ports cannot be
// leased fails the same way and leaves no run directory behind.
Result<PreparedRun> PrepareRun(Config& config, const InventoryRequest& inventory,
                               const ScontrolReader& read_scontrol,
                               const PrepareOptions& options = {});

// `agentctl resume RUN_DIR --replan`: a new plan of `config` for the existing
// run directory `dir` (its run name kept; checkpoint directories are by agent
// name, so they stay), with its ports leased. Writes nothing of the run.
Result<PreparedRun> PrepareReplan(Config& config, const InventoryRequest& inventory,
                                  const RunDir& dir, const std::string& run_name,
                                  const PrepareOptions& options = {});

// The agents of `plan` as the controller launches them: ranks in order with
// their node, local rank and GPUs; ports, checkpoint dir (absolute), log dir,
// bus address, token file and telemetry endpoint. MASTER_ADDR is 127.0.0.1
// when the agent's first node is `local_node` (or `local_node` is empty: a
// local run), else that node's name. A local run's agents number the GPUs of
// agentctl's CUDA_VISIBLE_DEVICES (AgentLaunch::launcher_visible_devices).
std::vector<SupervisedAgent> SupervisedAgentsOf(const Plan& plan, const RunDir& dir,
                                                const std::string& bus_address,
                                                const std::string& telemetry_endpoint,
                                                const std::string& local_node = "");

// What the user sees of a run.
class RunObserver {
 public:
  virtual ~RunObserver() = default;
  // One line: an agent's state change, a signal, the start of the run.
  virtual void Event(const std::string& line) = 0;
  // A warning or the failure summary (agentctl writes these to stderr).
  virtual void Warn(const std::string& text) = 0;
  // The live table; `force` at the end of the run.
  virtual void Progress(const RunStatus& status, double elapsed_s, bool force) = 0;
};

// How stop requests (SIGINT, SIGTERM, SIGUSR2 in an allocation) reach the driver.
class StopRequests {
 public:
  virtual ~StopRequests() = default;
  virtual int count() const = 0;        // requests so far
  virtual int last_signal() const = 0;  // the signal of the latest one
};

struct RunDriverOptions {
  // The bus listens here; agents are given advertised_host:<port>.
  std::string bus_listen_host = "127.0.0.1";
  std::string bus_advertised_host = "127.0.0.1";
  std::string local_node;  // inside an allocation: this node (SLURMD_NODENAME)
  // Telemetry listens on tcp://<telemetry_host>:<free port> when set (ranks on
  // other nodes), else on ipc://RUN_DIR/telemetry.sock. Either way only
  // messages signed with the agent's token count (comms/telemetry.h).
  std::string telemetry_host;
  // Node failover (scheduler/failover_service.h), inside an allocation: every
  // node the allocation holds, and who says which are down now (SLURM).
  // Without `down_nodes` a failed agent is relaunched where it was.
  std::vector<NodeSpec> allocation_nodes;
  DownNodes down_nodes;
  std::chrono::milliseconds poll{100};  // longest wait for telemetry per Step()
  // agentctl resume: the run's last status.json (RunController::Resume).
  std::optional<RunStatus> resume_from;
  // The broker program (agentrt-bus); "" : the one next to this executable.
  std::string broker_program;
};

class RunDriver {
 public:
  // `backend`, `clock`, `observer` and `stops` must outlive the driver.
  // `leases` (may be null) holds the plan's ports for the run's lifetime.
  RunDriver(Plan plan, RunDir dir, LaunchBackend* backend, const Clock* clock,
            RunObserver* observer, const StopRequests* stops, RunDriverOptions options = {},
            std::unique_ptr<PortLeases> leases = nullptr);
  ~RunDriver();
  RunDriver(const RunDriver&) = delete;
  RunDriver& operator=(const RunDriver&) = delete;

  // Errors name what could not be set up (nothing of the agents runs then).
  Status Start();
  // False once every agent is done (succeeded, failed or stopped).
  bool Step();
  // 0 when every agent succeeded, 1 when any failed, 130 when stopped.
  int Finish();
  // Start (an error is reported to the observer: exit 1), Step until done, Finish.
  int Run();

  const Plan& plan() const { return plan_; }
  const RunDir& dir() const { return dir_; }
  const RunController& controller() const { return *controller_; }
  // The signal of the last stop request, 0 when none came.
  int last_signal() const { return last_signal_; }
  // "host:port" agents connect to (empty before Start).
  const std::string& bus_address() const { return bus_address_; }

 private:
  // Start's steps, in its order.
  Status StartBus();
  Status ResolveBusTls();
  Status StartTelemetry(const std::string& secret);
  Status StartLeague(const std::string& secret);
  void StartSupervisor();
  void StartPbt();
  void StartControlInbox();
  void StartStatusWriter();
  // Every agent launched, the status kept current while they are.
  void LaunchAgents();
  // Telemetry waiting up to `timeout`, fed to the supervisor, metrics.jsonl
  // and PBT; false when none came (or polling failed).
  bool TakeTelemetry(std::chrono::milliseconds timeout);
  // A metrics.jsonl write or flush that failed: said once, the run goes on.
  void CheckMetrics(const Status& s);
  void WarnLeague();
  void WarnBusSyncErrors();
  void SuperviseBroker();

  Plan plan_;
  RunDir dir_;
  LaunchBackend* backend_;
  const Clock* clock_;
  RunObserver* observer_;
  const StopRequests* stops_;
  RunDriverOptions options_;

  std::unique_ptr<ControllerLock> lock_;
  std::unique_ptr<PortLeases> leases_;
  std::unique_ptr<BrokerProcess> bus_;
  std::unique_ptr<TelemetryReceiver> telemetry_;
  TelemetryBatch telemetry_batch_;  // the intake's reused message slots
  uint64_t rejected_seen_ = 0;      // telemetry_->rejected() already warned about
  std::unique_ptr<MetricsWriter> metrics_;
  std::unique_ptr<RunController> controller_;
  std::unique_ptr<FailoverService> failover_;
  std::unique_ptr<LeagueService> league_;  // before bus_ in destruction: a client of it
  int64_t league_refused_seen_ = 0;
  int64_t league_commit_failures_seen_ = 0;
  std::unique_ptr<PbtService> pbt_;
  std::unique_ptr<ControlInbox> control_;
  std::unique_ptr<StatusWriter> status_;
  std::string bus_address_;
  bool pid_file_written_ = false;
  double start_unix_s_ = 0;
  double sync_checked_at_ = 0;   // when the bus log's fsync errors were last looked at
  int64_t sync_errors_pid_ = 0;  // the broker whose errors sync_errors_seen_ counts
  static constexpr double kSuperviseIntervalS = 0.05;
  double supervised_at_ = 0;  // when Step() last supervised (Tick, services, status)
  // Telemetry is taken at most every kTelemetryBatch while it streams in: a
  // wake-up per message (thousands of agents' reports arrive spread over each
  // second) costs the controller more than the messages do.
  static constexpr std::chrono::milliseconds kTelemetryBatch{5};
  std::chrono::steady_clock::time_point took_telemetry_at_{};  // the last poll that found some
  int64_t sync_errors_seen_ = 0;
  bool metrics_failed_ = false;
  int stops_seen_ = 0;
  int last_signal_ = 0;
};

}  // namespace agentrt
