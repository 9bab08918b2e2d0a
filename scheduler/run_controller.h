// The run controller: the supervision state machine.
//
// It launches every agent through a LaunchBackend, watches every rank (process
// exit from the backend, heartbeats from telemetry) and, when any rank of an
// agent exits non-zero, is killed or stops heartbeating, tears the whole agent
// group down (SIGTERM + SIGCONT, `grace_s`, SIGKILL) and restarts it with
// AGENTRT_RESTART_COUNT + 1, up to `max_restarts`; then the agent is failed.
// The wait before a restart doubles with each failure in a row: backoff_s,
// 2 backoff_s, 4 backoff_s, ... up to backoff_max_s (BackoffDelay); an
// incarnation that got somewhere before failing (ran backoff_max_s or
// longer, or committed a checkpoint) starts the curve again. A rank that exits with
// kExitConfigError (78, plan/agent_env.h) fails its agent at once: "configuration error", quoting
// the last line of its log. So does a crash loop: `crash_loop_after`
// failures in a row at start-up (before the incarnation reported a step,
// within kStartupWindowS of its launch) with the same exit and the same last
// log line. A failed agent's status keeps its last log lines, which the run
// summary quotes. Other agents are never touched. An agent whose ranks all
// exit 0 has succeeded.
//
// The heartbeat watch of a rank starts with its first telemetry message (hello
// or heartbeat): a program that does not use agentrt::Runtime (e.g. a stock
// PyTorch DDP script) sends none and is supervised by its exit alone.
//
// Time comes from an injected Clock and processes from an injected backend, so
// the logic is tested with fakes and no sleeps. The controller itself never
// blocks: the caller drives it (RunDriver::Step, scheduler/run_driver.h):
//   Start(); loop { OnTelemetry(m)...; Tick(); if (Finished()) break; }
//
// Thread-safety: none; one thread drives it (the thread that must also own the
// spawned children, see launch_backend.h).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/clock.h"
#include "comms/telemetry.h"
#include "plan/config.h"
#include "plan/records.h"
#include "scheduler/launch_backend.h"
#include "scheduler/status.h"

namespace agentrt {

struct SupervisedAgent {
  AgentLaunch launch;  // restart_count is set by the controller
  // max_restarts, backoff_s, heartbeat_timeout_s, grace_s, progress_timeout_s
  RestartPolicy restart;
  GroupPolicy group;      // collective_timeout_s: the hang watch
  double peak_flops = 0;  // the partition's theoretical peak (plan), FLOP/s
};

// What the controller is told before it relaunches a failed agent (RunDriver
// asks its NodeFailover): go ahead (the advisor may have moved the launch's
// ranks to other nodes), or hold: the agent is not relaunched, waits as
// `restarting` with `reason`, and requeue_reason() says why the run must
// requeue its allocation. `failures` are added to the status either way.
struct RelaunchAdvice {
  bool hold = false;
  std::string reason;
  std::vector<NodeFailure> failures;
};
using RelaunchAdvisor = std::function<RelaunchAdvice(AgentLaunch& launch)>;

// The wait before the restart that follows the n-th failure in a row (n >= 1):
// backoff_s x 2^(n-1), at most max(backoff_s, backoff_max_s).
double BackoffDelay(const RestartPolicy& policy, int failures_in_a_row);

class RunController {
 public:
  // `backend` and `clock` must outlive the controller.
  RunController(std::string run_name, std::string run_dir, std::vector<SupervisedAgent> agents,
                LaunchBackend* backend, const Clock* clock);

  // Takes over a run that ended or whose controller died (agentctl resume),
  // before Start: agents that had succeeded stay succeeded and are not
  // launched again; every other one keeps its step, checkpoint and restart
  // history and is launched as its next incarnation (restart count + 1), to
  // resume from its newest checkpoint. That relaunch spends none of
  // max_restarts (AgentStatus::resumes) unless the agent had failed or was
  // waiting to restart after a failure.
  void Resume(const RunStatus& previous);

  // Consulted before every relaunch after a failure (not before the first
  // launch): as the failed incarnation's teardown ends, and again when its
  // backoff has passed if it said nothing then. An agent the advisor moved
  // (or shrank) then relaunches at once: its node failed, not the agent, so
  // no backoff. Unset: relaunch as planned.
  void SetRelaunchAdvisor(RelaunchAdvisor advisor) { advisor_ = std::move(advisor); }

  // Launches every agent. A launch error counts as a failure of that agent.
  // `between`, when given, is called every kLaunchReportIntervalS while the
  // launches go on (thousands of agents take a while): the caller takes the
  // started agents' telemetry and writes the status meanwhile. It must not
  // call Tick().
  static constexpr double kLaunchReportIntervalS = 0.25;
  void Start(const std::function<void()>& between = {});

  // Feeds one telemetry message (heartbeat, hello, metrics, checkpoint, bye).
  // Messages from an earlier incarnation (restart_count) or unknown agents are ignored.
  void OnTelemetry(const TelemetryMessage& message);

  // Reaps exits, checks heartbeat deadlines, escalates SIGTERM to SIGKILL after
  // the grace period and restarts agents whose backoff has passed.
  void Tick();

  // Asks agent `name` for a checkpoint now (SIGUSR2 to its ranks: the runtime
  // saves at its next SaveDue()). FailedPrecondition unless it is running.
  Status RequestCheckpoint(const std::string& name);

  // A planned restart (PBT's exploit): agent `name` is torn down as on a stop
  // (SIGTERM, grace_s, SIGKILL), then `before_relaunch` runs (nothing of the
  // agent runs then) and the agent is relaunched at once as its next
  // incarnation with `reason`. It does not count against max_restarts
  // (AgentStatus::replacements). FailedPrecondition unless it is running.
  Status Replace(const std::string& name, const std::string& reason,
                 std::function<void()> before_relaunch);

