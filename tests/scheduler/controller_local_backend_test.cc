// The local backend on real processes: fork/exec into a process group, the
// agent environment, logs per rank, exits, group signals, port probing.
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "plan/port_lease.h"
#include "scheduler/local_backend.h"
#include "tests/common/temp_dir.h"

namespace agentrt {
namespace {
namespace fs = std::filesystem;

using testing::TempDir;

std::string Slurp(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Polls the backend until `n` exits arrived (at most 10 s).
std::vector<AgentProcessExit> WaitExits(LaunchBackend& backend, size_t n) {
  std::vector<AgentProcessExit> all;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (all.size() < n && std::chrono::steady_clock::now() < deadline) {
    for (auto& e : backend.PollExits()) all.push_back(e);
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return all;
}

// A socket listening on 0.0.0.0:<port>, or -1.
int Listen(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_ANY);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 || ::listen(fd, 1) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// A free port block of `n` ports in the ephemeral-ish range (probed).
int FreeBlock(int n) {
  for (int first = 31000 + (::getpid() % 500) * 20; first < 60000; first += 97) {
    bool ok = true;
    for (int p = first; p < first + n && ok; ++p) {
      const int fd = Listen(p);
      ok = fd >= 0;
      if (fd >= 0) ::close(fd);
    }
    if (ok) return first;
  }
  return -1;
}

AgentLaunch ShellAgent(const TempDir& dir, const std::string& script, int ranks) {
  AgentLaunch a;
  a.name = "sh-agent";
  a.index = 3;
  for (int r = 0; r < ranks; ++r) a.ranks.push_back({r, r, ranks, "localhost", {}});
  a.command = {"sh", "-c", script};
  a.env = {{"MY_SETTING", "on"}};
  a.ports_first = FreeBlock(4);
  a.ports_last = a.ports_first + 3;
  a.master_port = a.ports_first;
  a.run_dir = dir.path;
  a.checkpoint_dir = dir.Path("checkpoints/" + a.name);
  a.log_dir = dir.Path("logs/" + a.name);
  a.bus_address = "127.0.0.1:1";
  a.token_file = dir.Path("secrets/sh-agent.token");
  a.telemetry_endpoint = "ipc:///nowhere";
  a.restart_count = 2;
  return a;
}

}  // namespace

TEST_CASE("local backend starts each rank with exactly the contract variables and logs per rank") {
  TempDir dir;
  auto backend = MakeLocalBackend(MakePosixSpawner(), {});
  auto agent = ShellAgent(dir, "env; echo to-stderr >&2", 2);
  ::setenv("AGENTRT_STALE", "leak", 1);  // an inherited AGENTRT_* variable must not pass through
  ::setenv("RANK", "77", 1);
  auto launched = backend->Launch(agent);
  ::unsetenv("AGENTRT_STALE");
  ::unsetenv("RANK");
  REQUIRE(launched.ok());
  REQUIRE(launched->ranks.size() == 2);
  CHECK(launched->process_group == launched->ranks[0].pid);
  CHECK(launched->master_port == agent.ports_first);
  auto exits = WaitExits(*backend, 2);
  REQUIRE(exits.size() == 2);
  for (const auto& e : exits) CHECK(e.success());
  for (int r = 0; r < 2; ++r) {
    const std::string log = Slurp(fs::path(agent.log_dir) / ("rank" + std::to_string(r) + ".log"));
    CHECK(log.find("RANK=" + std::to_string(r) + "\n") != std::string::npos);
    CHECK(log.find("LOCAL_RANK=" + std::to_string(r) + "\n") != std::string::npos);
    CHECK(log.find("WORLD_SIZE=2\n") != std::string::npos);
    CHECK(log.find("AGENTRT_AGENT=sh-agent\n") != std::string::npos);
    CHECK(log.find("AGENTRT_AGENT_INDEX=3\n") != std::string::npos);
    CHECK(log.find("AGENTRT_RESTART_COUNT=2\n") != std::string::npos);
    CHECK(log.find("MASTER_PORT=" + std::to_string(agent.ports_first) + "\n") != std::string::npos);
    CHECK(log.find("AGENTRT_PORTS=" + std::to_string(agent.ports_first) + "-" +
                   std::to_string(agent.ports_last)) != std::string::npos);
    CHECK(log.find("CUDA_VISIBLE_DEVICES=\n") != std::string::npos);
    CHECK(log.find("MY_SETTING=on\n") != std::string::npos);
    CHECK(log.find("AGENTRT_STALE") == std::string::npos);
    CHECK(log.find("RANK=77") == std::string::npos);
    CHECK(log.find("to-stderr") != std::string::npos);
  }
  CHECK(fs::is_directory(agent.checkpoint_dir));
}

TEST_CASE("GPU ranks see exactly their agent's GPUs") {
  AgentLaunch a;
  a.name = "g";
  a.ranks = {{0, 0, 2, "n", {4, 5}}, {1, 1, 2, "n", {4, 5}}};
  const auto env = BuildRankEnvironment(a, 1, 20000, {"PATH=/bin", "CUDA_VISIBLE_DEVICES=0,1,2"});
  CHECK(std::count(env.begin(), env.end(), "CUDA_VISIBLE_DEVICES=4,5") == 1);
  CHECK(std::count(env.begin(), env.end(), "RANK=1") == 1);
  CHECK(std::count(env.begin(), env.end(), "PATH=/bin") == 1);
  const auto mpirun_env = BuildRankEnvironment(a, -1, 20000, {});
  for (const auto& e : mpirun_env) CHECK(e.rfind("RANK=", 0) != 0);
}

TEST_CASE(
    "signalling an agent reaches every process of its group, and exits are reported per rank") {
  TempDir dir;
  auto backend = MakeLocalBackend(MakePosixSpawner(), {});
  // Each rank also starts a grandchild in the same group: the signal must reach it too.
  auto agent = ShellAgent(dir, "sleep 30 & exec sleep 30", 2);
  auto launched = backend->Launch(agent);
  REQUIRE(launched.ok());
  const pid_t pgid = launched->process_group;
  REQUIRE(::getpgid(launched->ranks[1].pid) == pgid);
  REQUIRE(backend->Signal("sh-agent", SIGTERM).ok());
  auto exits = WaitExits(*backend, 2);
  REQUIRE(exits.size() == 2);
  for (const auto& e : exits) {
    CHECK(e.term_signal == SIGTERM);
    CHECK(e.agent == "sh-agent");
    CHECK(e.Describe().find("signal 15") != std::string::npos);
  }
  // The backgrounded sleeps of the group are gone too (bounded wait).
  bool gone = false;
  for (int i = 0; i < 200 && !gone; ++i) {
    gone = ::kill(-pgid, 0) != 0;
    if (!gone) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  CHECK(gone);
}

TEST_CASE("a non-zero exit is reported with its code") {
  TempDir dir;
  auto backend = MakeLocalBackend(MakePosixSpawner(), {});
  auto launched = backend->Launch(ShellAgent(dir, "exit 7", 1));
  REQUIRE(launched.ok());
  auto exits = WaitExits(*backend, 1);
  REQUIRE(exits.size() == 1);
  CHECK(exits[0].exit_code == 7);
  CHECK(exits[0].rank == 0);
  CHECK_FALSE(exits[0].success());
}

TEST_CASE("a missing program is a clear launch error and leaves no process") {
  TempDir dir;
  auto backend = MakeLocalBackend(MakePosixSpawner(), {});
  auto agent = ShellAgent(dir, "", 2);
  agent.command = {"agentrt-no-such-program-xyz"};
  auto launched = backend->Launch(agent);
  REQUIRE_FALSE(launched.ok());
  CHECK(launched.status().code() == StatusCode::kNotFound);
  CHECK(launched.status().message().find("agentrt-no-such-program-xyz") != std::string::npos);
  CHECK(launched.status().message().find("sh-agent") != std::string::npos);
  CHECK(backend->PollExits().empty());
}

TEST_CASE("MASTER_PORT skips a port taken by a foreign process but never leaves the block") {
  const int first = FreeBlock(3);
  REQUIRE(first > 0);
  const int taken = Listen(first);
  REQUIRE(taken >= 0);
  auto port = PickFreePort("a", first, first, first + 2);
  REQUIRE(port.ok());
  CHECK(*port == first + 1);
  const int taken2 = Listen(first + 1);
  const int taken3 = Listen(first + 2);
  REQUIRE(taken2 >= 0);
  REQUIRE(taken3 >= 0);
  auto none = PickFreePort("predator-0", first, first, first + 2);
  REQUIRE_FALSE(none.ok());
  CHECK(none.status().code() == StatusCode::kResourceExhausted);
  CHECK(none.status().message().find("predator-0") != std::string::npos);
  CHECK(none.status().message().find(std::to_string(first) + "-" + std::to_string(first + 2)) !=
        std::string::npos);
  for (int fd : {taken, taken2, taken3}) ::close(fd);
}

TEST_CASE("executables are found in PATH, then in the fallback directories") {
  CHECK(*ResolveExecutable("sh", "/usr/bin:/bin", {}) != "");
  auto missing = ResolveExecutable("agentrt-nope", "/usr/bin", {"/opt/x"});
  REQUIRE_FALSE(missing.ok());
  CHECK(missing.status().message().find("/opt/x") != std::string::npos);
  CHECK(*ResolveExecutable("sh", "", {"/bin"}) == "/bin/sh");
}

}  // namespace agentrt
