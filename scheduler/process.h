// ProcessSpawner: vfork/exec of agent processes, behind an interface so the
// local backend's logic can be unit-tested with a fake. vfork, not fork: a
// launch then costs the same however large the controller has grown.
//
// The POSIX spawner puts every child in a process group (its own, or one it is
// told to join), sets PR_SET_PDEATHSIG(SIGKILL) so the child dies with the
// spawning thread, and checks after prctl that the parent is still there (the
// parent may die between vfork and prctl). Call Spawn from a thread that lives
// as long as the children should (the main thread).
#pragma once

#include <sys/types.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"

namespace agentrt {

struct SpawnRequest {
  std::vector<std::string> argv;  // argv[0] is an absolute or relative path (resolved already)
  std::vector<std::string> env;   // the complete environment, "NAME=value"
  std::string log_path;           // stdout and stderr are appended here; stdin is /dev/null
  pid_t join_group = 0;           // 0: the child leads a new process group
  std::string workdir;            // the child's working directory ("" = the parent's)
};

struct ProcessExit {
  pid_t pid = 0;
  int exit_code = 0;    // valid when term_signal == 0
  int term_signal = 0;  // the signal that killed it, or 0
};

class ProcessSpawner {
 public:
  virtual ~ProcessSpawner() = default;

  // Starts the process; returns once it has exec'd (or failed to: then an error
  // naming the program and errno, and no process is left).
  virtual Result<pid_t> Spawn(const SpawnRequest& request) = 0;

  // kill(-pgid, sig). A group that no longer exists is not an error.
  virtual Status SignalGroup(pid_t pgid, int sig) = 0;

  // Non-blocking: reaps the children of this spawner that have ended.
  virtual std::vector<ProcessExit> ReapExited() = 0;
};

std::unique_ptr<ProcessSpawner> MakePosixSpawner();

// Finds `name` the way execvp would: as given when it contains '/', else in the
// ':'-separated `path_env`, then in each of `fallback_dirs`. Returns the
// absolute path of an executable file, or NotFound naming every place looked.
Result<std::string> ResolveExecutable(const std::string& name, const std::string& path_env,
                                      const std::vector<std::string>& fallback_dirs);

// The directory of the running executable (/proc/self/exe), or "" if unknown.
std::string SelfExecutableDir();

// Where launch backends look for an agent's program after PATH: the directory
// of the running agentctl (so `agent-worker` next to it is found), if known.
std::vector<std::string> DefaultSearchDirs();

// The Python package `agentrt` (python/agentrt) and the C library it loads,
// found next to the running agentctl: <build>/python and
// <build>/lib/libagentrt_c.so in a build tree, <prefix>/<libdir>/agentrt/python
// and <prefix>/<libdir>/libagentrt_c.so.1 when installed.
struct PythonPackage {
  std::string python_dir;  // holds agentrt/__init__.py
  std::string library;     // libagentrt_c.so
};
std::optional<PythonPackage> FindPythonPackage();

// Prepends the package's folder to this process's PYTHONPATH and sets
// AGENTRT_C_LIBRARY (unless already set), so that every agent started from it
// (any backend: they inherit this environment) can `import agentrt` with no
// set-up. A no-op when the package is not found.
void ExposePythonPackage();

// This process's environment as "NAME=value" strings, the base a launch
// backend builds each rank's environment on.
std::vector<std::string> CurrentEnviron();

// "exited with code 3" / "was killed by SIGKILL (signal 9)".
std::string DescribeExit(int exit_code, int term_signal);

}  // namespace agentrt
