// The run directory: everything one `agentctl run` leaves behind.
//
//   <run.dir>/<name>-<UTC timestamp>/     e.g. runs/demo-20261130T010431Z
//     plan.json  status.json  metrics.jsonl  controller.pid
//     logs/<agent>/rank<N>.log            checkpoints/<agent>/
//     secrets/ (0700)  run.secret (0600)  <agent>.token (0600)
//
// Secrets are only ever written to files; their bytes are never printed, put in
// an environment variable or on a command line.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <string>

#include "common/status.h"

namespace agentrt {

class RunDir {
 public:
  explicit RunDir(std::string path) : path_(std::move(path)) {}

  // Creates <base_dir>/<run_name>-<YYYYmmddTHHMMSSZ> (with a -N suffix if that
  // exists already) and its logs/, checkpoints/ and secrets/ (0700) folders.
  static Result<RunDir> Create(const std::string& base_dir, const std::string& run_name,
                               std::chrono::system_clock::time_point now);

  const std::string& path() const { return path_; }
  std::string PlanPath() const { return path_ + "/plan.json"; }
  std::string StatusPath() const { return path_ + "/status.json"; }
  std::string MetricsPath() const { return path_ + "/metrics.jsonl"; }
  std::string ControllerPidPath() const { return path_ + "/controller.pid"; }
  std::string LogDir(const std::string& agent) const { return path_ + "/logs/" + agent; }
  std::string RankLogPath(const std::string& agent, int rank) const {
    return LogDir(agent) + "/rank" + std::to_string(rank) + ".log";
  }
  std::string CheckpointDir(const std::string& agent) const { return path_ + "/checkpoints/" + agent; }
  std::string SecretsDir() const { return path_ + "/secrets"; }
  std::string SecretPath() const { return SecretsDir() + "/run.secret"; }
  std::string TokenPath(const std::string& agent) const { return SecretsDir() + "/" + agent + ".token"; }
  // ipc://<run dir>/telemetry.sock when the path fits a unix socket, else "".
  std::string TelemetryIpcEndpoint() const;

  // Writes `bytes` random bytes (from /dev/urandom) to secrets/run.secret, 0600,
  // and returns them.
  Result<std::string> CreateSecret(size_t bytes = 32) const;

 private:
  std::string path_;
};

// The pid in RUN_DIR/controller.pid when that process is still alive and is an
// agentctl (so a recycled pid is never signalled); 0 otherwise.
pid_t LiveControllerPid(const std::string& run_dir);

// "20261130T010431Z".
std::string UtcTimestamp(std::chrono::system_clock::time_point t);

// Writes `contents` to `path` atomically: a temporary file next to it with
// `mode`, fsync'd, then renamed over `path`.
Status WriteFileAtomic(const std::string& path, const std::string& contents, int mode = 0644);

// The whole file, or NotFound / an errno status naming the path.
Result<std::string> ReadWholeFile(const std::string& path);

}  // namespace agentrt
