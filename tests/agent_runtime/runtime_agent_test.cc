// The test agent as a real process: telemetry over a real ZeroMQ socket, real
// signals, checkpoints on disk, resume after a restart.
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "comms/telemetry.h"
#include "tests/common/programs.h"
#include "tests/common/temp_dir.h"
#include "tests/plan/plan_test_util.h"

namespace agentrt {
namespace {

namespace fs = std::filesystem;
using std::chrono::milliseconds;

using testing::TempDir;

std::string AgentBinary() { return testing::ProgramPath("agentrt-test-agent"); }

// Starts the test agent with the agent environment; stdout+stderr go to `log`.
pid_t StartAgent(const std::string& run_dir, const std::string& telemetry, const std::string& log,
                 std::vector<std::string> args, int restart_count = 0) {
  std::string bin = AgentBinary();
  // The runtime reads its agent's entry from the run's plan.
  REQUIRE(
      WriteRunPlan(testing::TestPlan("t", std::vector<std::string>{"counter-0"}), run_dir).ok());
  pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0600);
    ::dup2(fd, 1);
    ::dup2(fd, 2);
    ::setenv("AGENTRT_RUN_DIR", run_dir.c_str(), 1);
    ::setenv("AGENTRT_AGENT", "counter-0", 1);
    ::setenv("AGENTRT_AGENT_INDEX", "0", 1);
    ::setenv("RANK", "0", 1);
    ::setenv("WORLD_SIZE", "1", 1);
    ::setenv("AGENTRT_CKPT_DIR", (run_dir + "/checkpoints/counter-0").c_str(), 1);
    ::setenv("AGENTRT_TELEMETRY", telemetry.c_str(), 1);
    ::setenv("AGENTRT_RESTART_COUNT", std::to_string(restart_count).c_str(), 1);
    std::vector<char*> argv{bin.data()};
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    ::execv(bin.c_str(), argv.data());
    std::_Exit(127);
  }
  return pid;
}

// Waits up to 20 s for `pid` to exit; returns its wait status (kills it on timeout).
int WaitExit(pid_t pid) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  int status = 0;
  while (std::chrono::steady_clock::now() < deadline) {
    pid_t r = ::waitpid(pid, &status, WNOHANG);
    if (r == pid) return status;
    std::this_thread::sleep_for(milliseconds(10));
  }
  ::kill(pid, SIGKILL);
  ::waitpid(pid, &status, 0);
  FAIL("agent did not exit within 20 s");
  return status;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Receives telemetry until `pred(all)` or 20 s pass.
template <typename Pred>
void ReceiveUntil(TelemetryReceiver& receiver, std::vector<TelemetryMessage>& all, Pred pred) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (!pred(all) && std::chrono::steady_clock::now() < deadline) {
    auto got = receiver.Poll(milliseconds(50));
    REQUIRE(got.ok());
    for (auto& m : *got) all.push_back(std::move(m));
  }
}

int64_t LastCheckpoint(const std::vector<TelemetryMessage>& all) {
  int64_t last = -1;
  for (const auto& m : all) {
    if (m.type == TelemetryType::kCheckpoint) last = std::max(last, m.checkpoint_step);
  }
  return last;
}

TEST_CASE("the test agent refuses to run outside agentctl and names the missing variable") {
  TempDir dir;
  std::string log = dir.path + "/out.log";
  std::string bin = AgentBinary();
  pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    int fd = ::open(log.c_str(), O_WRONLY | O_CREAT, 0600);
    ::dup2(fd, 2);
    ::clearenv();
    ::execl(bin.c_str(), bin.c_str(), static_cast<char*>(nullptr));
    std::_Exit(127);
  }
  int status = WaitExit(pid);
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 2);
  CHECK(ReadFile(log).find("environment variable AGENTRT_RUN_DIR is not set") != std::string::npos);
}

