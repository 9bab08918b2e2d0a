#include "scheduler/run_controller.h"

#include <fmt/format.h>
#include <signal.h>
#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <limits>
#include <set>

#include "agent_runtime/checkpointer.h"
#include "common/file_util.h"
#include "common/random.h"
#include "plan/agent_env.h"
#include "plan/rank_exec.h"
#include "plan/run_dir.h"
#include "scheduler/process.h"

namespace agentrt {
namespace {

// Errors that will not go away by trying again: the agent fails at once.
bool IsPermanent(const Status& s) {
  return s.code() == StatusCode::kNotFound || s.code() == StatusCode::kInvalidArgument ||
         s.code() == StatusCode::kFailedPrecondition || s.code() == StatusCode::kPermissionDenied;
}

// The size of a rank's log (0: none yet): where its next incarnation's output starts.
int64_t LogSize(const std::string& log_dir, int rank) {
  struct stat st {};
  return ::stat(RankLogFile(log_dir, rank).c_str(), &st) == 0 ? static_cast<int64_t>(st.st_size)
                                                              : 0;
}

// The last non-blank lines a rank's log (its stdout and stderr) got since byte
// `from` (this incarnation's), at most `count`, each cut at 300 bytes, oldest
// first.
std::vector<std::string> LastLogLines(const std::string& log_dir, int rank, size_t count,
                                      int64_t from) {
  std::vector<std::string> lines =
      ReadLastLines(RankLogFile(log_dir, rank), 4 * count, size_t{64} << 10, "", from);
  std::vector<std::string> out;
  for (std::string& line : lines) {
    while (!line.empty() && (line.back() == '\r' || line.back() == ' ')) line.pop_back();
    if (line.empty()) continue;
    if (line.size() > 300) line = line.substr(0, 300) + "...";
    out.push_back(std::move(line));
  }
  if (out.size() > count) out.erase(out.begin(), out.end() - static_cast<ptrdiff_t>(count));
  return out;
}

// The last non-blank line of a rank's log since byte `from` (what it said
// before exiting), or "".
std::string LastLogLine(const std::string& log_dir, int rank, int64_t from) {
  std::vector<std::string> lines = LastLogLines(log_dir, rank, 1, from);
  return lines.empty() ? "" : std::move(lines.back());
}

// An exit the program brought on itself (an error code, a crash signal), as
// opposed to one it was dealt (SIGKILL, SIGTERM from outside) or a temporary
// failure it said it had (kExitTempFail: what it needs is not there yet):
// only those can make a crash loop.
bool SelfInflicted(int exit_code, int term_signal) {
  if (term_signal == 0) return exit_code != 0 && exit_code != kExitTempFail;
  return term_signal == SIGSEGV || term_signal == SIGABRT || term_signal == SIGBUS ||
         term_signal == SIGFPE || term_signal == SIGILL || term_signal == SIGTRAP;
}

// What a report of a rank adds to its agent's row beside its step: the
// newest committed checkpoint and the metrics. Whether it changed anything.
bool TakeReport(AgentStatus& s, const TelemetryMessage& m) {
  bool changed = false;
  if (m.type == TelemetryType::kCheckpoint && m.checkpoint_step >= 0 &&
      (!s.last_checkpoint_step || m.checkpoint_step > *s.last_checkpoint_step)) {
    s.last_checkpoint_step = m.checkpoint_step;
    changed = true;
  }
  if (m.type == TelemetryType::kMetrics && m.metrics.is_object()) {
    for (const auto& [k, v] : m.metrics.items()) s.metrics[k] = v;
    changed = true;
  }
  return changed;
}

// A succeeded agent's newest committed checkpoint, read from its folder: the
// last reports it sent (its final step and commit) may never be heard, as
// telemetry still queued when a process exits goes once its linger ends
// while the controller runs behind. The checkpoint proves the step.
void TakeFinalCheckpoint(const std::string& checkpoint_dir, AgentStatus& s) {
  if (checkpoint_dir.empty()) return;
  const Result<NewestCheckpointInfo> newest = NewestCheckpoint(checkpoint_dir, s.name);
  if (!newest.ok() || newest->step < 0) return;
  const int64_t step = newest->step;
  if (!s.last_checkpoint_step || step > *s.last_checkpoint_step) s.last_checkpoint_step = step;
  if (step > s.step) s.step = step;
}

}  // namespace

double BackoffDelay(const RestartPolicy& policy, int failures_in_a_row) {
  const double cap = std::max(policy.backoff_s, policy.backoff_max_s);
  // 2^(n-1), stopped early once past the cap (no overflow however long the row).
  double delay = policy.backoff_s;
  for (int n = 1; n < failures_in_a_row && delay < cap; ++n) delay *= 2;
  return std::min(delay, cap);
}

RunController::RunController(std::string run_name, std::string run_dir,
                             std::vector<SupervisedAgent> agents, LaunchBackend* backend,
                             const Clock* clock)
    : backend_(backend), clock_(clock) {
  status_.run = std::move(run_name);
  status_.run_dir = std::move(run_dir);
  for (auto& spec : agents) {
    AgentStatus s;
    s.peak_flops = spec.peak_flops;
    s.name = spec.launch.name;
    s.log_dir = spec.launch.log_dir;
    s.master_port = spec.launch.master_port;
    for (const auto& r : spec.launch.ranks)
      s.ranks.push_back({r.rank, 0, r.node, std::nullopt, std::nullopt});
    index_.emplace(s.name, status_.agents.size());
    status_.agents.push_back(std::move(s));
    Agent a;
    a.spec = std::move(spec);
    agents_.push_back(std::move(a));
  }
}

void RunController::Resume(const RunStatus& previous) {
  for (size_t i = 0; i < agents_.size(); ++i) {
    const AgentStatus* before = previous.FindAgent(status_.agents[i].name);
    if (before == nullptr) continue;
    AgentStatus& s = status_.agents[i];
    s.step = before->step;
    s.last_checkpoint_step = before->last_checkpoint_step;
    s.metrics = before->metrics;
    s.restored_step = before->restored_step;
    s.skipped_checkpoints = before->skipped_checkpoints;
    s.replacements = before->replacements;
    s.resumes = before->resumes;
    if (before->state == AgentState::kSucceeded) {
      agents_[i].phase = Phase::kDone;
      s.restarts = before->restarts;
      s.ranks = before->ranks;
      s.state = AgentState::kSucceeded;
    } else {
      s.restarts = before->restarts + 1;  // a new incarnation, from its checkpoint
      // Stopped (agentctl stop, the dashboard) or cut off with its controller:
      // it did not fail, so the relaunch is not one of its restarts.
      const bool failed =
          before->state == AgentState::kFailed || before->state == AgentState::kRestarting;
      s.resumes = before->resumes + (failed ? 0 : 1);
      s.reason = "resumed after its controller ended";
    }
  }
  Touch(true);
}

void RunController::Start(const std::function<void()>& between) {
  double reported_at = clock_->NowSeconds();
  backend_->BeginBatch();
  for (size_t i = 0; i < agents_.size(); ++i) {
    if (agents_[i].phase == Phase::kIdle) Launch(i);
    if (between && clock_->NowSeconds() - reported_at >= kLaunchReportIntervalS) {
      UpdateRunState();
      between();
      reported_at = clock_->NowSeconds();
    }
  }
  backend_->EndBatch();
  UpdateRunState();
}

int RunController::FindAgent(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? -1 : static_cast<int>(it->second);
}

void RunController::Touch(bool state_change) {
  ++version_;
  if (state_change) ++state_version_;
}

void RunController::SetState(size_t i, AgentState state) {
  if (status_.agents[i].state != state) {
    status_.agents[i].state = state;
    Touch(true);
  }
}

void RunController::Launch(size_t i) {
  Agent& a = agents_[i];
  AgentStatus& s = status_.agents[i];
  a.spec.launch.restart_count = s.restarts;
  // Unique per launch, also across controllers of one run (a requeue or a
  // resume starts counting restarts again): the checkpoint fence's id.
  a.spec.launch.incarnation = fmt::format("{}.{}", s.restarts, RandomHex64());
  a.launched_s = clock_->NowSeconds();
  a.crashed = false;
  a.advised = false;
  a.checkpoint_at_launch = s.last_checkpoint_step.value_or(-1);
  a.log_from.resize(a.spec.launch.ranks.size());
  for (size_t r = 0; r < a.log_from.size(); ++r)
    a.log_from[r] = LogSize(s.log_dir, a.spec.launch.ranks[r].rank);
  auto launched = backend_->Launch(a.spec.launch);
  const double now = clock_->NowSeconds();
  if (!launched.ok()) {
    s.reason = "launch failed: " + launched.status().message();
    a.give_up = IsPermanent(launched.status());
    a.live.clear();
    a.failed_rank = -1;
    FinishTeardown(i);
    return;
  }
  a.phase = Phase::kRunning;
  a.live.clear();
  std::map<pid_t, int> count;
  for (const auto& r : launched->ranks) ++count[r.pid];
  for (const auto& r : launched->ranks) a.live[r.pid] = count[r.pid] > 1 ? -1 : r.rank;
  const size_t n = a.spec.launch.ranks.size();
  a.last_heartbeat_s.assign(n, now);
  a.rank_done.assign(n, false);
  a.armed.assign(n, false);
  a.killed = false;
  a.give_up = false;
  a.failed_rank = -1;
  a.rate_t0_s = -1;
  a.progress_s = now;
  a.bye_s = -1;
  a.collectives.assign(n, {});
  s.ranks.clear();
  for (const auto& r : launched->ranks)
    s.ranks.push_back({r.rank, r.pid, r.node, std::nullopt, std::nullopt});
  s.master_port = launched->master_port;
  s.planned_ranks = a.spec.launch.planned_ranks;
  s.steps_per_s = 0;
  SetState(i, AgentState::kRunning);
  Touch(true);
}

void RunController::OnTelemetry(const TelemetryMessage& m) {
  const int idx = FindAgent(m.agent);
  if (idx < 0) return;
  const size_t i = static_cast<size_t>(idx);
  auto [a, s] = AgentAt(i);
  if (m.restart_count != s.restarts) return;
  if (a.phase == Phase::kTearingDown || a.phase == Phase::kBackoff || a.phase == Phase::kDone) {
    // What this incarnation said before it stopped, heard only after its
    // exit (the intake runs behind under load) or during its teardown: its
    // newest committed checkpoint, the step it reached and its last metrics
    // count (a succeeded agent shows its last step); nothing of its liveness.
    bool changed = TakeReport(s, m);
    // Its first step heard replaces the last incarnation's (it may have
    // resumed lower), as while it runs; later ones only raise it.
    if (m.step >= 0 && (a.rate_t0_s < 0 || m.step > s.step)) {
      if (a.rate_t0_s < 0) a.rate_t0_s = clock_->NowSeconds();
      s.step = m.step;
      changed = true;
    }
    if (changed) Touch(false);
    return;
  }
  if (a.phase != Phase::kRunning) return;
  if (m.rank < 0 || static_cast<size_t>(m.rank) >= a.last_heartbeat_s.size()) return;
  const double now = clock_->NowSeconds();
  a.last_heartbeat_s[static_cast<size_t>(m.rank)] = now;
  a.armed[static_cast<size_t>(m.rank)] = true;
  for (auto& r : s.ranks) {
    if (r.rank != m.rank) continue;
    if (m.pid > 0 && r.pid != m.pid) {
      r.pid = m.pid;  // an mpirun or srun rank tells its own pid
      Touch(true);
    }
    // When the controller heard it, by its own clock (the dashboard's heartbeat age is
    // measured against it): the rank's `time` is its node's clock, which may be off or stepped.
    r.heard_unix_s = UnixTimeSeconds();
  }
  if (m.type == TelemetryType::kHeartbeat && m.collective) {
    auto& c = a.collectives[static_cast<size_t>(m.rank)];
    c.known = true;
    c.seq = m.collective->seq;
    c.in = m.collective->in;
    c.op = m.collective->op;
    // Without its start (0) the collective counts from this heartbeat.
    const double since = m.collective->since > 0 ? m.collective->since : m.time;
    // The rank's own steady measure; from its wall clock only for a sender
    // that does not send it (a clock step would count in that difference).
    c.in_for_s = !c.in                           ? 0.0
                 : m.collective->in_for_s >= 0.0 ? m.collective->in_for_s
                                                 : std::max(0.0, m.time - since);
    c.heard_s = now;
    c.snapshot = *m.collective;
  }
  if (m.type == TelemetryType::kMetrics || (m.step >= 0 && m.step > s.step)) a.progress_s = now;
  if (m.flops_per_sample > 0) s.flops_per_sample = m.flops_per_sample;
  if (m.step >= 0) {
    const auto& rank0 = a.collectives.front();
    const double busy = rank0.known ? rank0.snapshot.busy_s : -1.0;
    if (a.rate_t0_s < 0) {
      s.step = m.step;  // first step of this incarnation (it may have resumed lower)
      a.rate_t0_s = now;
      a.rate_step0 = m.step;
      a.rate_busy0_s = busy;
    } else if (m.step > s.step) {
      s.step = m.step;
      if (now - a.rate_t0_s >= 2.0) {
        s.steps_per_s = static_cast<double>(s.step - a.rate_step0) / (now - a.rate_t0_s);
        s.achieved_flops = s.steps_per_s * s.flops_per_sample;
        s.collective_share =
            busy >= 0 && a.rate_busy0_s >= 0
                ? std::clamp((busy - a.rate_busy0_s) / (now - a.rate_t0_s), 0.0, 1.0)
                : -1.0;
        a.rate_t0_s = now;
        a.rate_step0 = s.step;
        a.rate_busy0_s = busy;
      }
    }
    Touch(false);
  }
  if (TakeReport(s, m)) Touch(false);
  if (m.type == TelemetryType::kRestore) {
    s.restored_step = m.checkpoint_step;
    s.skipped_checkpoints = m.skipped_steps;
    Touch(false);
  }
  if (m.type == TelemetryType::kBye) {
    // A rank leaving cleanly sends no more heartbeats; its exit (or mpirun's) decides the rest.
    a.rank_done[static_cast<size_t>(m.rank)] = true;
    a.bye_s = now;
  }
}

void RunController::OnExit(const AgentProcessExit& e) {
  const int idx = FindAgent(e.agent);
  if (idx < 0) return;
  const size_t i = static_cast<size_t>(idx);
  auto [a, s] = AgentAt(i);
  auto it = a.live.find(e.pid);
  if (it == a.live.end()) return;
  const int rank = it->second;
  a.live.erase(it);
  const int code = e.term_signal != 0 ? -e.term_signal : e.exit_code;
  for (auto& r : s.ranks) {
    if ((rank < 0 || r.rank == rank) && !r.exit_code) r.exit_code = code;
  }
  Touch(true);
  if (a.phase == Phase::kRunning) {
    if (e.success()) {
      for (size_t r = 0; r < a.rank_done.size(); ++r) {
        if (rank < 0 || static_cast<int>(r) == rank) a.rank_done[r] = true;
      }
      if (a.live.empty()) {
        a.phase = Phase::kDone;
        s.reason.clear();
        TakeFinalCheckpoint(a.spec.launch.checkpoint_dir, s);
        SetState(i, AgentState::kSucceeded);
      }
      return;
    }
    std::string who = rank < 0 ? fmt::format("mpirun (pid {})", e.pid)
                               : fmt::format("rank {} (pid {})", rank, e.pid);
    std::string how = e.Describe();
    int culprit = rank;
    int exit_code = e.exit_code, term_signal = e.term_signal;  // the culprit's
    if (rank < 0) {
      // One launcher stood for every rank: the rank wrappers' records say
      // which rank failed first, and how (plan/rank_exec.h).
      const std::vector<RankExit> exits = ReadRankExits(s.log_dir, s.restarts);
      const RankExit* first = nullptr;
      for (const RankExit& r : exits) {
        for (auto& st : s.ranks) {
          if (st.rank == r.rank) {
            st.pid = r.pid;
            st.exit_code = r.signal != 0 ? -r.signal : r.exit_code;
          }
        }
        const bool failed = r.signal != 0 || r.exit_code != 0;
        if (failed && (first == nullptr || r.time < first->time)) first = &r;
      }
      if (first != nullptr) {
        how = DescribeExit(first->exit_code, first->signal) + "; " + who + " " + how;
        who = fmt::format("rank {} (pid {})", first->rank, first->pid);
        culprit = first->rank;
        exit_code = first->exit_code;
        term_signal = first->signal;
      }
    }
    const int quoted = culprit < 0 ? 0 : culprit;  // the rank whose log is quoted
    const std::string said = LastLogLine(s.log_dir, quoted, a.LogFrom(quoted));
    if (term_signal == 0 && exit_code == kExitConfigError) {
      // The agent refused its own configuration: trying again cannot help.
      a.give_up = true;
      BeginTeardown(i, "configuration error: " + (said.empty() ? who + " " + how : said), culprit);
      return;
    }
    // At start-up (no step yet, soon after the launch) and of its own doing:
    // the same exit with the same last words again is a crash loop, whichever
    // rank happened to fail first (under mpirun that varies from one try to
    // the next).
    const bool startup = a.rate_t0_s < 0 && clock_->NowSeconds() - a.launched_s < kStartupWindowS;
    const std::string exited = DescribeExit(exit_code, term_signal);
    if (startup && SelfInflicted(exit_code, term_signal) && CountCrash(i, exited + "\n" + said)) {
      a.give_up = true;
      BeginTeardown(i,
                    fmt::format("crash loop: failed at start-up {} times in a row the same way "
                                "(rank {} {}){}",
                                a.same_crashes, quoted, exited, said.empty() ? "" : ": " + said),
                    culprit);
      return;
    }
    BeginTeardown(i, who + " " + how, culprit);
    return;
  }
  if (a.phase == Phase::kTearingDown && a.live.empty()) FinishTeardown(i);
}

void RunController::BeginTeardown(size_t i, const std::string& reason, int rank) {
  Agent& a = agents_[i];
  AgentStatus& s = status_.agents[i];
  s.reason = reason;
  a.failed_rank = rank;
  a.phase = Phase::kTearingDown;
  a.killed = false;
  a.kill_at_s = clock_->NowSeconds() + a.spec.restart.grace_s;
  if (!a.live.empty()) {
    // Best effort: a rank that is gone already has nothing left to stop.
    backend_->Signal(s.name, SIGTERM).IgnoreError();
    backend_->Signal(s.name, SIGCONT).IgnoreError();  // a stopped rank must run to see SIGTERM
  }
  const bool will_restart =
      a.replace || (!a.stopping && !a.give_up && FailureRestarts(i) < a.spec.restart.max_restarts);
  if (will_restart) SetState(i, AgentState::kRestarting);
  Touch(true);
  if (a.live.empty()) FinishTeardown(i);
}

void RunController::FinishTeardown(size_t i) {
  Agent& a = agents_[i];
  if (a.stopping) {
    a.phase = Phase::kDone;
    a.replace = nullptr;
    SetState(i, AgentState::kStopped);
  } else if (a.replace) {
    a.phase = Phase::kBackoff;  // no backoff: a planned restart
    a.restart_at_s = clock_->NowSeconds();
    SetState(i, AgentState::kRestarting);
  } else {
    CountFailure(i);
    if (a.give_up || FailureRestarts(i) >= a.spec.restart.max_restarts) {
      a.phase = Phase::kDone;
      AgentStatus& s = status_.agents[i];
      s.log_tail.clear();
      if (a.failed_rank >= 0) {
        s.log_tail = LastLogLines(s.log_dir, a.failed_rank, AgentStatus::kLogTailLines,
                                  a.LogFrom(a.failed_rank));
      }
      SetState(i, AgentState::kFailed);
    } else {
      a.phase = Phase::kBackoff;
      a.restart_at_s = clock_->NowSeconds() + BackoffDelay(a.spec.restart, a.failures_in_a_row);
      SetState(i, AgentState::kRestarting);
      if (advisor_ && TakeAdvice(i)) a.restart_at_s = clock_->NowSeconds();
    }
  }
  Touch(true);
}

bool RunController::TakeAdvice(size_t i) {
  Agent& a = agents_[i];
  AgentStatus& s = status_.agents[i];
  RelaunchAdvice advice = advisor_(a.spec.launch);
  for (NodeFailure& f : advice.failures) status_.node_failures.push_back(std::move(f));
  a.advised = a.advised || advice.hold || !advice.failures.empty();
  if (advice.hold) {
    // Not relaunched: it waits for the requeued allocation.
    a.restart_at_s = std::numeric_limits<double>::infinity();
    s.reason = advice.reason;
    status_.requeue_reason = advice.reason;
  }
  if (advice.hold || !advice.failures.empty()) Touch(true);
  return !advice.hold && !advice.failures.empty();
}

void RunController::Tick() {
  for (const auto& e : backend_->PollExits()) OnExit(e);
  const double now = clock_->NowSeconds();
  for (size_t i = 0; i < agents_.size(); ++i) {
    Agent& a = agents_[i];
    AgentStatus& s = status_.agents[i];
    switch (a.phase) {
      case Phase::kRunning: {
        int culprit = -1;
        if (const std::string hang = FindHang(i, now, &culprit); !hang.empty()) {
          const std::string dump = DumpHang(i, hang);
          BeginTeardown(i, dump.empty() ? hang : hang + " (hang report: " + dump + ")", culprit);
          break;
        }
        const double timeout = a.spec.restart.heartbeat_timeout_s;
        if (const std::string stuck = FindStuckExit(i, now, &culprit); !stuck.empty()) {
          BeginTeardown(i, stuck, culprit);
          break;
        }
        for (size_t r = 0; r < a.last_heartbeat_s.size(); ++r) {
          if (timeout > 0 && a.armed[r] && !a.rank_done[r] &&
              now - a.last_heartbeat_s[r] > timeout) {
            BeginTeardown(
                i,
                fmt::format("rank {} sent no heartbeat for {:.1f} s (heartbeat_timeout_s {})", r,
                            now - a.last_heartbeat_s[r], timeout),
                static_cast<int>(r));
            break;
          }
        }
        break;
      }
      case Phase::kTearingDown:
        if (!a.killed && now >= a.kill_at_s) {
          backend_->Signal(s.name, SIGKILL).IgnoreError();
          a.killed = true;
        }
        break;
      case Phase::kBackoff:
        if (now >= a.restart_at_s) {
          if (advisor_ && !a.advised) {
            TakeAdvice(i);
            if (a.phase != Phase::kBackoff || now < a.restart_at_s) break;  // held
          }
          if (a.replace) {
            std::function<void()> replace = std::move(a.replace);
            a.replace = nullptr;
            replace();
            ++s.replacements;
          }
          ++s.restarts;
          Launch(i);
        }
        break;
      case Phase::kIdle:
      case Phase::kDone:
        break;
    }
  }
  UpdateRunState();
}

std::string RunController::FindStuckExit(size_t i, double now, int* culprit) const {
  const Agent& a = agents_[i];
  const double timeout = a.spec.restart.heartbeat_timeout_s;
  if (!(timeout > 0) || a.bye_s < 0 || now - a.bye_s <= timeout || a.live.empty()) return "";
  if (!std::all_of(a.rank_done.begin(), a.rank_done.end(), [](bool b) { return b; })) return "";
  // Every rank is done, one at least by saying bye, yet processes remain: which ranks?
  const AgentStatus& s = status_.agents[i];
  std::vector<int> left;
  bool launcher = false;  // one process (mpirun) stands for every rank
  for (const auto& [pid, rank] : a.live) {
    if (rank >= 0) left.push_back(rank);
    launcher = launcher || rank < 0;
  }
  if (launcher) {
    // The rank wrappers' exit records say which ranks have left.
    std::set<int> exited;
    for (const RankExit& r : ReadRankExits(s.log_dir, s.restarts)) exited.insert(r.rank);
    for (const auto& r : s.ranks) {
      if (exited.count(r.rank) == 0) left.push_back(r.rank);
    }
  }
  std::sort(left.begin(), left.end());
  left.erase(std::unique(left.begin(), left.end()), left.end());
  *culprit = left.empty() ? -1 : left.front();
  std::string which;
  for (int r : left) which += (which.empty() ? "" : ",") + std::to_string(r);
  const std::string who = left.empty() ? "its processes have"
                                       : fmt::format("rank{} {} {}", left.size() == 1 ? "" : "s",
                                                     which, left.size() == 1 ? "has" : "have");
  return fmt::format(
      "every rank is done (the last bye {:.1f} s ago), but {} not exited "
      "(heartbeat_timeout_s {})",
      now - a.bye_s, who, timeout);
}

std::string RunController::FindHang(size_t i, double now, int* culprit) const {
  const Agent& a = agents_[i];
  const double progress_timeout = a.spec.restart.progress_timeout_s;
  const bool armed = std::any_of(a.armed.begin(), a.armed.end(), [](bool b) { return b; });
  if (progress_timeout > 0 && armed && now - a.progress_s > progress_timeout) {
    *culprit = -1;
    return fmt::format("no new step reported for {:.1f} s (progress_timeout_s {})",
                       now - a.progress_s, progress_timeout);
  }
  const double timeout = a.spec.group.collective_timeout_s;
  const size_t n = a.collectives.size();
  if (timeout <= 0 || n < 2) return "";
  // The rank that has waited longest in a collective, if longer than the timeout.
  int w = -1;
  double longest = 0;
  for (size_t r = 0; r < n; ++r) {
    const auto& c = a.collectives[r];
    if (!c.known || !c.in) continue;
    const double waited = c.in_for_s + (now - c.heard_s);
    if (waited > timeout && waited > longest) {
      w = static_cast<int>(r);
      longest = waited;
    }
  }
  if (w < 0) return "";
  const auto& stuck = a.collectives[static_cast<size_t>(w)];
  std::vector<int> lagging, inside;
  std::set<std::string> ops;
  for (size_t r = 0; r < n; ++r) {
    const auto& c = a.collectives[r];
    if (!c.known || c.seq < stuck.seq) {
      lagging.push_back(static_cast<int>(r));
    } else if (c.in && c.seq == stuck.seq) {
      inside.push_back(static_cast<int>(r));
      ops.insert(c.op);
    }
  }
  auto list = [](const std::vector<int>& ranks) {
    std::string out;
    for (int r : ranks) out += (out.empty() ? "" : ",") + std::to_string(r);
    return out;
  };
  if (!lagging.empty()) {
    *culprit = lagging.front();
    return fmt::format("rank{} {} never entered {} #{} that rank{} {} entered {:.0f} s ago",
                       lagging.size() == 1 ? "" : "s", list(lagging), stuck.op, stuck.seq,
                       inside.size() == 1 ? "" : "s", list(inside), longest);
  }
  if (inside.size() == n) {
    *culprit = w;
    std::string what = stuck.op;
    if (ops.size() > 1) {
      what = "collective";
      std::string which;
      for (size_t r = 0; r < n; ++r)
        which += fmt::format("{}rank {}: {}", which.empty() ? "" : ", ", r, a.collectives[r].op);
      return fmt::format("every rank is stuck in {} #{} for {:.0f} s, but not the same one ({})",
                         what, stuck.seq, longest, which);
    }
    return fmt::format("every rank is stuck in {} #{} for {:.0f} s", what, stuck.seq, longest);
  }
  // Some rank is past it: the ranks' sequences disagree (one skipped or added
  // a collective, and MPI paired the wrong ones).
  std::string ahead;
  for (size_t r = 0; r < n; ++r) {
    const auto& c = a.collectives[r];
    if (c.seq <= stuck.seq) continue;
    ahead += fmt::format("{}rank {} at #{} ({})", ahead.empty() ? "" : ", ", r, c.seq,
                         c.in ? "in " + c.op : "past " + c.op);
  }
  *culprit = w;
  return fmt::format(
      "rank{} {} waited {:.0f} s in {} #{} while {}: the ranks' collective sequences disagree (a "
      "skipped or extra collective)",
      inside.size() == 1 ? "" : "s", list(inside), longest, stuck.op, stuck.seq, ahead);
}

std::string RunController::DumpHang(size_t i, const std::string& summary) const {
  const Agent& a = agents_[i];
  const AgentStatus& s = status_.agents[i];
  HangReport dump;
  dump.agent = s.name;
  dump.restart = s.restarts;
  dump.detected_unix_s = UnixTimeSeconds();
  dump.summary = summary;
  for (size_t r = 0; r < a.collectives.size(); ++r) {
    HangReport::Rank rank;
    rank.rank = static_cast<int>(r);
    if (a.collectives[r].known) rank.collective = a.collectives[r].snapshot;
    for (const RankStatus& rs : s.ranks) {
      if (rs.rank == rank.rank) {
        rank.node = rs.node;
        rank.pid = rs.pid;
      }
    }
    dump.ranks.push_back(std::move(rank));
  }
  const RunDir run(status_.run_dir);
  std::error_code ec;
  std::filesystem::create_directories(run.HangsDir(), ec);
  const std::string path = run.HangReportPath(s.name, std::chrono::system_clock::now());
  if (!WriteFileAtomic(path, dump.ToJson().dump(1) + "\n").ok()) return "";
  return path;
}

int RunController::FailureRestarts(size_t i) const {
  const AgentStatus& s = status_.agents[i];
  return s.restarts - s.replacements - s.resumes;
}

void RunController::CountFailure(size_t i) {
  Agent& a = agents_[i];
  const RestartPolicy& policy = a.spec.restart;
  // An incarnation that got somewhere (lasted a full backoff_max_s, or
  // committed a checkpoint) starts the curve again.
  const int64_t checkpoint = status_.agents[i].last_checkpoint_step.value_or(-1);
  if (clock_->NowSeconds() - a.launched_s >= std::max(policy.backoff_s, policy.backoff_max_s) ||
      checkpoint > a.checkpoint_at_launch)
    a.failures_in_a_row = 0;
  ++a.failures_in_a_row;
  // Any other failure breaks a row of identical start-up crashes.
  if (!a.crashed) {
    a.crash.clear();
    a.same_crashes = 0;
  }
}

bool RunController::CountCrash(size_t i, const std::string& crash) {
  Agent& a = agents_[i];
  a.crashed = true;
  a.same_crashes = crash == a.crash ? a.same_crashes + 1 : 1;
  a.crash = crash;
  return a.spec.restart.crash_loop_after > 0 && a.same_crashes >= a.spec.restart.crash_loop_after;
}

Status RunController::RequestCheckpoint(const std::string& name) {
  const int i = FindAgent(name);
  if (i < 0) return NotFound("no agent " + name);
  if (agents_[static_cast<size_t>(i)].phase != Phase::kRunning)
    return FailedPrecondition("agent " + name + " is not running");
  return backend_->Signal(name, SIGUSR2);
}

Status RunController::Replace(const std::string& name, const std::string& reason,
                              std::function<void()> before_relaunch) {
  const int found = FindAgent(name);
  if (found < 0) return NotFound("no agent " + name);
  const auto i = static_cast<size_t>(found);
  Agent& a = agents_[i];
  if (a.phase != Phase::kRunning || stop_requested_)
    return FailedPrecondition("agent " + name + " is not running");
  a.replace = std::move(before_relaunch);
  BeginTeardown(i, reason, -1);
  UpdateRunState();
  return Status::Ok();
}

void RunController::RequestStop(const std::string& why) {
  stop_requested_ = true;
  for (size_t i = 0; i < agents_.size(); ++i) {
    Agent& a = agents_[i];
    switch (a.phase) {
      case Phase::kRunning:
        a.stopping = true;
        BeginTeardown(i, "stopped: " + why, -1);
        break;
      case Phase::kTearingDown:
        a.stopping = true;
        break;
      case Phase::kBackoff:
      case Phase::kIdle:
        a.stopping = true;
        a.phase = Phase::kDone;
        status_.agents[i].reason = "stopped: " + why;
        SetState(i, AgentState::kStopped);
        break;
      case Phase::kDone:
        break;
    }
  }
  UpdateRunState();
}

bool RunController::Finished() const {
  return std::all_of(agents_.begin(), agents_.end(),
                     [](const Agent& a) { return a.phase == Phase::kDone; });
}

void RunController::UpdateRunState() {
  RunState state = RunState::kRunning;
  if (Finished()) {
    state = RunState::kSucceeded;
    for (const auto& s : status_.agents) {
      if (s.state == AgentState::kStopped && state == RunState::kSucceeded)
        state = RunState::kStopped;
      if (s.state == AgentState::kFailed) state = RunState::kFailed;
    }
  }
  if (state != status_.state) {
    status_.state = state;
    Touch(true);
  }
}

int RunController::ExitCode() const {
  switch (status_.state) {
    case RunState::kSucceeded:
      return 0;
    case RunState::kStopped:
      return 130;
    default:
      return 1;
  }
}

std::string RunController::Summary() const {
  std::string notes;
  for (const std::string& note : RunNotes(status_, /*efficiency=*/false)) notes += note + "\n";
  if (status_.state == RunState::kSucceeded) return notes;
  std::string out;
  int failed = 0, stopped = 0;
  for (size_t i = 0; i < agents_.size(); ++i) {
    const AgentStatus& s = status_.agents[i];
    if (s.state == AgentState::kFailed) {
      ++failed;
      const int rank = agents_[i].failed_rank;
      const std::string log = rank >= 0 ? RankLogFile(s.log_dir, rank) : s.log_dir + "/";
      out += fmt::format("agent {} failed after {} restart{}: {}; see its log: {}\n", s.name,
                         s.restarts, s.restarts == 1 ? "" : "s", s.reason, log);
      if (!s.log_tail.empty()) {
        out += fmt::format("  the last lines of rank{}.log:\n", rank);
        for (const std::string& line : s.log_tail) out += "    " + line + "\n";
      }
    } else if (s.state == AgentState::kStopped) {
      ++stopped;
    }
  }
  if (status_.state == RunState::kRunning) return "run " + status_.run + " is still running\n";
  std::string head = failed > 0
                         ? fmt::format("run {} failed: {} of {} agents failed", status_.run, failed,
                                       agents_.size())
                         : fmt::format("run {} stopped: {} of {} agents stopped before finishing",
                                       status_.run, stopped, agents_.size());
  return head + " (run dir " + status_.run_dir + ").\n" + out + notes;
}

}  // namespace agentrt
