#include "scheduler/status_writer.h"

#include <fmt/format.h>
#include <unistd.h>

#include "common/file_util.h"
#include "scheduler/broker_process.h"
#include "scheduler/run_driver.h"

namespace agentrt {

StatusWriter::StatusWriter(std::string path, const RunController* controller,
                           const BrokerProcess* bus, double started_unix_s, const Clock* clock,
                           RunObserver* observer)
    : path_(std::move(path)),
      controller_(controller),
      bus_(bus),
      started_unix_s_(started_unix_s),
      clock_(clock),
      observer_(observer) {}

void StatusWriter::Start() {
  Write();
  t0_ = clock_->NowSeconds();
  written_state_ = controller_->state_version();
  written_any_ = controller_->version();
  written_at_ = t0_;
  ReportChanges();
}

void StatusWriter::Update() {
  const double now = clock_->NowSeconds();
  const bool state_changed = controller_->state_version() != written_state_;
  if (!state_changed && (controller_->version() == written_any_ ||
                         now - written_at_ < MinIntervalS(controller_->status().agents.size()))) {
    return;
  }
  if (state_changed) ReportChanges();
  Write();
  written_state_ = controller_->state_version();
  written_any_ = controller_->version();
  written_at_ = now;
}

void StatusWriter::Finish() {
  ReportChanges();
  Write();
}

double StatusWriter::elapsed_s() const { return clock_->NowSeconds() - t0_; }

void StatusWriter::Write() {
  RunStatus s = controller_->status();
  s.controller_pid = ::getpid();
  s.started_unix_s = started_unix_s_;
  s.updated_unix_s = UnixTimeSeconds();
  if (bus_ != nullptr) {
    if (std::optional<BrokerReport> report = bus_->Report()) s.bus = std::move(report->bus);
  }
  const Status w = WriteRunStatusFile(s, path_);
  if (!w.ok()) observer_->Warn("agentctl run: warning: " + w.message() + "\n");
}

// One line per agent state change, with the reason when there is one.
void StatusWriter::ReportChanges() {
  const RunStatus& now = controller_->status();
  const double t = elapsed_s();
  for (size_t i = 0; i < now.agents.size(); ++i) {
    const AgentStatus& a = now.agents[i];
    const bool is_new = i >= last_shown_.agents.size();
    if (!is_new && last_shown_.agents[i].state == a.state &&
        last_shown_.agents[i].restarts == a.restarts) {
      continue;
    }
    // Not launched yet (the first status comes before the launches): its
    // line is the one that says it runs.
    if (is_new && a.state == AgentState::kPending) continue;
    std::string line = fmt::format("[{:7.1f}s] {} {}", t, a.name, AgentStateName(a.state));
    if (a.state == AgentState::kRunning) {
      line += fmt::format(" (restart {}, pids", a.restarts);
      for (const RankStatus& r : a.ranks) line += fmt::format(" {}", r.pid);
      line += fmt::format(", MASTER_PORT {})", a.master_port);
    } else if (!a.reason.empty() && a.state != AgentState::kSucceeded) {
      line += ": " + a.reason;
    }
    observer_->Event(line);
  }
  last_shown_ = now;
}

}  // namespace agentrt
