#include "slurm/command_runner.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>

namespace agentrt::slurm {
namespace {

// A started child: its pid and the read ends of its stdout and stderr.
struct Child {
  pid_t pid = -1;
  int out = -1;
  int err = -1;
};

// Starts argv (PATH searched) in a new process group, stdin from /dev/null;
// an exec that fails is reported here (NotFound when argv[0] is not in PATH).
// posix_spawn, not fork: the controller that runs these commands may hold
// hundreds of MiB (its broker's logs), and every fork would copy its page
// tables; the spawned child borrows them until it execs.
Result<Child> StartChild(const std::vector<std::string>& argv) {
  int out_pipe[2];
  int err_pipe[2];
  if (pipe2(out_pipe, O_CLOEXEC) != 0) return ErrnoStatus(errno, "pipe for " + argv[0]);
  if (pipe2(err_pipe, O_CLOEXEC) != 0) {
    int e = errno;
    close(out_pipe[0]);
    close(out_pipe[1]);
    return ErrnoStatus(e, "pipe for " + argv[0]);
  }
  std::vector<char*> cargv;
  cargv.reserve(argv.size() + 1);
  for (const auto& a : argv) cargv.push_back(const_cast<char*>(a.c_str()));
  cargv.push_back(nullptr);
  posix_spawn_file_actions_t files;
  posix_spawn_file_actions_init(&files);
  posix_spawn_file_actions_addopen(&files, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_adddup2(&files, out_pipe[1], STDOUT_FILENO);
  posix_spawn_file_actions_adddup2(&files, err_pipe[1], STDERR_FILENO);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  // Its own group (set before it execs), so a timeout kills everything it started.
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP);
  posix_spawnattr_setpgroup(&attr, 0);
  pid_t pid = -1;
  const int e = posix_spawnp(&pid, cargv[0], &files, &attr, cargv.data(), environ);
  posix_spawnattr_destroy(&attr);
  posix_spawn_file_actions_destroy(&files);
  close(out_pipe[1]);
  close(err_pipe[1]);
  if (e != 0) {
    close(out_pipe[0]);
    close(err_pipe[0]);
    Status s = ErrnoStatus(e, fmt::format("cannot run '{}'", argv[0]));
    return e == ENOENT ? NotFound(s.message() + " (not in PATH)") : s;
  }
  return Child{pid, out_pipe[0], err_pipe[0]};
}

// Reads the child's stdout and stderr until both close or the deadline
// passes (then true); closes them.
bool Drain(const Child& child, std::chrono::steady_clock::time_point deadline,
           CommandOutput* result) {
  bool timed_out = false;
  pollfd fds[2] = {{child.out, POLLIN, 0}, {child.err, POLLIN, 0}};
  std::string* sinks[2] = {&result->out, &result->err};
  int open_fds = 2;
  char buf[8192];
  while (open_fds > 0) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      timed_out = true;
      break;
    }
    int r = poll(fds, 2, static_cast<int>(left.count()));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) break;
    for (int i = 0; i < 2; ++i) {
      if (fds[i].fd < 0 || fds[i].revents == 0) continue;
      ssize_t got = read(fds[i].fd, buf, sizeof buf);
      if (got > 0) {
        sinks[i]->append(buf, static_cast<size_t>(got));
      } else if (got == 0 || (errno != EINTR && errno != EAGAIN)) {
        close(fds[i].fd);
        fds[i].fd = -1;
        --open_fds;
      }
    }
  }
  for (auto& f : fds)
    if (f.fd >= 0) close(f.fd);
  return timed_out;
}

// Waits for the child's exit until the deadline (the pipes may close before
// the program exits: it closed them itself); past it, SIGKILL to its whole
// group. Its wait status; *timed_out set when it had to be killed.
int Reap(pid_t pid, std::chrono::steady_clock::time_point deadline, bool* timed_out) {
  int wstatus = 0;
  while (!*timed_out) {
    pid_t w = waitpid(pid, &wstatus, WNOHANG);
    if (w == pid || (w < 0 && errno != EINTR)) break;
    if (std::chrono::steady_clock::now() >= deadline) {
      *timed_out = true;
      break;
    }
    usleep(5000);
  }
  if (*timed_out) {
    kill(-pid, SIGKILL);
    while (waitpid(pid, &wstatus, 0) < 0 && errno == EINTR) {
    }
  }
  return wstatus;
}

class ProcessRunner final : public CommandRunner {
 public:
  Result<CommandOutput> Run(const std::vector<std::string>& argv, double timeout_s) override {
    if (argv.empty()) return InvalidArgument("CommandRunner::Run: empty argv");
    AGENTRT_ASSIGN_OR_RETURN(const Child child, StartChild(argv));
    CommandOutput result;
    const auto deadline = std::chrono::steady_clock::now() +
                          std::chrono::milliseconds(static_cast<long long>(timeout_s * 1000));
    bool timed_out = Drain(child, deadline, &result);
    const int wstatus = Reap(child.pid, deadline, &timed_out);
    if (timed_out) {
      return DeadlineExceeded(
          fmt::format("'{}' did not finish within {} s and was killed; stderr so far: {}",
                      FormatCommand(argv), timeout_s, result.err));
    }
    result.exit_code = WIFEXITED(wstatus) ? WEXITSTATUS(wstatus) : 128 + WTERMSIG(wstatus);
    return result;
  }
};

}  // namespace

std::unique_ptr<CommandRunner> MakeProcessRunner() { return std::make_unique<ProcessRunner>(); }

std::string FormatCommand(const std::vector<std::string>& argv) {
  std::string s;
  for (const auto& a : argv) {
    if (!s.empty()) s += ' ';
    bool plain = !a.empty() && a.find_first_not_of(
                                   "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                   "0123456789-_./=:,@%+") == std::string::npos;
    if (plain) {
      s += a;
    } else {
      s += '\'';
      for (char c : a) s += c == '\'' ? std::string("'\\''") : std::string(1, c);
      s += '\'';
    }
  }
  return s;
}

}  // namespace agentrt::slurm