  // Asks every agent to stop: SIGTERM (the runtime checkpoints first), then
  // SIGKILL after each agent's grace_s. Agents end `stopped`.
  void RequestStop(const std::string& why);
  bool stop_requested() const { return stop_requested_; }
  // Not empty once an advisor held an agent: the run should requeue.
  const std::string& requeue_reason() const { return status_.requeue_reason; }

  // Every agent is succeeded, failed or stopped (and nothing of it runs).
  bool Finished() const;

  const RunStatus& status() const { return status_; }
  // Bumped on every change of an agent's state, restarts, pids or exit codes
  // (not on checkpoints and restores: status.json shows those within a second).
  uint64_t state_version() const { return state_version_; }
  // Bumped on every change at all (metrics and steps included).
  uint64_t version() const { return version_; }

  // A failure this soon after a launch, before any step, is a start-up failure.
  static constexpr double kStartupWindowS = 60.0;

  // 0 when every agent succeeded, 1 when any failed, 130 when stopped.
  int ExitCode() const;
  // One paragraph: what failed, why and where its log is ("" when all succeeded).
  std::string Summary() const;

 private:
  enum class Phase { kIdle, kRunning, kTearingDown, kBackoff, kDone };

  struct Agent {
    SupervisedAgent spec;
    Phase phase = Phase::kIdle;
    std::map<pid_t, int> live;             // pid -> rank (-1: stands for all ranks)
    std::vector<double> last_heartbeat_s;  // per rank
    std::vector<bool> rank_done;           // rank exited 0 or said bye: no heartbeat expected
    std::vector<bool> armed;               // rank has sent telemetry: its heartbeat is watched
    double kill_at_s = 0;
    bool killed = false;
    double restart_at_s = 0;
    bool give_up = false;           // teardown ends in failed regardless of restarts
    bool stopping = false;          // teardown ends in stopped
    std::function<void()> replace;  // set: a planned restart (Replace), run before relaunch
    bool advised = false;           // this backoff's relaunch was decided by the advisor
    int failed_rank = -1;
    double launched_s = 0;              // when this incarnation was launched
    int64_t checkpoint_at_launch = -1;  // the newest checkpoint step then (-1: none)
    std::vector<int64_t> log_from;      // per rank: its log's size then (this incarnation's start)
    int64_t LogFrom(int rank) const {
      return rank >= 0 && static_cast<size_t>(rank) < log_from.size() ? log_from[rank] : 0;
    }
    int failures_in_a_row = 0;  // the backoff curve's position
    std::string crash;          // the last start-up failure: exit and last log line
    int same_crashes = 0;       // start-up failures in a row that were `crash`
    bool crashed = false;       // this incarnation's failure was a start-up crash
    double rate_t0_s = -1;
    int64_t rate_step0 = -1;
    double rate_busy0_s = 0;  // rank 0's time in collectives at rate_t0_s
    double progress_s = 0;    // when the agent last reported a new step (or metrics)
    double bye_s = -1;        // when a rank last said bye (-1: none has)
    // Per rank, from its latest heartbeat: the collective it is in (or last
    // ran), how long it had been in it then, and when (this clock) we heard.
    struct Collective {
      bool known = false;
      uint64_t seq = 0;
      bool in = false;
      std::string op;
      double in_for_s = 0;
      double heard_s = 0;
      CollectiveSnapshot snapshot;
    };
    std::vector<Collective> collectives;
  };

  void Launch(size_t i);
  // A hang of agent i's group (a desync, or every rank stuck in one
  // collective) or of its training loop: what and where, "" when none.
  std::string FindHang(size_t i, double now, int* culprit) const;
  // "" unless every rank of agent i is done, one at least by saying bye more
  // than heartbeat_timeout_s ago, and a process of it has still not exited
  // (stopped, or wedged on its way out): then why, and *culprit the first
  // rank left.
  std::string FindStuckExit(size_t i, double now, int* culprit) const;
  // RUN_DIR/hangs/<agent>-<time>.json: every rank's recorder; "" on failure.
  std::string DumpHang(size_t i, const std::string& summary) const;
  void OnExit(const AgentProcessExit& exit);
  void BeginTeardown(size_t i, const std::string& reason, int rank);
  // Counts the failure of agent i's incarnation (FinishTeardown, on every
  // failure alike) for the backoff curve; one that was no start-up crash
  // breaks the row of identical ones.
  void CountFailure(size_t i);
  // Agent i's incarnation failed at start-up with `crash` (its exit and last
  // log line): true when that completes a crash loop.
  bool CountCrash(size_t i, const std::string& crash);
  void FinishTeardown(size_t i);
  // Asks the advisor about agent i's relaunch (advisor_ set) and records
  // what it says (node failures, a hold); true when the agent was moved or
  // shrunk, to be relaunched at once.
  bool TakeAdvice(size_t i);
  int FailureRestarts(size_t i) const;
  void SetState(size_t i, AgentState state);
  void UpdateRunState();
  void Touch(bool state_change);
  int FindAgent(const std::string& name) const;
  // Agent i's controller state and reported status, together.
  std::pair<Agent&, AgentStatus&> AgentAt(size_t i) { return {agents_[i], status_.agents[i]}; }

  LaunchBackend* backend_;
  const Clock* clock_;
  RelaunchAdvisor advisor_;
  std::vector<Agent> agents_;
  std::unordered_map<std::string, size_t> index_;  // agent name -> index in agents_
  RunStatus status_;
  bool stop_requested_ = false;
  uint64_t state_version_ = 0;
  uint64_t version_ = 0;
};

}  // namespace agentrt
