// common/file_util.h: the open-files limit the bus raises for itself and a
// child restores before exec (so agents do not inherit the raised one).
#include "common/file_util.h"

#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>

TEST_CASE("RaiseOpenFileLimit raises the soft limit; a child restores the one before") {
  rlimit original{};
  REQUIRE(::getrlimit(RLIMIT_NOFILE, &original) == 0);
  REQUIRE(original.rlim_max >= 256);  // room to start below it
  // Start below the hard limit, as a login shell's 1024 soft limit would.
  rlimit low = original;
  low.rlim_cur = 128;
  REQUIRE(::setrlimit(RLIMIT_NOFILE, &low) == 0);
  agentrt::RaiseOpenFileLimit();
  rlimit now{};
  REQUIRE(::getrlimit(RLIMIT_NOFILE, &now) == 0);
  CHECK(now.rlim_cur == original.rlim_max);
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    agentrt::RestoreOpenFileLimit();
    rlimit child{};
    ::getrlimit(RLIMIT_NOFILE, &child);
    ::_exit(child.rlim_cur == 128 ? 0 : 1);
  }
  int status = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);  // the child runs with the limit from before the raise
  REQUIRE(::setrlimit(RLIMIT_NOFILE, &original) == 0);
}
