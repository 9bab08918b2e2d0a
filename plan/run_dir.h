// agentrt::RunDir — the run directory, the one owner of its layout: every path
// under it, the agents' token paths and the run secret. Everything one
// `agentctl run` (or `agentctl sbatch`) leaves behind:
//
//   <run.dir>/<name>-<UTC timestamp>/     e.g. runs/demo-20261130T010431Z
//     plan.json  status.json  metrics.jsonl  controller.pid  controller.lock
//     plans/<agent>.json (the agent's view of plan.json, all its processes read)
//     logs/<agent>/rank<N>.log            checkpoints/<agent>/   agents/<agent>/ (working dirs)
//     agents/<agent>/preflight.json (`agentctl check`, plan/records.h)
//     secrets/ (0700)  run.secret (0600)  <agent>.token (0600)
//       ca.pem ca.key bus.pem bus.key (the run's own CA, bus.tls without cert_file)
//       dashboard.pem dashboard.key (`agentctl dashboard` beyond loopback)
//       <agent>.client.pem <agent>.client.key (bus.mtls)
//     bus/ (the durable bus log: logs/, spill/, incoming/ (the spool), incarnation)  league/
//     (state.json, lineage.jsonl) hangs/<agent>-<time>.json  control/ (requests to the live
//     controller) bus.address  slurm.job_id  alloc.sbatch   (SLURM modes)
//
// Secrets are only ever written to files; their bytes are never printed, put in
// an environment variable or on a command line.
//
// Plain value type; thread-safe to read. Blocking file I/O in the functions
// that touch the disk.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <memory>
#include <string>
#include <string_view>

#include "common/status.h"

namespace agentrt {

// The one spelling of a rank's log file inside its agent's log folder
// (RunDir::LogDir, or the log_dir a launcher was given): "<log_dir>/rank<N>.log".
inline std::string RankLogFile(const std::string& log_dir, std::string_view rank) {
  return log_dir + "/rank" + std::string(rank) + ".log";
}
inline std::string RankLogFile(const std::string& log_dir, int rank) {
  return RankLogFile(log_dir, std::to_string(rank));
}

// The durable bus log's layout inside its folder (RunDir::BusLogDir, or the
// log_dir an `agentrt-bus` was given): one segment folder per topic or inbox
// under logs/, large payloads of a bus without a log under spill/, the
// spool publishers on the broker's file system write large payloads into
// (incoming/, with .spool-id; bus.proto Spool), and the broker's incarnation.
inline std::string BusLogTopicsDir(const std::string& log_dir) { return log_dir + "/logs"; }
inline std::string BusLogSpillDir(const std::string& log_dir) { return log_dir + "/spill"; }
inline std::string BusLogSpoolDir(const std::string& log_dir) { return log_dir + "/incoming"; }
inline constexpr const char* kBusSpoolIdFile = ".spool-id";
inline std::string BusIncarnationFile(const std::string& log_dir) {
  return log_dir + "/incarnation";
}

// The one spelling of an agent's preflight result (PreflightReport,
// plan/records.h) in its working directory: "<workdir>/preflight.json".
inline std::string PreflightFile(const std::string& workdir) { return workdir + "/preflight.json"; }

// The one reader of a run secret file (RunDir::ReadSecret, `agentrt-bus
// --secret-file`): NotFound when it does not exist, PermissionDenied when
// group or others may read it, DataLoss when it is empty.
Result<std::string> ReadSecretFile(const std::string& path);

class RunDir {
 public:
  explicit RunDir(std::string path) : path_(std::move(path)) {}

  // Creates <base_dir>/<run_name>-<YYYYmmddTHHMMSSZ> (with a -N suffix if that
  // exists already) and its logs/, checkpoints/, agents/ and secrets/ (0700)
  // folders. The path is absolute.
  static Result<RunDir> Create(const std::string& base_dir, const std::string& run_name,
                               std::chrono::system_clock::time_point now);

  // An agent's checkpoint directory relative to the run directory, as the plan
  // records it ("checkpoints/<agent>").
  static std::string RelativeCheckpointDir(const std::string& agent) {
    return "checkpoints/" + agent;
  }
  // An agent's default working directory relative to the run directory.
  static std::string RelativeWorkDir(const std::string& agent) { return "agents/" + agent; }

  const std::string& path() const { return path_; }
  // `relative` under the run directory; an absolute path is returned as it is.
  std::string Resolve(const std::string& relative) const;

