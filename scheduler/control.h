// Requests to a running controller from outside it (the dashboard's "stop run"
// and "restart agent"): one small JSON file per request in RUN_DIR/control/,
// written atomically by whoever asks and taken (read, then removed) by the
// run's ControlInbox (scheduler/control_inbox.h), which looks every half second. A file and not
// a signal or a socket because the asker may be on another host that shares
// only the run directory (a login node of a SLURM cluster).
//
//   {"action": "stop" | "restart", "agent": "<name>" (restart), "by": "<who>", "time": <unix s>}
//
// Thread-safety: functions only; each request is its own file.
#pragma once

#include <string>
#include <vector>

#include "common/status.h"
#include "plan/run_dir.h"

namespace agentrt {

struct ControlRequest {
  std::string action;  // "stop" or "restart"
  std::string agent;   // restart: the agent
  std::string by;      // who asked, for the reason line ("the dashboard")
  double time = 0;
  std::string file;  // where it was read from (TakeControlRequests)
};

// RUN_DIR/control/<time ns>-<action>.json; InvalidArgument for an unknown action.
Status WriteControlRequest(const RunDir& dir, const ControlRequest& request);
// Every request waiting, oldest first, each removed once read; a file that is
// not a request is removed and reported in `refused` ("file: why").
std::vector<ControlRequest> TakeControlRequests(const RunDir& dir,
                                                std::vector<std::string>* refused);

}  // namespace agentrt
