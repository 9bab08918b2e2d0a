#include "agent_runtime/runtime.h"
#include "tests/agent_runtime/temp_dir.h"

#include <signal.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <filesystem>
#include <future>
#include <map>
#include <string>
#include <thread>

namespace agentrt {
namespace {

namespace fs = std::filesystem;
using std::chrono::milliseconds;

struct TempDir : testing::TempDir {
  TempDir() : testing::TempDir("agentrt-rt") {}
};

using Env = std::map<std::string, std::string>;

Env FullEnv() {
  return {{"AGENTRT_RUN_DIR", "/runs/demo-1"},
          {"AGENTRT_AGENT", "predator-1"},
          {"AGENTRT_AGENT_INDEX", "3"},
          {"RANK", "1"},
          {"WORLD_SIZE", "2"},
          {"LOCAL_RANK", "1"},
          {"LOCAL_WORLD_SIZE", "2"},
          {"MASTER_ADDR", "node01"},
          {"MASTER_PORT", "20017"},
          {"CUDA_VISIBLE_DEVICES", "2,3"},
          {"AGENTRT_PORTS", "20016-20031"},
          {"AGENTRT_CKPT_DIR", "/runs/demo-1/checkpoints/predator-1"},
          {"AGENTRT_BUS", "node01:20000"},
          {"AGENTRT_TOKEN_FILE", "/runs/demo-1/secrets/predator-1.token"},
          {"AGENTRT_TELEMETRY", "ipc:///runs/demo-1/telemetry.sock"},
          {"AGENTRT_RESTART_COUNT", "2"}};
}

Result<Assignment> Parse(const Env& env) {
  return AssignmentFromEnvironment([&env](const char* name) -> const char* {
    auto it = env.find(name);
    return it == env.end() ? nullptr : it->second.c_str();
  });
}

TEST_CASE("the assignment is read from the DESIGN §4 environment variables") {
  auto a = Parse(FullEnv());
  REQUIRE(a.ok());
  CHECK(a->run_dir == "/runs/demo-1");
  CHECK(a->agent == "predator-1");
  CHECK(a->agent_index == 3);
  CHECK(a->rank == 1);
  CHECK(a->world_size == 2);
  CHECK(a->local_rank == 1);
  CHECK(a->local_world_size == 2);
  CHECK(a->master_addr == "node01");
  CHECK(a->master_port == 20017);
  CHECK(a->ports_first == 20016);
  CHECK(a->ports_last == 20031);
  CHECK(a->visible_gpus == std::vector<int>{2, 3});
  CHECK(a->ckpt_dir == "/runs/demo-1/checkpoints/predator-1");
  CHECK(a->bus == "node01:20000");
  CHECK(a->token_file == "/runs/demo-1/secrets/predator-1.token");
  CHECK(a->telemetry == "ipc:///runs/demo-1/telemetry.sock");
  CHECK(a->restart_count == 2);
}

TEST_CASE("a missing variable is named, with a hint that agentctl run sets it") {
  for (const char* name :
       {"AGENTRT_RUN_DIR", "AGENTRT_AGENT", "AGENTRT_CKPT_DIR", "RANK", "WORLD_SIZE"}) {
    Env env = FullEnv();
    env.erase(name);
    auto a = Parse(env);
    REQUIRE_FALSE(a.ok());
    CHECK(a.status().message().find(std::string("environment variable ") + name + " is not set") !=
          std::string::npos);
    CHECK(a.status().message().find("agentctl run") != std::string::npos);
  }
}

TEST_CASE("malformed numbers and ranges in the environment are rejected by name") {
  Env env = FullEnv();
  env["MASTER_PORT"] = "20x";
  auto a = Parse(env);
  REQUIRE_FALSE(a.ok());
  CHECK(a.status().message().find("MASTER_PORT=\"20x\"") != std::string::npos);
  env = FullEnv();
  env["AGENTRT_PORTS"] = "20031-20016";
  CHECK_FALSE(Parse(env).ok());
  env = FullEnv();
  env["RANK"] = "2";
  auto b = Parse(env);
  REQUIRE_FALSE(b.ok());
  CHECK(b.status().message().find("outside WORLD_SIZE=2") != std::string::npos);
}

TEST_CASE("under mpirun the rank comes from Open MPI's variables; CPU agents see no GPU") {
  Env env = FullEnv();
  env.erase("RANK");
  env.erase("WORLD_SIZE");
  env.erase("LOCAL_RANK");
  env.erase("LOCAL_WORLD_SIZE");
  env["OMPI_COMM_WORLD_RANK"] = "3";
  env["OMPI_COMM_WORLD_SIZE"] = "4";
  env["OMPI_COMM_WORLD_LOCAL_RANK"] = "3";
  env["CUDA_VISIBLE_DEVICES"] = "";
  auto a = Parse(env);
  REQUIRE(a.ok());
  CHECK(a->rank == 3);
  CHECK(a->world_size == 4);
  CHECK(a->local_rank == 3);
  CHECK(a->visible_gpus.empty());
}

Assignment TestAssignment(const TempDir& dir, const std::string& telemetry) {
  Assignment a;
  a.run_dir = dir.path;
  a.agent = "prey-0";
  a.ckpt_dir = dir.path + "/checkpoints/prey-0";
  a.telemetry = telemetry;
  a.restart_count = 1;
  return a;
}

// Polls until `pred` holds over the messages received so far, or 10 s pass.
template <typename Pred>
std::vector<TelemetryMessage> ReceiveUntil(TelemetryReceiver& receiver, Pred pred) {
  std::vector<TelemetryMessage> all;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!pred(all) && std::chrono::steady_clock::now() < deadline) {
    auto got = receiver.Poll(milliseconds(50));
    REQUIRE(got.ok());
    for (auto& m : *got) all.push_back(std::move(m));
  }
  return all;
}

size_t Count(const std::vector<TelemetryMessage>& all, TelemetryType type) {
  return static_cast<size_t>(
      std::count_if(all.begin(), all.end(), [type](const auto& m) { return m.type == type; }));
}

TEST_CASE("a runtime says hello, heartbeats, reports metrics and checkpoints, and says bye") {
  TempDir dir;
  auto receiver = TelemetryReceiver::Bind("ipc://" + dir.path + "/telemetry.sock");
  REQUIRE(receiver.ok());
  RuntimeOptions options;
  options.heartbeat_period = milliseconds(20);
  options.install_signal_handlers = false;
  auto rt = Runtime::Create(TestAssignment(dir, (*receiver)->endpoint()), options);
  REQUIRE(rt.ok());
  (*rt)->Report(5, {{"reward", 1.5}});
  CheckpointState state;
  int64_t step = 5;
  state.AddBytes("step", &step, sizeof step);
  REQUIRE((*rt)->checkpointer().Save(5, state).ok());

  auto all = ReceiveUntil(**receiver, [](const auto& got) {
    return Count(got, TelemetryType::kHeartbeat) >= 3 &&
           Count(got, TelemetryType::kCheckpoint) >= 1 && Count(got, TelemetryType::kMetrics) >= 1;
  });
  REQUIRE(!all.empty());
  CHECK(all.front().type == TelemetryType::kHello);
  CHECK(all.front().agent == "prey-0");
  CHECK(all.front().pid == ::getpid());
  CHECK(all.front().restart_count == 1);
  CHECK(Count(all, TelemetryType::kHeartbeat) >= 3);
  auto metrics = std::find_if(all.begin(), all.end(),
                              [](const auto& m) { return m.type == TelemetryType::kMetrics; });
  REQUIRE(metrics != all.end());
  CHECK(metrics->step == 5);
  CHECK(metrics->metrics["reward"].get<double>() == 1.5);
  auto ckpt = std::find_if(all.begin(), all.end(),
                           [](const auto& m) { return m.type == TelemetryType::kCheckpoint; });
  REQUIRE(ckpt != all.end());
  CHECK(ckpt->checkpoint_step == 5);
  // Heartbeats after Report carry the reported step.
  CHECK(all.back().step == 5);
  CHECK((*rt)->telemetry_dropped() == 0);

  rt->reset();
  auto rest = ReceiveUntil(**receiver,
                           [](const auto& got) { return Count(got, TelemetryType::kBye) >= 1; });
  CHECK(Count(rest, TelemetryType::kBye) == 1);
}

TEST_CASE("Report never blocks when nobody receives telemetry; drops are counted") {
  TempDir dir;
  RuntimeOptions options;
  options.install_signal_handlers = false;
  options.telemetry.send_high_water_mark = 8;
  options.telemetry.linger = milliseconds(0);
  auto rt = Runtime::Create(TestAssignment(dir, "ipc://" + dir.path + "/nobody.sock"), options);
  REQUIRE(rt.ok());
  auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < 2000; ++i) (*rt)->Report(i, {{"loss", 0.1}});
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(5));
  CHECK((*rt)->telemetry_dropped() >= 1900);
}

