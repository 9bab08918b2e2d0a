// The rank wrapper that mpirun starts in front of every rank of an MPI agent:
//
//   agentrt-exec-rank --log-dir DIR -- /abs/program args...
//   (also reachable as `agentctl exec-rank --log-dir DIR -- ...`)
//
// It sets RANK, LOCAL_RANK, WORLD_SIZE and LOCAL_WORLD_SIZE from Open MPI's
// OMPI_COMM_WORLD_* variables (so the rank sees exactly the DESIGN §4
// variables), sets PR_SET_PDEATHSIG(SIGKILL) — Open MPI puts its children in
// their own process groups, so this is what makes them die with mpirun, which
// dies with agentctl — sends stdout/stderr to DIR/rank<RANK>.log and execs the
// program. Header-only and libc-only so the wrapper binary starts in a
// millisecond (it runs once per rank).
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace agentrt {

// Returns only on error, with the exit status to use.
inline int ExecRank(const std::string& log_dir, const std::vector<std::string>& argv) {
  if (argv.empty()) {
    std::fprintf(stderr, "exec-rank: no command given\n");
    return 2;
  }
  const pid_t parent = ::getppid();
  if (::prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || parent == 1 || ::getppid() != parent) {
    return 127;  // our launcher is already gone
  }
  auto env_or = [](const char* name, const char* fallback) {
    const char* v = std::getenv(name);
    return std::string(v != nullptr ? v : fallback);
  };
  const std::string rank = env_or("OMPI_COMM_WORLD_RANK", "");
  if (rank.empty()) {
    std::fprintf(stderr, "exec-rank: OMPI_COMM_WORLD_RANK is not set; this wrapper runs under mpirun\n");
    return 2;
  }
  ::setenv("RANK", rank.c_str(), 1);
  ::setenv("LOCAL_RANK", env_or("OMPI_COMM_WORLD_LOCAL_RANK", "0").c_str(), 1);
  ::setenv("WORLD_SIZE", env_or("OMPI_COMM_WORLD_SIZE", "1").c_str(), 1);
  ::setenv("LOCAL_WORLD_SIZE", env_or("OMPI_COMM_WORLD_LOCAL_SIZE", "1").c_str(), 1);
  if (!log_dir.empty()) {
    const std::string path = log_dir + "/rank" + rank + ".log";
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd < 0) {
      std::fprintf(stderr, "exec-rank: cannot open %s: %s\n", path.c_str(), std::strerror(errno));
      return 126;
    }
    ::dup2(fd, 1);
    ::dup2(fd, 2);
  }
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  ::execv(args[0], args.data());
  std::fprintf(stderr, "exec-rank: cannot execute %s: %s\n", args[0], std::strerror(errno));
  return 127;
}

// Parses `--log-dir DIR -- program args...` (argv[0] excluded) and runs ExecRank.
inline int ExecRankMain(int argc, char** argv) {
  std::string log_dir;
  std::vector<std::string> command;
  int i = 1;
  for (; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--log-dir" && i + 1 < argc) {
      log_dir = argv[++i];
    } else if (a == "--") {
      ++i;
      break;
    } else {
      std::fprintf(stderr, "usage: %s [--log-dir DIR] -- /abs/program args...\n", argv[0]);
      return 2;
    }
  }
  for (; i < argc; ++i) command.emplace_back(argv[i]);
  return ExecRank(log_dir, command);
}

}  // namespace agentrt
