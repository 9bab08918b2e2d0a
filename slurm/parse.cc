#include "slurm/parse.h"

#include <fmt/format.h>

#include <array>
#include <charconv>
#include <utility>

namespace agentrt::slurm {
namespace {

constexpr std::array<std::pair<std::string_view, JobState>, 24> kStates = {{
    {"PENDING", JobState::kPending},       {"CONFIGURING", JobState::kConfiguring},
    {"RUNNING", JobState::kRunning},       {"SUSPENDED", JobState::kSuspended},
    {"COMPLETING", JobState::kCompleting}, {"COMPLETED", JobState::kCompleted},
    {"FAILED", JobState::kFailed},         {"CANCELLED", JobState::kCancelled},
    {"TIMEOUT", JobState::kTimeout},       {"NODE_FAIL", JobState::kNodeFail},
    {"PREEMPTED", JobState::kPreempted},   {"OUT_OF_MEMORY", JobState::kOutOfMemory},
    {"BOOT_FAIL", JobState::kBootFail},    {"DEADLINE", JobState::kDeadline},
    {"REQUEUED", JobState::kRequeued},     {"REQUEUE_FED", JobState::kRequeued},
    {"REQUEUE_HOLD", JobState::kRequeued}, {"RESIZING", JobState::kResizing},
    {"REVOKED", JobState::kRevoked},       {"SPECIAL_EXIT", JobState::kSpecialExit},
    {"STOPPED", JobState::kStopped},       {"SIGNALING", JobState::kRunning},
    {"STAGE_OUT", JobState::kCompleting},  {"UNKNOWN", JobState::kUnknown},
}};

std::string_view Trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t' || s.front() == '\r'))
    s.remove_prefix(1);
  while (!s.empty() &&
         (s.back() == ' ' || s.back() == '\t' || s.back() == '\r' || s.back() == '\n'))
    s.remove_suffix(1);
  return s;
}

std::vector<std::string_view> SplitLines(std::string_view text) {
  std::vector<std::string_view> lines;
  while (!text.empty()) {
    size_t nl = text.find('\n');
    std::string_view line = text.substr(0, nl);
    line = Trim(line);
    if (!line.empty()) lines.push_back(line);
    if (nl == std::string_view::npos) break;
    text.remove_prefix(nl + 1);
  }
  return lines;
}

std::vector<std::string_view> Split(std::string_view s, char sep) {
  std::vector<std::string_view> parts;
  while (true) {
    size_t p = s.find(sep);
    parts.push_back(s.substr(0, p));
    if (p == std::string_view::npos) break;
    s.remove_prefix(p + 1);
  }
  return parts;
}

// Each line of `command`'s output, `n` '|'-separated columns (printed with
// `format`), made a Record by `row(columns, line number)`; a line with other
// than `n` columns is an error that quotes it.
template <typename Record, typename Row>
Result<std::vector<Record>> ParseRows(std::string_view text, size_t n, std::string_view command,
                                      std::string_view format, const Row& row) {
  std::vector<Record> records;
  int line_no = 0;
  for (std::string_view line : SplitLines(text)) {
    ++line_no;
    const std::vector<std::string_view> cols = Split(line, '|');
    if (cols.size() != n) {
      return InvalidArgument(
          fmt::format("{} output, line {}: expected {} '|'-separated columns (format {}), got '{}'",
                      command, line_no, n, format, line));
    }
    AGENTRT_ASSIGN_OR_RETURN(Record r, row(cols, line_no));
    records.push_back(std::move(r));
  }
  return records;
}

bool ParseInt(std::string_view s, int& out) {
  auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
  return ec == std::errc() && ptr == s.data() + s.size();
}

std::string NullToEmpty(std::string_view v) {
  return v == "(null)" ? std::string() : std::string(v);
}

}  // namespace

JobState ParseJobState(std::string_view text) {
  text = Trim(text);
  // "CANCELLED by 0", "CANCELLED+": the state is the first word.
  size_t end = text.find_first_of(" +");
  std::string_view word = text.substr(0, end);
  for (const auto& [name, state] : kStates)
    if (name == word) return state;
  return JobState::kUnknown;
}

std::string_view JobStateName(JobState state) {
  for (const auto& [name, s] : kStates)
    if (s == state) return name;
  return "UNKNOWN";
}

bool IsTerminal(JobState state) {
  switch (state) {
    case JobState::kCompleted:
    case JobState::kFailed:
    case JobState::kCancelled:
    case JobState::kTimeout:
    case JobState::kNodeFail:
    case JobState::kPreempted:
    case JobState::kOutOfMemory:
    case JobState::kBootFail:
    case JobState::kDeadline:
    case JobState::kRevoked:
    case JobState::kSpecialExit:
      return true;
    default:
      return false;
  }
}

std::string JobRecord::DisplayId() const {
  if (!array_job_id.empty() && !array_task.empty()) return array_job_id + "_" + array_task;
  return job_id;
}

