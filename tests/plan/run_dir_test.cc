// The run directory owns its layout, the tokens' paths and the run secret.
#include "plan/run_dir.h"

#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <filesystem>

#include "common/file_util.h"
#include "tests/common/temp_dir.h"

namespace agentrt {
namespace {

namespace fs = std::filesystem;

using Base = testing::TempDir;

mode_t ModeOf(const std::string& path) {
  struct stat st {};
  REQUIRE(::stat(path.c_str(), &st) == 0);
  return st.st_mode & 0777;
}

TEST_CASE("a run directory is made with its folders, secrets/ readable by its owner only") {
  Base base;
  const auto t = std::chrono::system_clock::from_time_t(1764464671);  // 2025-11-30 01:04:31 UTC
  auto dir = RunDir::Create(base.path + "/runs", "demo", t);
  REQUIRE(dir.ok());
  CHECK(dir->path() == base.path + "/runs/demo-20251130T010431Z");
  for (const char* sub : {"logs", "checkpoints", "agents"})
    CHECK(fs::is_directory(dir->path() + "/" + sub));
  CHECK(ModeOf(dir->SecretsDir()) == 0700);
  auto again = RunDir::Create(base.path + "/runs", "demo", t);
  REQUIRE(again.ok());
  CHECK(again->path() == base.path + "/runs/demo-20251130T010431Z-1");
  CHECK_FALSE(RunDir::Create(base.path, "a/b", t).ok());
}

TEST_CASE("paths of the plan are relative to the run directory") {
  const RunDir dir("/r/run-1");
  CHECK(RunDir::RelativeCheckpointDir("prey") == "checkpoints/prey");
  CHECK(dir.CheckpointDir("prey") == "/r/run-1/checkpoints/prey");
  CHECK(dir.Resolve("checkpoints/prey") == "/r/run-1/checkpoints/prey");
  CHECK(dir.Resolve("/shared/ckpt/prey") == "/shared/ckpt/prey");
  CHECK(dir.TokenPath("prey") == "/r/run-1/secrets/prey.token");
  CHECK(dir.WorkDir("prey") == "/r/run-1/agents/prey");
}

TEST_CASE("the run secret is created once, 0600, and read back; a readable one is refused") {
  Base base;
  const RunDir dir(base.path);
  auto made = dir.LoadOrCreateSecret();
  REQUIRE(made.ok());
  CHECK(made->size() == 32);
  CHECK(ModeOf(dir.SecretPath()) == 0600);
  auto again = dir.LoadOrCreateSecret();  // a requeued run keeps its credentials
  REQUIRE(again.ok());
  CHECK(*again == *made);
  auto fresh = dir.CreateSecret();
  REQUIRE(fresh.ok());
  CHECK(*fresh != *made);
  ::chmod(dir.SecretPath().c_str(), 0640);
  auto refused = dir.ReadSecret();
  REQUIRE_FALSE(refused.ok());
  CHECK(refused.status().code() == StatusCode::kPermissionDenied);
  CHECK_THAT(refused.status().message(), Catch::Contains("chmod 600"));
}

TEST_CASE("a run's controller holds its lock; a dead one's pid is never taken for live") {
  Base base;
  const RunDir dir(base.path);
  REQUIRE(WriteFileAtomic(dir.ControllerPidPath(), std::to_string(::getpid()) + "\n").ok());
  CHECK_FALSE(ControllerRunning(dir.path()));
  CHECK(LiveControllerPid(dir.path()) == 0);  // a pid file alone proves nothing
  {
    auto lock = ControllerLock::Acquire(dir);
    REQUIRE(lock.ok());
    CHECK(ControllerRunning(dir.path()));
    CHECK(LiveControllerPid(dir.path()) == ::getpid());
    auto second = ControllerLock::Acquire(dir);  // a second controller of the run
    REQUIRE_FALSE(second.ok());
    CHECK(second.status().code() == StatusCode::kFailedPrecondition);
    CHECK_THAT(second.status().message(), Catch::Contains(std::to_string(::getpid())));
  }
  CHECK_FALSE(ControllerRunning(dir.path()));
  // Held by a process that is killed: gone with it.
  int ready[2];
  REQUIRE(::pipe(ready) == 0);
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    auto held = ControllerLock::Acquire(dir);
    if (!held.ok()) ::_exit(1);
    (void)!::write(ready[1], "x", 1);
    ::pause();
    ::_exit(0);
  }
  char c = 0;
  REQUIRE(::read(ready[0], &c, 1) == 1);
  CHECK(ControllerRunning(dir.path()));
  REQUIRE(::kill(child, SIGKILL) == 0);
  int status = 0;
  REQUIRE(::waitpid(child, &status, 0) == child);
  CHECK_FALSE(ControllerRunning(dir.path()));
  ::close(ready[0]);
  ::close(ready[1]);
}

TEST_CASE("an atomic write leaves the old file or the new one, never a temporary") {
  Base base;
  const std::string path = base.path + "/f.json";
  REQUIRE(WriteFileAtomic(path, "one").ok());
  REQUIRE(WriteFileAtomic(path, "two", {.mode = 0600, .sync_dir = true}).ok());
  CHECK(ReadWholeFile(path).value() == "two");
  CHECK(ModeOf(path) == 0600);
  int files = 0;
  for (const auto& e : fs::directory_iterator(base.path)) files += e.is_regular_file();
  CHECK(files == 1);
  CHECK(ReadWholeFile(base.path + "/missing").status().code() == StatusCode::kNotFound);
  CHECK(ReadWholeFile(path, 2).status().code() == StatusCode::kDataLoss);
  CHECK_FALSE(WriteFileAtomic(base.path + "/no/such/dir/f", "x").ok());
}

TEST_CASE("an agent's preflight result has one spelling") {
  CHECK(PreflightFile("/runs/x/agents/prey") == "/runs/x/agents/prey/preflight.json");
}

}  // namespace
}  // namespace agentrt
