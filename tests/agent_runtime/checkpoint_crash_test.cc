// Crash consistency: SIGKILL at random moments of a save loop in a child process;
// after each kill, restore must return a fully verified checkpoint, never a torn
// one, and never none (nor an older one) once one had been committed.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <thread>

#include "agent_runtime/checkpointer.h"
#include "tests/agent_runtime/checkpoint_crash_pattern.h"

namespace agentrt {
namespace {

namespace fs = std::filesystem;

// Runs the helper, kills it with SIGKILL after `delay`, and returns the last step
// it reported committed (-1 if none).
// With `after_first_commit`, the delay starts when the helper reports its first
// commit of this run (so the kill lands inside the save loop, not in start-up).
int64_t RunAndKill(const std::string& helper, const std::string& dir,
                   std::chrono::microseconds delay, bool after_first_commit) {
  int fds[2];
  REQUIRE(::pipe2(fds, O_CLOEXEC) == 0);
  pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    ::dup2(fds[1], 1);
    ::execl(helper.c_str(), helper.c_str(), dir.c_str(), static_cast<char*>(nullptr));
    std::_Exit(127);
  }
  ::close(fds[1]);
  std::string out;
  char buf[4096];
  ssize_t n;
  if (after_first_commit) {
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (out.find("committed ") == std::string::npos &&
           std::chrono::steady_clock::now() < deadline) {
      pollfd pfd{fds[0], POLLIN, 0};
      if (::poll(&pfd, 1, 100) > 0) {
        n = ::read(fds[0], buf, sizeof buf);
        if (n <= 0) break;
        out.append(buf, static_cast<size_t>(n));
      }
    }
  }
  std::this_thread::sleep_for(delay);
  ::kill(pid, SIGKILL);
  int status = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);
  while ((n = ::read(fds[0], buf, sizeof buf)) > 0) out.append(buf, static_cast<size_t>(n));
  ::close(fds[0]);
  // The helper only ever ends by our SIGKILL; anything else is a helper failure.
  INFO("helper output: " << out);
  REQUIRE(WIFSIGNALED(status));
  REQUIRE(WTERMSIG(status) == SIGKILL);
  int64_t last = -1;
  size_t pos = 0;
  while ((pos = out.find("committed ", pos)) != std::string::npos) {
    pos += 10;
    last = std::strtoll(out.c_str() + pos, nullptr, 10);
  }
  return last;
}

void CheckShard(const ShardData& shard, int64_t step, int rank) {
  auto expected = testing::CrashPattern(step, rank);
  auto bytes = shard.Bytes("pattern");
  REQUIRE(bytes.size() == expected.size() * sizeof(uint64_t));
  REQUIRE(std::memcmp(bytes.data(), expected.data(), bytes.size()) == 0);
}

TEST_CASE("SIGKILL at random moments of a save loop never leaves a torn or missing checkpoint") {
  const char* helper = std::getenv("CHECKPOINT_CRASH_HELPER");
  REQUIRE(helper != nullptr);
  std::string tmpl = (fs::temp_directory_path() / "agentrt-crash-XXXXXX").string();
  REQUIRE(::mkdtemp(tmpl.data()) != nullptr);
  const std::string dir = tmpl + "/ckpt";

  std::mt19937 rng(12345);
  // A save takes tens of milliseconds on a slow disk (about eight fsyncs); the
  // delays span more than one save so kills land in every phase of it.
  std::uniform_int_distribution<int> delay_us(0, 120000);
  std::uniform_int_distribution<int> startup_delay_us(0, 30000);
  int64_t newest_known = -1;  // newest step known committed so far
  int kills_after_commit = 0;
  for (int i = 0; i < 100; ++i) {
    // One kill in ten lands during start-up (restore, cleanup, first save).
    bool in_loop = i % 10 != 5;
    auto delay = std::chrono::microseconds(in_loop ? delay_us(rng) : startup_delay_us(rng));
    int64_t reported = RunAndKill(helper, dir, delay, in_loop);
    if (reported >= 0) ++kills_after_commit;
    newest_known = std::max(newest_known, reported);

    CheckpointOptions o{.dir = dir, .agent = "crash", .rank = 0, .world_size = 2};
    auto c = Checkpointer::Create(o);
    REQUIRE(c.ok());
    auto r = (*c)->Restore();
    REQUIRE(r.ok());
    INFO("iteration " << i << ": " << r->Describe());
    // A checkpoint torn by the kill is never "committed": nothing is skipped as corrupt.
    CHECK(r->skipped.empty());
    if (newest_known < 0) {
      CHECK(r->kind != RestoreResult::Kind::kCorrupt);
      if (!r->restored()) continue;
    }
    REQUIRE(r->restored());
    REQUIRE(r->step >= newest_known);  // never older than what was committed
    newest_known = r->step;
    CHECK(r->metadata["step"] == r->step);
    CheckShard(r->shard, r->step, 0);
    auto other = (*c)->LoadShard(r->step, 1);
    REQUIRE(other.ok());
    CheckShard(*other, r->step, 1);
  }
  // The kills landed after real progress, not only during start-up.
  CHECK(kills_after_commit >= 90);
  CHECK(newest_known >= 90);
  fs::remove_all(tmpl);
}

}  // namespace
}  // namespace agentrt
