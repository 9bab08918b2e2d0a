// The run's message-bus broker as a process of its own: `agentrt-bus --plan`
// started and supervised by the run driver, so that the broker can die (kill
// -9, a crash) without the controller, and the controller without leaving a
// broker behind.
//
// - Started with PR_SET_PDEATHSIG (scheduler/process.h): it dies with the
//   controller, as it did when it ran inside it.
// - It reads the run's ACL, bus settings and TLS from RUN_DIR/plan.json and
//   which launch of each agent is current from the agents' checkpoint fences
//   (plan/fence.h: the launchers write them before each launch), so a
//   replaced launch is refused by every broker the run starts.
// - It writes RUN_DIR/bus.report.json (BrokerReport, plan/records.h), which
//   is how the controller sees its topics, subscribers and counters, and its
//   stderr to RUN_DIR/logs/bus.log.
// - One that dies is started again on the same port with the same durable
//   log (a broker with `durability: memory` comes back empty, as a new
//   incarnation; clients are told, as after any incarnation change). Clients
//   reconnect on their own. A broker that cannot come back is tried again,
//   with a delay that doubles from 0.25 s up to 4 s.
#pragma once

#include <sys/stat.h>
#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/clock.h"
#include "common/status.h"
#include "plan/records.h"
#include "plan/run_dir.h"
#include "scheduler/process.h"

namespace agentrt {

struct BrokerProcessOptions {
  std::string program;  // agentrt-bus
  std::string listen_host = "127.0.0.1";
  std::string advertised_host = "127.0.0.1";
  int port = 0;
  // How long a start may take until the broker serves: it reads its whole
  // durable log back first (BusServer::Start), which for a large one takes
  // minutes; a broker that serves by then is never killed for slowness.
  std::chrono::milliseconds ready_timeout{600000};
  // What time and processes are (the unit tests pass fakes): the steady
  // clock, and a spawner of real processes.
  const Clock* clock = SteadyClock();
  std::function<std::unique_ptr<ProcessSpawner>()> make_spawner = MakePosixSpawner;
};

// Thread-safety: one thread starts, supervises and stops it, and lives as
// long as the broker should (the run driver's: PR_SET_PDEATHSIG follows the
// spawning thread).
class BrokerProcess {
 public:
  // Starts the broker of the run in `dir` and returns once it serves. Errors:
  // AlreadyExists when its port cannot be bound (taken, or a bad address: the
  // caller may try another), else what its log says.
  static Result<std::unique_ptr<BrokerProcess>> Start(const RunDir& dir,
                                                      const BrokerProcessOptions& options);
  // A broker still running is killed (Shutdown first for a clean stop).
  ~BrokerProcess();
  BrokerProcess(const BrokerProcess&) = delete;
  BrokerProcess& operator=(const BrokerProcess&) = delete;

  // Without blocking: a broker that died is started again, and one starting
  // is looked at. Returns what to tell the user (one line each, no newline):
  // that it died and how, that it serves again, that it could not start.
  std::vector<std::string> Supervise();
  // Its newest report, as the broker serving now (or last) wrote it, with
  // broker_restarts set; nullopt while none can be read. The file is read
  // and parsed again only when the broker has rewritten it (the status
  // writer and the fsync warning both ask, several times a second).
  std::optional<BrokerReport> Report() const;
  // SIGTERM, then SIGKILL if it has not ended within `grace`.
  void Shutdown(std::chrono::milliseconds grace);

  int port() const { return options_.port; }
  pid_t pid() const { return pid_; }  // 0 while none runs
  int restarts() const { return restarts_; }
  const std::vector<std::string>& recovery_notes() const { return notes_; }

 private:
  BrokerProcess(RunDir dir, BrokerProcessOptions options);
  // Spawns a broker (pid_ set, starting_ true); errors when it cannot be spawned.
  Status Spawn();
  // Whether the broker spawned last serves now (its address file written, its
  // report from it); an error when it ended meanwhile or took too long.
  Result<bool> Ready();
  // A start that failed: said in `lines`, tried again after a delay that doubles.
  void Retry(const Status& why, std::vector<std::string>* lines);
  // How the broker `e` ended, for the user.
  std::string Ended(const ProcessExit& e) const;
  std::string LastLogLine() const;

  RunDir dir_;
  BrokerProcessOptions options_;
  std::unique_ptr<ProcessSpawner> spawner_;
  pid_t pid_ = 0;
  bool starting_ = false;
  bool stopped_ = false;
  Clock::TimePoint spawned_at_{};
  Clock::TimePoint died_at_{};
  uintmax_t log_from_ = 0;  // where the broker spawned last began its log
  Clock::TimePoint retry_at_{};
  std::chrono::milliseconds retry_delay_{250};
  int restarts_ = 0;
  std::vector<std::string> notes_;
  // The report file as last parsed, and which version of the file it was.
  mutable std::optional<BrokerReport> report_;
  mutable std::pair<ino_t, timespec> report_file_{};
};

}  // namespace agentrt
