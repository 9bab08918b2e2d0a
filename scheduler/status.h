// The run status: what `agentctl run` keeps in RUN_DIR/status.json (rewritten
// atomically on every change) and what `agentctl status` shows, while the run
// goes on and after it has ended.
//
// JSON shape (keys after "metrics" and top-level keys after "agents"
// are additive):
//   {"run": "demo", "state": "running|succeeded|failed|stopped",
//    "agents": [{"name": "predator-0",
//                "state": "pending|running|restarting|succeeded|failed|stopped",
//                "restarts": 1,
//                "replacements": 0, "resumes": 0,  // of the restarts: planned, not failures
//                "ranks": [{"rank": 0, "pid": 4242, "node": "localhost", "exit_code": null,
//                           "heard_unix_s": 1764460031.2}],
//                "planned_ranks": 4,               // only while it runs shrunk (restart.elastic)
//                "last_checkpoint_step": 400,      // null: none yet
//                "metrics": {"loss": 0.1},         // latest values reported
//                "step": 420, "steps_per_s": 35.5, "master_port": 20016,
//                "reason": "rank 1 (pid 4243) was killed by SIGKILL (signal 9)",
//                "log_tail": ["Traceback ...", "..."],  // a failed agent's last log lines
//                "log_dir": "/abs/run/logs/predator-0",
//                "restored_step": 400,            // null: not reported; -1: fresh start
//                "skipped_checkpoints": [600],    // corrupt checkpoints passed over
//                "flops_per_sample": 0, "achieved_flops": 0, "peak_flops": 1.9e15,
//                "collective_share": 0.4}],       // -1: not known
//    "run_dir": "/abs/run", "controller_pid": 4200, "started_unix_s": 1764460000.1,
//    "updated_unix_s": 1764460042.3,
//    "node_failures": [{"node": "n2", "time": 1764460040.0, "agent": "prey-0",
//                       "moved_to": "n4", "shrunk": false}],  // "" and not shrunk: requeued
//    "requeue_reason": ""}                      // set when the run requeues its allocation
// exit_code: null while the rank runs (or is not known), the exit status once it
// has exited, minus the signal number when a signal killed it (-9).
//
// Plain data; not synchronised.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "plan/records.h"

namespace agentrt {

enum class AgentState { kPending, kRunning, kRestarting, kSucceeded, kFailed, kStopped };
enum class RunState { kRunning, kSucceeded, kFailed, kStopped };

std::string_view AgentStateName(AgentState state);
std::string_view RunStateName(RunState state);
bool IsTerminal(AgentState state);

struct RankStatus {
  int rank = 0;
  int64_t pid = 0;
  std::string node;
  std::optional<int> exit_code;  // -signal when killed by a signal
  // When the controller heard the rank's latest telemetry message of this
  // incarnation (the controller's clock, Unix s: the rank's node clock may be
  // off or stepped); unset until it sends one.
  std::optional<double> heard_unix_s;
};

struct AgentStatus {
  std::string name;
  AgentState state = AgentState::kPending;
  int restarts = 0;  // relaunches, each a new incarnation (AGENTRT_RESTART_COUNT)
  // ... of which PBT exploits and resumes after a stop or a lost controller:
  // not failures (max_restarts counts the rest).
  int replacements = 0;
  int resumes = 0;
  std::vector<RankStatus> ranks;
  // restart.elastic: the ranks planned while it runs shrunk on fewer (its
  // `ranks` now) after a node failed; 0: it runs as planned.
  int planned_ranks = 0;
  std::optional<int64_t> last_checkpoint_step;
  nlohmann::json metrics = nlohmann::json::object();
  int64_t step = -1;
  double steps_per_s = 0;
  int master_port = 0;
  std::string reason;  // why it last failed / stopped ("" when it did not)
  // A failed agent's last log lines (stdout and stderr of the rank that
  // failed, at most kLogTailLines), quoted by the run summary.
  std::vector<std::string> log_tail;
  static constexpr size_t kLogTailLines = 5;
  std::string log_dir;
  // Its latest restore: the step resumed from (-1: a fresh start; unset: not
  // reported), and committed checkpoints it had to pass over as corrupt.
  std::optional<int64_t> restored_step;
  std::vector<int64_t> skipped_checkpoints;
  // Efficiency, once the agent declared its FLOPs per sample: steps_per_s x
  // flops_per_sample against the partition's peak; and the share of rank 0's
  // time spent in collectives over the same window (-1: not known).
  double flops_per_sample = 0;
  double achieved_flops = 0;
  double peak_flops = 0;
  double collective_share = -1;
};

// "agent a reaches 12% of its peak (...); the biggest phase: ..." when it
// declared its FLOPs and is below `threshold` of its peak, else "".
std::string EfficiencyNote(const AgentStatus& agent, double threshold = 0.7);

// A node of the run that failed, and what became of one agent that ran there.
struct NodeFailure {
  std::string node;
  double unix_s = 0;     // when the controller acted on it
  std::string agent;     // an agent that had ranks on it
  std::string moved_to;  // the spare node that took them; "" = none left (requeue)
  bool shrunk = false;   // none left, and the agent went on without the node (restart.elastic)
};

struct RunStatus {
  std::string run;
  RunState state = RunState::kRunning;
  std::vector<AgentStatus> agents;
  std::string run_dir;
  int64_t controller_pid = 0;
  double started_unix_s = 0;
  double updated_unix_s = 0;
  std::vector<NodeFailure> node_failures;  // in the order they happened
  std::string requeue_reason;              // why the run requeues its allocation ("": it does not)
  // The bus as the controller last saw it (BusServer::Snapshot): topics with
  // their offsets, subscribers with their lag. Unset when unknown.
  std::optional<BusSnapshot> bus;

  const AgentStatus* FindAgent(std::string_view name) const;
};

// The run's state as shown: RunStateName, or "controller_gone" for a run
// whose last record says running while its controller is not
// (ControllerRunning, plan/run_dir.h: kill -9, a lost node, power loss).
std::string_view ShownRunState(const RunStatus& status, bool controller_alive);

nlohmann::ordered_json RunStatusToJson(const RunStatus& status);
Result<RunStatus> RunStatusFromJson(const nlohmann::json& json);
Result<RunStatus> ReadRunStatusFile(const std::string& path);
// Atomic: a temporary file renamed over `path`.
Status WriteRunStatusFile(const RunStatus& status, const std::string& path);

// "agent X started fresh: every checkpoint was corrupt (skipped steps 600,
// 400)" or "... resumed from step 400, past corrupt checkpoint 600"; "" when
// nothing was skipped.
std::string RestoreNote(const AgentStatus& agent);

// "agent wide runs 2 of its 4 planned ranks: ..." while a live agent runs
// shrunk (restart.elastic); "" otherwise.
std::string ShrunkNote(const AgentStatus& agent);

// "node n2 failed at 16:40:12 UTC: prey-0 moved to n4" (one per entry).
std::string NodeFailureNote(const NodeFailure& failure);

// What the table and the run summary add under the agents, one line each:
// restores past corrupt checkpoints, agents running shrunk, (with `efficiency`) agents below 70% of
// their peak, node failures, the requeue reason.
std::vector<std::string> RunNotes(const RunStatus& status, bool efficiency);

// The live table: one line per agent (state, restarts, step, steps/s, latest
// metrics), fitted to `width` columns. Ends with a newline.
std::string RenderStatusTable(const RunStatus& status, int width = 120);

}  // namespace agentrt
