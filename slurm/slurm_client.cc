#include "slurm/slurm_client.h"

#include <fmt/format.h>

#include <chrono>
#include <thread>

namespace agentrt::slurm {
namespace {

std::string Tail(const std::string& s, size_t max_bytes = 2000) {
  std::string t = s.size() > max_bytes ? "..." + s.substr(s.size() - max_bytes) : s;
  while (!t.empty() && (t.back() == '\n' || t.back() == ' ')) t.pop_back();
  return t;
}

// UNAVAILABLE: `argv` exited non-zero; its last output says why.
Status Failed(const std::vector<std::string>& argv, const CommandOutput& out) {
  std::string err = Tail(out.err.empty() ? out.out : out.err);
  return Status(StatusCode::kUnavailable,
                fmt::format("'{}' failed with exit code {}: {}", FormatCommand(argv), out.exit_code,
                            err.empty() ? "(no output)" : err));
}

// What a parser made of argv's output; its error names the command.
template <typename T>
Result<T> ParsedFrom(const std::vector<std::string>& argv, Result<T> parsed) {
  if (!parsed.ok()) return parsed.status().WithContext(FormatCommand(argv));
  return parsed;
}

}  // namespace

SlurmClient::SlurmClient(CommandRunner& runner, SlurmClientOptions options)
    : runner_(runner), options_(options) {}

Result<CommandOutput> SlurmClient::RunChecked(const std::vector<std::string>& argv) {
  AGENTRT_ASSIGN_OR_RETURN(CommandOutput out, runner_.Run(argv, options_.command_timeout_s));
  if (out.exit_code != 0) return Failed(argv, out);
  return out;
}

Result<std::string> SlurmClient::Submit(const std::string& script_path,
                                        const std::vector<std::string>& args) {
  std::vector<std::string> argv = {"sbatch", "--parsable"};
  argv.insert(argv.end(), args.begin(), args.end());
  argv.push_back(script_path);
  AGENTRT_ASSIGN_OR_RETURN(CommandOutput out, RunChecked(argv));
  return ParsedFrom(argv, ParseSbatchParsable(out.out));
}

Result<std::vector<JobRecord>> SlurmClient::ShowJob(std::string_view job_id) {
  std::vector<std::string> argv = {"scontrol", "show", "job", "-o", std::string(job_id)};
  AGENTRT_ASSIGN_OR_RETURN(CommandOutput out, runner_.Run(argv, options_.command_timeout_s));
  if (out.exit_code != 0) {
    if (out.err.find("Invalid job id") != std::string::npos) {
      return NotFound(
          fmt::format("SLURM does not know job {} (never submitted, or finished more than "
                      "MinJobAge ago): {}",
                      job_id, Tail(out.err)));
    }
    return Failed(argv, out);
  }
  return ParsedFrom(argv, ParseScontrolJobs(out.out));
}

Result<std::vector<StepRecord>> SlurmClient::Steps(std::string_view job_id) {
  std::vector<std::string> argv = {
      "squeue", "-h", "--steps", "-j", std::string(job_id), "-o", std::string(kSqueueStepFormat)};
  AGENTRT_ASSIGN_OR_RETURN(CommandOutput out, RunChecked(argv));
  return ParsedFrom(argv, ParseSqueueSteps(out.out));
}

Result<std::vector<AccountingRecord>> SlurmClient::Accounting(std::string_view job_id) {
  std::vector<std::string> argv = {
      "sacct", "-n", "-P", "-j", std::string(job_id), "-o", std::string(kSacctFields)};
  AGENTRT_ASSIGN_OR_RETURN(CommandOutput out, runner_.Run(argv, options_.command_timeout_s));
  // sacct exits 1 with this on stderr when there is no slurmdbd.
  if (out.err.find("accounting storage is disabled") != std::string::npos) {
    return FailedPrecondition(
        fmt::format("'{}': SLURM accounting is disabled on this cluster (no slurmdbd); use "
                    "ShowJob/Steps instead: {}",
                    FormatCommand(argv), Tail(out.err)));
  }
  if (out.exit_code != 0) return Failed(argv, out);
  return ParsedFrom(argv, ParseSacct(out.out));
}

Status SlurmClient::Cancel(std::string_view job_id, const CancelOptions& options) {
  std::vector<std::string> argv = {"scancel"};
  if (!options.signal.empty()) argv.push_back("--signal=" + options.signal);
  if (options.batch_only) argv.push_back("--batch");
  if (options.full) argv.push_back("--full");
  argv.emplace_back(job_id);
  auto out = RunChecked(argv);
  return out.ok() ? Status::Ok() : out.status();
}

Result<std::string> SlurmClient::ShowNodesText() {
  AGENTRT_ASSIGN_OR_RETURN(CommandOutput out, RunChecked({"scontrol", "show", "node", "-o"}));
  return std::move(out.out);
}

Result<std::vector<JobRecord>> SlurmClient::WaitForJobs(const std::vector<std::string>& job_ids,
                                                        double timeout_s) {
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::milliseconds(static_cast<long long>(timeout_s * 1000));
  while (true) {
    std::vector<JobRecord> all;
    std::string unfinished;
    for (const auto& id : job_ids) {
      AGENTRT_ASSIGN_OR_RETURN(auto jobs, ShowJob(id));
      for (auto& job : jobs) {
        // A pending array not yet split into tasks shows as one record with a range.
        bool range = job.array_task.find_first_of("-,%") != std::string::npos;
        if (range || !IsTerminal(job.state)) {
          unfinished += fmt::format("{}{}={}", unfinished.empty() ? "" : ", ", job.DisplayId(),
                                    job.state_text);
        }
        all.push_back(std::move(job));
      }
    }
    if (unfinished.empty()) return all;
    if (std::chrono::steady_clock::now() >= deadline) {
      return DeadlineExceeded(
          fmt::format("SLURM jobs not finished after {} s: {}", timeout_s, unfinished));
    }
    std::this_thread::sleep_for(
        std::chrono::milliseconds(static_cast<long long>(options_.poll_interval_s * 1000)));
  }
}

}  // namespace agentrt::slurm
