// `agentctl logs RUN_DIR AGENT [--rank N] [--follow]` — an agent's rank logs
// (RUN_DIR/logs/<agent>/rank<N>.log). Without --rank every rank's log, each
// line prefixed with [rankN]. --follow keeps printing new lines until the run
// has ended (or Ctrl-C).
#include <fmt/format.h>
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "plan/run_dir.h"
#include "scheduler/status.h"
#include "tools/agentctl/commands.h"

namespace agentctl {
namespace {
namespace fs = std::filesystem;

// A log file read incrementally; complete lines only (a partial last line waits).
struct LogFile {
  LogFile(std::string l, fs::path p) : label(std::move(l)), path(std::move(p)) {}
  std::string label;  // "" when only one file is shown
  fs::path path;
  std::streamoff offset = 0;
  std::string partial;

  void Pump(bool flush_partial) {
    std::ifstream in(path, std::ios::binary);
    if (!in) return;
    in.seekg(offset);
    std::string chunk((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    offset += static_cast<std::streamoff>(chunk.size());
    partial += chunk;
    size_t start = 0;
    std::string out;
    for (size_t nl; (nl = partial.find('\n', start)) != std::string::npos; start = nl + 1) {
      out += label + partial.substr(start, nl - start + 1);
    }
    partial.erase(0, start);
    if (flush_partial && !partial.empty()) {
      out += label + partial + "\n";
      partial.clear();
    }
    if (!out.empty()) {
      std::fputs(out.c_str(), stdout);
      std::fflush(stdout);
    }
  }
};

int RankOf(const fs::path& p) {
  const std::string name = p.filename().string();  // rank<N>.log
  try {
    return std::stoi(name.substr(4));
  } catch (const std::exception&) {
    return -1;
  }
}

std::vector<std::string> AgentsWithLogs(const std::string& run_dir) {
  std::vector<std::string> names;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(agentrt::RunDir(run_dir).LogsDir(), ec))
    names.push_back(e.path().filename());
  std::sort(names.begin(), names.end());
  return names;
}

bool RunEnded(const std::string& run_dir) {
  if (agentrt::LiveControllerPid(run_dir) != 0) return false;
  return true;
}

}  // namespace

void RegisterLogs(CLI::App& app) {
  struct Options {
    std::string run_dir;
    std::string agent;
    int rank = -1;
    bool follow = false;
  };
  auto opts = std::make_shared<Options>();
  CLI::App* cmd = app.add_subcommand("logs", "Print an agent's logs (all ranks, or one)");
  cmd->add_option("run_dir", opts->run_dir, "the run directory")->required();
  cmd->add_option("agent", opts->agent, "agent name, e.g. predator-0")->required();
  cmd->add_option("--rank", opts->rank, "only this rank");
  cmd->add_flag("-f,--follow", opts->follow, "keep printing new lines until the run ends");
  cmd->callback([opts] {
    const fs::path dir = fs::path(opts->run_dir) / "logs" / opts->agent;
    if (!fs::is_directory(dir)) {
      std::string known;
      for (const auto& n : AgentsWithLogs(opts->run_dir)) known += (known.empty() ? "" : ", ") + n;
      Fail("logs", agentrt::NotFound(
                       fmt::format("no logs for agent '{}' in {} (agents with logs: {})",
                                   opts->agent, opts->run_dir, known.empty() ? "none" : known)));
    }
    std::vector<fs::path> paths;
    for (const auto& e : fs::directory_iterator(dir)) {
      const std::string name = e.path().filename().string();
      if (name.rfind("rank", 0) == 0 && RankOf(e.path()) >= 0) paths.push_back(e.path());
    }
    std::sort(paths.begin(), paths.end(),
              [](const auto& a, const auto& b) { return RankOf(a) < RankOf(b); });
    if (opts->rank >= 0) {
      const fs::path want = dir / fmt::format("rank{}.log", opts->rank);
      if (!fs::exists(want)) {
        Fail("logs",
             agentrt::NotFound(fmt::format("agent {} has no log for rank {} ({} does not exist)",
                                           opts->agent, opts->rank, want.string())));
      }
      paths = {want};
    }
    std::vector<LogFile> files;
    files.reserve(paths.size() + 1);
    for (const auto& p : paths) {
      files.emplace_back(paths.size() > 1 ? fmt::format("[rank{}] ", RankOf(p)) : "", p);
    }
    if (paths.size() > 1 && fs::exists(dir / "mpirun.log"))
      files.emplace_back("[mpirun] ", dir / "mpirun.log");
    for (auto& f : files) f.Pump(!opts->follow);
    if (!opts->follow) return;
    signal(SIGPIPE, SIG_DFL);
    while (true) {
      const bool ended = RunEnded(opts->run_dir);
      for (auto& f : files) f.Pump(ended);
      if (ended) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
  });
}

}  // namespace agentctl