TEST_CASE("SIGUSR2 asks for a checkpoint; SIGTERM asks for a checkpoint and a stop") {
  TempDir dir;
  RuntimeOptions options;
  options.checkpoint.interval_s = 0;  // no timer: only the signals trigger
  auto rt_or = Runtime::Create(TestAssignment(dir, ""), options);
  REQUIRE(rt_or.ok());
  Runtime& rt = **rt_or;
  std::promise<std::string> stopped;
  rt.OnStop([&stopped](std::string_view reason) { stopped.set_value(std::string(reason)); });
  CHECK_FALSE(rt.checkpointer().SaveDue());

  REQUIRE(::kill(::getpid(), SIGUSR2) == 0);
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!rt.checkpointer().SaveDue() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(milliseconds(5));
  }
  CHECK(rt.checkpointer().SaveDue());
  CHECK_FALSE(rt.ShouldStop());

  REQUIRE(::kill(::getpid(), SIGTERM) == 0);
  auto reason = stopped.get_future();
  REQUIRE(reason.wait_for(std::chrono::seconds(10)) == std::future_status::ready);
  CHECK(reason.get() == "SIGTERM");
  CHECK(rt.ShouldStop());
  CHECK(rt.stop_reason() == "SIGTERM");
  // A callback added after the stop runs at once.
  bool late = false;
  rt.OnStop([&late](std::string_view) { late = true; });
  CHECK(late);
}

TEST_CASE("only one runtime per process may own the signal handlers") {
  TempDir dir;
  auto first = Runtime::Create(TestAssignment(dir, ""));
  REQUIRE(first.ok());
  auto second = Runtime::Create(TestAssignment(dir, ""));
  REQUIRE_FALSE(second.ok());
  CHECK(second.status().message().find("already installed") != std::string::npos);
  first->reset();
  CHECK(Runtime::Create(TestAssignment(dir, "")).ok());
}

}  // namespace
}  // namespace agentrt
