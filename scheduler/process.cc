#include "scheduler/process.h"

#include <fcntl.h>
#include <linux/close_range.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <set>
#include <sstream>

#include "common/file_util.h"
#include "scheduler/launch_backend.h"

namespace agentrt {
namespace {

// Closes a file descriptor when it goes out of scope.
class Fd {
 public:
  explicit Fd(int fd = -1) : fd_(fd) {}
  ~Fd() { Reset(); }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }
  void Reset() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

 private:
  int fd_;
};

bool IsExecutableFile(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) && ::access(path.c_str(), X_OK) == 0;
}

// Writes the errno and exits; only async-signal-safe calls (runs after vfork).
[[noreturn]] void ChildFail(int report_fd, int err) {
  ssize_t ignored = ::write(report_fd, &err, sizeof err);
  (void)ignored;
  ::_exit(127);
}

class PosixSpawner final : public ProcessSpawner {
 public:
  Result<pid_t> Spawn(const SpawnRequest& request) override {
    if (request.argv.empty()) return InvalidArgument("spawn: empty command");
    // Everything the child needs is prepared before fork: after fork in a
    // multi-threaded process only async-signal-safe calls are allowed.
    std::vector<char*> argv;
    for (const auto& a : request.argv) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    std::vector<char*> envp;
    for (const auto& e : request.env) envp.push_back(const_cast<char*>(e.c_str()));
    envp.push_back(nullptr);

    Fd log(::open(request.log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644));
    if (log.get() < 0) return ErrnoStatus(errno, "cannot open log file " + request.log_path);
    Fd devnull(::open("/dev/null", O_RDONLY | O_CLOEXEC));
    if (devnull.get() < 0) return ErrnoStatus(errno, "cannot open /dev/null");
    int pipe_fds[2];
    if (::pipe2(pipe_fds, O_CLOEXEC) != 0) return ErrnoStatus(errno, "pipe2");
    Fd report_read(pipe_fds[0]);
    Fd report_write(pipe_fds[1]);

    const pid_t parent = ::getpid();
    const pid_t join = request.join_group;
    const char* const workdir = request.workdir.empty() ? nullptr : request.workdir.c_str();
    // vfork: the child borrows this process's memory until execve, so starting
    // a rank costs the same whatever the controller's size (fork would copy
    // its page tables: thousands of agents made launches quadratic). Every
    // signal stays blocked until the child has reset all handlers: no handler
    // of agentctl's may run on the borrowed memory.
    sigset_t all, old;
    sigfillset(&all);
    ::pthread_sigmask(SIG_SETMASK, &all, &old);
    const pid_t pid = ::vfork();
    if (pid == 0) {
      for (int sig = 1; sig < NSIG; ++sig) {
        if (sig != SIGKILL && sig != SIGSTOP) ::signal(sig, SIG_DFL);
      }
      sigset_t none;
      sigemptyset(&none);
      ::sigprocmask(SIG_SETMASK, &none, nullptr);
      if (::setpgid(0, join) != 0) ChildFail(report_write.get(), errno);
      if (::prctl(PR_SET_PDEATHSIG, SIGKILL) != 0) ChildFail(report_write.get(), errno);
      // The parent may have died before prctl took effect: then nobody would kill us.
      if (::getppid() != parent) ::_exit(127);
      if (::dup2(devnull.get(), 0) < 0 || ::dup2(log.get(), 1) < 0 || ::dup2(log.get(), 2) < 0) {
        ChildFail(report_write.get(), errno);
      }
      if (workdir != nullptr && ::chdir(workdir) != 0) ChildFail(report_write.get(), errno);
      RestoreOpenFileLimit();  // the limit agentctl had before its bus raised it
      // Nothing of agentctl's but stdin/out/err reaches the rank: a library's
      // socket opened without CLOEXEC (the dashboard's listener) would
      // otherwise live on in every agent process.
      if (::close_range(3, ~0U, CLOSE_RANGE_CLOEXEC) != 0) {
        for (int fd = 3; fd < 65536; ++fd) (void)::fcntl(fd, F_SETFD, FD_CLOEXEC);
      }
      ::execve(argv[0], argv.data(), envp.data());
      ChildFail(report_write.get(), errno);
    }
    const int vfork_errno = errno;
    ::pthread_sigmask(SIG_SETMASK, &old, nullptr);
    if (pid < 0) return ErrnoStatus(vfork_errno, "vfork for " + request.argv[0]);
    // Both sides call setpgid so the group exists before anyone signals it.
    ::setpgid(pid, join == 0 ? pid : join);
    report_write.Reset();
    int child_errno = 0;
    ssize_t n;
    do {
      n = ::read(report_read.get(), &child_errno, sizeof child_errno);
    } while (n < 0 && errno == EINTR);
    if (n > 0) {
      int status = 0;
      ::waitpid(pid, &status, 0);
      return ErrnoStatus(child_errno, "cannot start " + request.argv[0]);
    }
    live_.insert(pid);
    return pid;
  }

  Status SignalGroup(pid_t pgid, int sig) override {
    if (pgid <= 0) return InvalidArgument("signal: bad process group " + std::to_string(pgid));
    if (::kill(-pgid, sig) != 0 && errno != ESRCH) {
      return ErrnoStatus(errno, "kill(-" + std::to_string(pgid) + ", " + std::to_string(sig) + ")");
    }
    return Status::Ok();
  }