  std::string PlanPath() const { return path_ + "/plan.json"; }
  // What one agent's processes read of the plan (AgentPlanView, plan/plan.h).
  std::string PlanViewsDir() const { return path_ + "/plans"; }
  std::string AgentPlanPath(const std::string& agent) const {
    return PlanViewsDir() + "/" + agent + ".json";
  }
  std::string StatusPath() const { return path_ + "/status.json"; }
  std::string MetricsPath() const { return path_ + "/metrics.jsonl"; }
  std::string ControllerPidPath() const { return path_ + "/controller.pid"; }
  std::string ControllerLockPath() const { return path_ + "/controller.lock"; }
  std::string BusAddressPath() const { return path_ + "/bus.address"; }
  // The run's broker process (agentrt-bus): its report (BrokerReport,
  // plan/records.h) and its stderr.
  std::string BusReportPath() const { return path_ + "/bus.report.json"; }
  std::string BusProcessLogPath() const { return LogsDir() + "/bus.log"; }
  // Where the run's /metrics is served now, for Prometheus's file_sd_configs
  // (the dashboard writes it while it serves, and removes it when it stops).
  std::string PrometheusTargetsPath() const { return path_ + "/prometheus_targets.json"; }
  // The bus's durable log (topics, inboxes, incarnation): comms/bus_log.h.
  std::string BusLogDir() const { return path_ + "/bus"; }
  // The league service's committed state and the PBT lineage.
  std::string LeagueDir() const { return path_ + "/league"; }
  std::string LeagueStatePath() const { return LeagueDir() + "/state.json"; }
  std::string LineagePath() const { return LeagueDir() + "/lineage.jsonl"; }
  std::string SlurmJobIdPath() const { return path_ + "/slurm.job_id"; }
  std::string AllocScriptPath() const { return path_ + "/alloc.sbatch"; }
  // Hang reports: hangs/<agent>-<UTC timestamp>.json (HangReportPath).
  std::string HangsDir() const { return path_ + "/hangs"; }
  std::string HangReportPath(const std::string& agent,
                             std::chrono::system_clock::time_point at) const;
  // Requests to the live controller (`agentctl stop`/`restart`, the dashboard).
  std::string ControlDir() const { return path_ + "/control"; }
  std::string LogsDir() const { return path_ + "/logs"; }
  std::string LogDir(const std::string& agent) const { return LogsDir() + "/" + agent; }
  std::string RankLogPath(const std::string& agent, int rank) const {
    return RankLogFile(LogDir(agent), rank);
  }
  std::string CheckpointDir(const std::string& agent) const {
    return Resolve(RelativeCheckpointDir(agent));
  }
  std::string WorkDir(const std::string& agent) const { return Resolve(RelativeWorkDir(agent)); }
  std::string SecretsDir() const { return path_ + "/secrets"; }
  std::string SecretPath() const { return SecretsDir() + "/run.secret"; }
  std::string TokenPath(const std::string& agent) const {
    return SecretsDir() + "/" + agent + ".token";
  }
  // The run's own certificate authority and the broker's certificate it
  // signed (comms/run_ca.h), all 0600.
  std::string RunCaPath() const { return SecretsDir() + "/ca.pem"; }
  std::string RunCaKeyPath() const { return SecretsDir() + "/ca.key"; }
  std::string BusCertPath() const { return SecretsDir() + "/bus.pem"; }
  std::string BusKeyPath() const { return SecretsDir() + "/bus.key"; }
  // `agentctl dashboard` beyond loopback: its HTTPS certificate from the run's CA.
  std::string DashboardCertPath() const { return SecretsDir() + "/dashboard.pem"; }
  std::string DashboardKeyPath() const { return SecretsDir() + "/dashboard.key"; }
  // A bus client's certificate and key (bus.mtls), named for its agent.
  std::string ClientCertPath(const std::string& agent) const {
    return SecretsDir() + "/" + agent + ".client.pem";
  }
  std::string ClientKeyPath(const std::string& agent) const {
    return SecretsDir() + "/" + agent + ".client.key";
  }
  // ipc://<run dir>/telemetry.sock when the path fits a unix socket, else "".
  std::string TelemetryIpcEndpoint() const;

  // Creates secrets/ (0700) if missing, writes `bytes` fresh random bytes to
  // secrets/run.secret (0600) and returns them. The one secret generator.
  Result<std::string> CreateSecret(size_t bytes = 32) const;
  // The secret written by CreateSecret; refuses a file others may read.
  Result<std::string> ReadSecret() const;
  // ReadSecret when the secret exists (a requeued or resumed run keeps its
  // credentials), else CreateSecret.
  Result<std::string> LoadOrCreateSecret() const;

 private:
  std::string path_;
};

// What a run's controller holds for as long as it drives the run: an flock on
// RUN_DIR/controller.lock. The kernel drops it when the controller ends,
// however it ends (kill -9, power loss), so `agentctl status`, `stop` and
// `resume` tell a live controller from a dead one without timeouts or pid
// guesses, and a second controller of one run is refused.
class ControllerLock {
 public:
  // FailedPrecondition naming the live controller's pid when it is held.
  static Result<std::unique_ptr<ControllerLock>> Acquire(const RunDir& dir);
  ~ControllerLock();
  ControllerLock(const ControllerLock&) = delete;
  ControllerLock& operator=(const ControllerLock&) = delete;

 private:
  explicit ControllerLock(int fd) : fd_(fd) {}
  int fd_;
};

// True while some controller holds the run's ControllerLock.
bool ControllerRunning(const std::string& run_dir);

// The pid in RUN_DIR/controller.pid while the run's controller holds its lock
// (so a dead controller's recycled pid is never signalled); 0 otherwise.
pid_t LiveControllerPid(const std::string& run_dir);

// "20261130T010431Z".
std::string UtcTimestamp(std::chrono::system_clock::time_point t);

}  // namespace agentrt
