#include "scheduler/broker_process.h"

#include <fmt/format.h>
#include <signal.h>
#include <string.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <thread>
#include <utility>

#include "common/file_util.h"
#include "comms/bus_server.h"
#include "plan/agent_env.h"

namespace agentrt {
namespace {

constexpr std::chrono::milliseconds kFirstRetry{250};
constexpr std::chrono::milliseconds kLongestRetry{4000};

// The size of `path` now (0 when it does not exist): where a new broker's lines start.
uintmax_t SizeOf(const std::string& path) {
  std::error_code ec;
  const uintmax_t size = std::filesystem::file_size(path, ec);
  return ec ? 0 : size;
}

}  // namespace

BrokerProcess::BrokerProcess(RunDir dir, BrokerProcessOptions options)
    : dir_(std::move(dir)), options_(std::move(options)), spawner_(options_.make_spawner()) {}

BrokerProcess::~BrokerProcess() = default;  // the spawner kills what still runs

Result<std::unique_ptr<BrokerProcess>> BrokerProcess::Start(const RunDir& dir,
                                                            const BrokerProcessOptions& options) {
  std::unique_ptr<BrokerProcess> broker(new BrokerProcess(dir, options));
  AGENTRT_RETURN_IF_ERROR(broker->Spawn());
  for (;;) {
    AGENTRT_ASSIGN_OR_RETURN(const bool ready, broker->Ready());
    if (ready) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  if (std::optional<BrokerReport> report = broker->Report()) {
    broker->notes_ = std::move(report->recovery_notes);
  }
  return broker;
}

Status BrokerProcess::Spawn() {
  std::error_code ec;
  std::filesystem::create_directories(dir_.LogsDir(), ec);
  if (ec) return Internal("cannot create " + dir_.LogsDir() + ": " + ec.message());
  // An address file left by a broker that was killed would pass for this one's.
  ::unlink(dir_.BusAddressPath().c_str());
  SpawnRequest request;
  request.argv = {options_.program,
                  "--plan",
                  dir_.PlanPath(),
                  "--secret-file",
                  dir_.SecretPath(),
                  "--host",
                  options_.listen_host,
                  "--port",
                  std::to_string(options_.port),
                  "--advertise-host",
                  options_.advertised_host,
                  "--address-file",
                  dir_.BusAddressPath(),
                  "--report-file",
                  dir_.BusReportPath()};
  // Named a process of the run, as its agents are: whoever looks for what a
  // run left behind finds its broker too.
  request.env = ComposeEnvironment(CurrentEnviron(), {}, {{kEnvRunDir, dir_.path()}});
  request.log_path = dir_.BusProcessLogPath();
  log_from_ = SizeOf(request.log_path);
  Result<pid_t> pid = spawner_->Spawn(request);
  if (!pid.ok()) return pid.status().WithContext("cannot start the bus broker");
  pid_ = *pid;
  starting_ = true;
  spawned_at_ = options_.clock->Now();
  return Status::Ok();
}

Result<bool> BrokerProcess::Ready() {
  for (const ProcessExit& e : spawner_->ReapExited()) {
    if (e.pid != pid_) continue;
    pid_ = 0;
    starting_ = false;
    if (e.term_signal == 0 && e.exit_code == kBrokerExitCannotListen) {
      return AlreadyExists(fmt::format("the bus broker cannot listen on {}:{} (port taken?)",
                                       options_.listen_host, options_.port));
    }
    return Unavailable(fmt::format("the bus broker {} before it served: {} (its log: {})", Ended(e),
                                   LastLogLine(), dir_.BusProcessLogPath()));
  }
  auto address = ReadWholeFile(dir_.BusAddressPath(), 4096);
  if (address.ok()) {
    const std::optional<BrokerReport> report = Report();
    if (report && report->pid == pid_) {
      starting_ = false;
      return true;
    }
  }
  if (options_.clock->Now() - spawned_at_ < options_.ready_timeout) return false;
  spawner_->SignalGroup(pid_, SIGKILL).IgnoreError();
  pid_ = 0;
  starting_ = false;
  return DeadlineExceeded(fmt::format(
      "the bus broker did not serve within {:.0f} s of its start, and was killed (its log: {})",
      std::chrono::duration<double>(options_.ready_timeout).count(), dir_.BusProcessLogPath()));
}

std::vector<std::string> BrokerProcess::Supervise() {
  std::vector<std::string> lines;
  if (stopped_) return lines;
  if (pid_ != 0 && !starting_) {
    for (const ProcessExit& e : spawner_->ReapExited()) {
      if (e.pid != pid_) continue;
      lines.push_back(fmt::format("the bus broker (pid {}) {}; starting it again on port {}", pid_,
                                  Ended(e), options_.port));
      pid_ = 0;
      died_at_ = options_.clock->Now();
      retry_at_ = died_at_;
      retry_delay_ = kFirstRetry;
    }
  }
  if (pid_ == 0 && options_.clock->Now() >= retry_at_) {
    if (Status s = Spawn(); !s.ok()) Retry(s, &lines);
  }
  if (!starting_) return lines;
  Result<bool> ready = Ready();
  if (!ready.ok()) {
    Retry(ready.status(), &lines);
  } else if (*ready) {
    ++restarts_;
    lines.push_back(fmt::format(
        "the bus broker serves again on port {} (pid {}, restart {}, {:.2f} s after it died)",
        options_.port, pid_, restarts_,
        std::chrono::duration<double>(options_.clock->Now() - died_at_).count()));
    retry_delay_ = kFirstRetry;
  }
  return lines;
}

void BrokerProcess::Retry(const Status& why, std::vector<std::string>* lines) {
  lines->push_back(fmt::format("{}; trying again in {:.2f} s", why.message(),
                               std::chrono::duration<double>(retry_delay_).count()));
  retry_at_ = options_.clock->Now() + retry_delay_;
  retry_delay_ = std::min(retry_delay_ * 2, kLongestRetry);
}

std::optional<BrokerReport> BrokerProcess::Report() const {
  // The broker renames a new file over the old one: a new inode, a new mtime.
  struct stat st {};
  if (::stat(dir_.BusReportPath().c_str(), &st) != 0) return std::nullopt;
  const std::pair<ino_t, timespec> file{st.st_ino, st.st_mtim};
  const bool same = report_ && file.first == report_file_.first &&
                    file.second.tv_sec == report_file_.second.tv_sec &&
                    file.second.tv_nsec == report_file_.second.tv_nsec;
  if (!same) {
    report_.reset();
    auto text = ReadWholeFile(dir_.BusReportPath(), size_t{64} << 20);
    if (!text.ok()) return std::nullopt;
    const nlohmann::json j = nlohmann::json::parse(*text, nullptr, /*allow_exceptions=*/false);
    auto report = BrokerReport::FromJson(j);
    if (!report.ok()) return std::nullopt;
    report_ = std::move(report).value();
    report_file_ = file;
  }
  BrokerReport out = *report_;
  out.bus.broker_pid = starting_ ? 0 : pid_;
  out.bus.broker_restarts = restarts_;
  return out;
}

void BrokerProcess::Shutdown(std::chrono::milliseconds grace) {
  stopped_ = true;
  if (pid_ == 0) return;
  spawner_->SignalGroup(pid_, SIGTERM).IgnoreError();
  const Clock::TimePoint deadline = options_.clock->Now() + grace;
  for (;;) {
    const std::vector<ProcessExit> exits = spawner_->ReapExited();
    if (std::any_of(exits.begin(), exits.end(),
                    [&](const ProcessExit& e) { return e.pid == pid_; }))
      break;
    if (options_.clock->Now() >= deadline) {
      spawner_->SignalGroup(pid_, SIGKILL).IgnoreError();  // the spawner reaps it when it goes
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  pid_ = 0;
}

std::string BrokerProcess::Ended(const ProcessExit& e) const {
  if (e.term_signal != 0) {
    return fmt::format("was killed by signal {} ({})", e.term_signal, ::strsignal(e.term_signal));
  }
  return fmt::format("exited with status {}", e.exit_code);
}

// The last line the broker spawned last wrote to its log (its error), or "(nothing)".
std::string BrokerProcess::LastLogLine() const {
  auto text = ReadWholeFile(dir_.BusProcessLogPath(), size_t{64} << 20);
  if (!text.ok() || text->size() <= log_from_) return "(it wrote nothing)";
  std::string_view mine(*text);
  mine.remove_prefix(static_cast<size_t>(log_from_));
  while (!mine.empty() && mine.back() == '\n') mine.remove_suffix(1);
  const size_t nl = mine.rfind('\n');
  if (nl != std::string_view::npos) mine.remove_prefix(nl + 1);
  return std::string(mine);
}

}  // namespace agentrt