Result<std::pair<int, int>> ParseExitCode(std::string_view text) {
  text = Trim(text);
  size_t colon = text.find(':');
  int code = 0;
  int sig = 0;
  if (colon == std::string_view::npos || !ParseInt(text.substr(0, colon), code) ||
      !ParseInt(text.substr(colon + 1), sig)) {
    return InvalidArgument(fmt::format("exit code '{}' is not <code>:<signal>", text));
  }
  return std::make_pair(code, sig);
}

Result<std::vector<JobRecord>> ParseScontrolJobs(std::string_view text) {
  std::vector<JobRecord> jobs;
  int line_no = 0;
  for (std::string_view line : SplitLines(text)) {
    ++line_no;
    if (line == "No jobs in the system") continue;
    JobRecord job;
    std::string* last = nullptr;
    for (std::string_view word : Split(line, ' ')) {
      if (word.empty()) continue;
      size_t eq = word.find('=');
      if (eq == std::string_view::npos || eq == 0) {
        // A value with spaces in it: "WorkDir=/a b" splits into "WorkDir=/a" and "b".
        if (last != nullptr) {
          *last += ' ';
          *last += word;
        }
        continue;
      }
      last = &(job.fields[std::string(word.substr(0, eq))] = std::string(word.substr(eq + 1)));
    }
    auto field = [&job](const char* key) -> std::string {
      auto it = job.fields.find(key);
      return it == job.fields.end() ? std::string() : it->second;
    };
    job.job_id = field("JobId");
    if (job.job_id.empty()) {
      return InvalidArgument(fmt::format("scontrol show job output, line {}: no JobId= in '{}'",
                                         line_no, line.substr(0, 120)));
    }
    job.array_job_id = NullToEmpty(field("ArrayJobId"));
    job.array_task = NullToEmpty(field("ArrayTaskId"));
    job.name = field("JobName");
    job.state_text = field("JobState");
    job.state = ParseJobState(job.state_text);
    job.reason = field("Reason");
    job.node_list = NullToEmpty(field("NodeList"));
    if (std::string ec = field("ExitCode"); !ec.empty()) {
      auto parsed = ParseExitCode(ec);
      if (!parsed.ok()) return parsed.status().WithContext(fmt::format("job {}", job.job_id));
      job.exit_code = parsed->first;
      job.exit_signal = parsed->second;
    }
    if (std::string r = field("Restarts"); !r.empty() && !ParseInt(r, job.restarts)) {
      return InvalidArgument(fmt::format("job {}: Restarts={} is not a number", job.job_id, r));
    }
    jobs.push_back(std::move(job));
  }
  return jobs;
}

Result<std::vector<StepRecord>> ParseSqueueSteps(std::string_view text) {
  return ParseRows<StepRecord>(
      text, 3, "squeue --steps", kSqueueStepFormat,
      [](const std::vector<std::string_view>& cols, int line_no) -> Result<StepRecord> {
        StepRecord s;
        s.step_id = std::string(cols[0]);
        size_t dot = s.step_id.rfind('.');
        if (dot == std::string::npos) {
          return InvalidArgument(fmt::format(
              "squeue --steps output, line {}: step id '{}' has no '.'", line_no, s.step_id));
        }
        s.job = s.step_id.substr(0, dot);
        s.step = s.step_id.substr(dot + 1);
        s.name = std::string(cols[1]);
        s.node_list = std::string(cols[2]);
        return s;
      });
}

Result<std::vector<AccountingRecord>> ParseSacct(std::string_view text) {
  return ParseRows<AccountingRecord>(
      text, 5, "sacct", kSacctFields,
      [](const std::vector<std::string_view>& cols, int line_no) -> Result<AccountingRecord> {
        AccountingRecord r;
        r.job_id = std::string(cols[0]);
        r.name = std::string(cols[1]);
        r.state = ParseJobState(cols[2]);
        auto ec = ParseExitCode(cols[3]);
        if (!ec.ok()) return ec.status().WithContext(fmt::format("sacct output, line {}", line_no));
        r.exit_code = ec->first;
        r.exit_signal = ec->second;
        r.node_list = std::string(cols[4]);
        return r;
      });
}

Result<std::string> ParseSbatchParsable(std::string_view text) {
  std::string_view t = Trim(text);
  // Warnings may precede the id on their own lines; the id is the last line.
  size_t nl = t.rfind('\n');
  if (nl != std::string_view::npos) t = Trim(t.substr(nl + 1));
  std::string_view id = t.substr(0, t.find(';'));
  int unused = 0;
  if (id.empty() || !ParseInt(id, unused)) {
    return InvalidArgument(fmt::format("sbatch --parsable printed '{}', not a job id", Trim(text)));
  }
  return std::string(id);
}

}  // namespace agentrt::slurm
