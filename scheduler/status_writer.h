// The run driver's status writer, a service of its own: RUN_DIR/status.json
// as the supervisor sees the run (plus the bus's counters), and one line to
// the observer per agent state change. An agent's state change is written at
// once; anything else (steps, heartbeats, checkpoints) at most every
// MinIntervalS(): 1 ms per agent, at least 0.2 s and at most 1 s, so the cost
// does not grow with how often agents report, and a small run's file is fresh.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>

#include "common/clock.h"
#include "scheduler/run_controller.h"
#include "scheduler/status.h"

namespace agentrt {

class BrokerProcess;
class RunObserver;

class StatusWriter {
 public:
  // The shortest time between two writes that no state change forced.
  static double MinIntervalS(size_t agents) {
    return std::clamp(0.001 * static_cast<double>(agents), 0.2, 1.0);
  }

  // `controller`, `clock` and `observer` outlive the writer; `bus` may be null
  // (no bus block in status.json). `started_unix_s` is when the run started.
  StatusWriter(std::string path, const RunController* controller, const BrokerProcess* bus,
               double started_unix_s, const Clock* clock, RunObserver* observer);

  // The first status and a line for every agent; the run's time starts here.
  void Start();
  // Lines for agents whose state changed, and status.json when anything did.
  void Update();
  // The last lines and status.json, whatever changed.
  void Finish();
  // Seconds since Start().
  double elapsed_s() const;

 private:
  void Write();
  void ReportChanges();

  std::string path_;
  const RunController* controller_;
  const BrokerProcess* bus_;
  double started_unix_s_;
  const Clock* clock_;
  RunObserver* observer_;
  double t0_ = 0;
  uint64_t written_state_ = 0;
  uint64_t written_any_ = 0;
  double written_at_ = 0;
  RunStatus last_shown_;
};

}  // namespace agentrt
