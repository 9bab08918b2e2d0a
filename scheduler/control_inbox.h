// The run driver's control inbox, a service of its own: at most every half
// second it takes the requests waiting in RUN_DIR/control/ (scheduler/control.h)
// and carries them out on the supervisor: stop the run, restart an agent. A
// request it cannot carry out is said, never dropped silently.
#pragma once

#include "common/clock.h"
#include "plan/run_dir.h"
#include "scheduler/run_controller.h"

namespace agentrt {

class RunObserver;

class ControlInbox {
 public:
  static constexpr double kPollIntervalS = 0.5;

  // `controller`, `clock` and `observer` outlive the inbox.
  ControlInbox(RunDir dir, RunController* controller, const Clock* clock, RunObserver* observer);

  // Takes and carries out the waiting requests, when kPollIntervalS has passed
  // since the last look (the first call looks at once).
  void Poll();

 private:
  RunDir dir_;
  RunController* controller_;
  const Clock* clock_;
  RunObserver* observer_;
  double checked_at_ = -1;
};

}  // namespace agentrt