  std::vector<ProcessExit> ReapExited() override {
    std::vector<ProcessExit> exits;
    // One syscall says whether any child has exited (without reaping it); the
    // live set, one waitpid per process, is walked only then: polling stays
    // cheap with thousands of agents.
    siginfo_t info{};
    if (::waitid(P_ALL, 0, &info, WEXITED | WNOHANG | WNOWAIT) == 0 && info.si_pid == 0)
      return exits;
    for (auto it = live_.begin(); it != live_.end();) {
      int status = 0;
      const pid_t r = ::waitpid(*it, &status, WNOHANG);
      if (r == 0 || (r < 0 && errno == EINTR)) {
        ++it;
        continue;
      }
      ProcessExit e;
      e.pid = *it;
      if (r < 0) {
        e.exit_code = 255;  // reaped by someone else: nothing more is known
      } else if (WIFEXITED(status)) {
        e.exit_code = WEXITSTATUS(status);
      } else if (WIFSIGNALED(status)) {
        e.term_signal = WTERMSIG(status);
      } else {
        ++it;  // stopped/continued: not an exit
        continue;
      }
      exits.push_back(e);
      it = live_.erase(it);
    }
    return exits;
  }

  ~PosixSpawner() override {
    // Nothing of ours must outlive the spawner.
    for (pid_t pid : live_) {
      ::kill(-pid, SIGKILL);
      ::kill(pid, SIGKILL);
      int status = 0;
      ::waitpid(pid, &status, 0);
    }
  }

 private:
  std::set<pid_t> live_;
};

}  // namespace

std::unique_ptr<ProcessSpawner> MakePosixSpawner() { return std::make_unique<PosixSpawner>(); }

Result<std::string> ResolveExecutable(const std::string& name, const std::string& path_env,
                                      const std::vector<std::string>& fallback_dirs) {
  if (name.empty()) return InvalidArgument("empty program name");
  // Absolute, so it still names the file after the child enters its workdir.
  auto absolute = [](const std::string& p) {
    return std::filesystem::absolute(p).lexically_normal().string();
  };
  if (name.find('/') != std::string::npos) {
    if (IsExecutableFile(name)) return absolute(name);
    return NotFound("program '" + name + "' does not exist or is not executable");
  }
  std::vector<std::string> dirs;
  std::stringstream ss(path_env);
  for (std::string dir; std::getline(ss, dir, ':');) dirs.push_back(dir.empty() ? "." : dir);
  dirs.insert(dirs.end(), fallback_dirs.begin(), fallback_dirs.end());
  for (const auto& dir : dirs) {
    const std::string candidate = dir + "/" + name;
    if (IsExecutableFile(candidate)) return absolute(candidate);
  }
  std::string looked;
  for (const auto& dir : dirs) looked += (looked.empty() ? "" : ":") + dir;
  return NotFound("program '" + name + "' not found in PATH or next to agentctl (looked in " +
                  looked + ")");
}

std::string SelfExecutableDir() {
  std::error_code ec;
  auto exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (ec) return "";
  return exe.parent_path().string();
}

std::vector<std::string> DefaultSearchDirs() {
  std::string self = SelfExecutableDir();
  if (self.empty()) return {};
  return {std::move(self)};
}

std::optional<PythonPackage> FindPythonPackage() {
  namespace fs = std::filesystem;
  const std::string self = SelfExecutableDir();
  if (self.empty()) return std::nullopt;
  const fs::path root = fs::path(self).parent_path();
  std::error_code ec;
  const std::pair<fs::path, fs::path> layouts[] = {
      {root / "python", root / "lib" / "libagentrt_c.so"},
      {root / AGENTRT_INSTALL_LIBDIR / "agentrt" / "python",
       root / AGENTRT_INSTALL_LIBDIR / "libagentrt_c.so.1"}};
  for (const auto& [python, library] : layouts) {
    if (fs::exists(python / "agentrt" / "__init__.py", ec) && fs::exists(library, ec)) {
      return PythonPackage{python.lexically_normal().string(), library.lexically_normal().string()};
    }
  }
  return std::nullopt;
}

void ExposePythonPackage() {
  const std::optional<PythonPackage> package = FindPythonPackage();
  if (!package) return;
  const char* old = std::getenv("PYTHONPATH");
  std::string path = package->python_dir;
  if (old != nullptr && *old != '\0') {
    const std::string current = old;
    if ((":" + current + ":").find(":" + path + ":") != std::string::npos) {
      path = current;
    } else {
      path += ":" + current;
    }
  }
  ::setenv("PYTHONPATH", path.c_str(), 1);
  ::setenv("AGENTRT_C_LIBRARY", package->library.c_str(), 0);
}

std::vector<std::string> CurrentEnviron() {
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) env.emplace_back(*e);
  return env;
}

std::string DescribeExit(int exit_code, int term_signal) {
  if (term_signal != 0) {
    const char* abbrev = ::sigabbrev_np(term_signal);  // "KILL"
    return "was killed by " +
           (abbrev != nullptr ? "SIG" + std::string(abbrev) : std::string("a signal")) +
           " (signal " + std::to_string(term_signal) + ")";
  }
  return "exited with code " + std::to_string(exit_code);
}

std::string AgentProcessExit::Describe() const {
  const std::string how = DescribeExit(exit_code, term_signal);
  return lost.empty() ? how : how + " but " + lost;
}

}  // namespace agentrt