TEST_CASE("SIGTERM makes the agent checkpoint before it exits, and a restart resumes from it") {
  TempDir dir;
  auto receiver = TelemetryReceiver::Bind("ipc://" + dir.path + "/telemetry.sock");
  REQUIRE(receiver.ok());
  const std::string endpoint = (*receiver)->endpoint();
  const std::string log = dir.path + "/agent.log";
  // Checkpoints every 0.2 s; heartbeats every 50 ms.
  std::vector<std::string> args = {"--forever", "--step-ms",      "5", "--ckpt-interval-s",
                                   "0.2",       "--heartbeat-ms", "50"};
  pid_t pid = StartAgent(dir.path, endpoint, log, args);
  std::vector<TelemetryMessage> all;
  ReceiveUntil(**receiver, all, [](const auto& got) { return LastCheckpoint(got) >= 0; });
  REQUIRE(LastCheckpoint(all) >= 0);
  CHECK(all.front().type == TelemetryType::kHello);
  CHECK(all.front().pid == pid);

  // SIGUSR2: an extra checkpoint, and the agent goes on.
  size_t before = all.size();
  int64_t ckpt_before = LastCheckpoint(all);
  REQUIRE(::kill(pid, SIGUSR2) == 0);
  ReceiveUntil(**receiver, all, [&](const auto& got) { return LastCheckpoint(got) > ckpt_before; });
  CHECK(LastCheckpoint(all) > ckpt_before);
  CHECK(all.size() > before);
  CHECK(::waitpid(pid, nullptr, WNOHANG) == 0);  // still running

  // SIGTERM: the stop request. The final step is committed before the process exits.
  REQUIRE(::kill(pid, SIGTERM) == 0);
  int status = WaitExit(pid);
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
  ReceiveUntil(**receiver, all, [](const auto& got) {
    return !got.empty() && got.back().type == TelemetryType::kBye;
  });
  REQUIRE(!all.empty());
  CHECK(all.back().type == TelemetryType::kBye);
  CHECK(all.back().reason == "SIGTERM");
  std::string out = ReadFile(log);
  INFO(out);
  auto pos = out.find("checkpointed step ");
  REQUIRE(pos != std::string::npos);
  int64_t final_step = std::strtoll(out.c_str() + pos + 18, nullptr, 10);
  CHECK(LastCheckpoint(all) == final_step);
  CHECK(fs::exists(dir.path + "/checkpoints/counter-0/step-" + std::to_string(final_step) +
                   "/manifest.json"));

  // The restarted agent continues from exactly that step.
  pid = StartAgent(
      dir.path, endpoint, log,
      {"--steps", std::to_string(final_step + 5), "--step-ms", "1", "--ckpt-interval-s", "10"}, 1);
  status = WaitExit(pid);
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
  out = ReadFile(log);
  CHECK(out.find("resumed from step " + std::to_string(final_step) + "\n") != std::string::npos);
  CHECK(out.find("done at step " + std::to_string(final_step + 5)) != std::string::npos);
}

TEST_CASE("the test agent exits with the requested code and dumps its environment") {
  TempDir dir;
  auto receiver = TelemetryReceiver::Bind("tcp://127.0.0.1:*");
  REQUIRE(receiver.ok());
  pid_t pid = StartAgent(dir.path, (*receiver)->endpoint(), dir.path + "/a.log",
                         {"--steps", "20", "--step-ms", "1", "--fail-at-step", "3", "--exit-code",
                          "7", "--dump-env", dir.path + "/env"});
  int status = WaitExit(pid);
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 7);
  std::ifstream in(dir.path + "/env/counter-0.rank0.json");
  REQUIRE(in.good());
  nlohmann::json j = nlohmann::json::parse(in);
  CHECK(j["env"]["AGENTRT_AGENT"] == "counter-0");
  CHECK(j["rank"] == 0);
  CHECK(j["argv"].size() == 11);
  CHECK(ReadFile(dir.path + "/a.log").find("failing at step 3 with exit code 7") !=
        std::string::npos);
}

}  // namespace
}  // namespace agentrt
