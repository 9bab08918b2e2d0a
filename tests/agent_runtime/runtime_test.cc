#include "agent_runtime/runtime.h"

#include <signal.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <filesystem>
#include <future>
#include <map>
#include <string>
#include <thread>

#include "plan/fence.h"
#include "tests/common/temp_dir.h"
#include "tests/plan/plan_test_util.h"

namespace agentrt {
namespace {

namespace fs = std::filesystem;
using std::chrono::milliseconds;

using testing::TempDir;

AgentEnv TestEnv(const TempDir& dir, const std::string& telemetry) {
  AgentEnv a;
  a.run_dir = dir.path;
  a.agent = "prey-0";
  a.ckpt_dir = dir.path + "/checkpoints/prey-0";
  a.telemetry = telemetry;
  a.restart_count = 1;
  return a;
}

Plan OnePlan(double interval_s = 1800, int keep_last = 3) {
  Plan plan = testing::TestPlan("t", std::vector<std::string>{"prey-0"});
  plan.agents[0].checkpoint.interval_s = interval_s;
  plan.agents[0].checkpoint.keep_last = keep_last;
  return plan;
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

// A runtime (no signal handlers) whose telemetry goes to a receiver of the test's own.
struct Reporting {
  std::unique_ptr<TelemetryReceiver> receiver;
  std::unique_ptr<Runtime> rt;  // after the receiver: destroyed first
  Reporting(const TempDir& dir, milliseconds heartbeat_period) {
    auto r = TelemetryReceiver::Bind("ipc://" + dir.path + "/telemetry.sock");
    REQUIRE(r.ok());
    receiver = std::move(r).value();
    RuntimeOptions options;
    options.heartbeat_period = heartbeat_period;
    options.install_signal_handlers = false;
    auto created = Runtime::Create(TestEnv(dir, receiver->endpoint()), OnePlan(), options);
    REQUIRE(created.ok());
    rt = std::move(created).value();
  }
};

TEST_CASE("a runtime says hello, heartbeats, reports metrics and checkpoints, and says bye") {
  TempDir dir;
  Reporting t(dir, milliseconds(20));
  auto& receiver = t.receiver;
  auto& rt = t.rt;
  rt->Report(5, {{"reward", 1.5}});
  CheckpointState state;
  int64_t step = 5;
  state.AddBytes("step", &step, sizeof step);
  REQUIRE(rt->checkpointer().Save(5, state).ok());

  auto all = ReceiveUntil(*receiver, [](const auto& got) {
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
  CHECK(rt->telemetry_dropped() == 0);

  rt.reset();
  auto rest =
      ReceiveUntil(*receiver, [](const auto& got) { return Count(got, TelemetryType::kBye) >= 1; });
  CHECK(Count(rest, TelemetryType::kBye) == 1);
}

TEST_CASE("a rank that reports more often than it heartbeats sends no heartbeats meanwhile") {
  TempDir dir;
  Reporting t(dir, milliseconds(200));
  auto& receiver = t.receiver;
  auto& rt = t.rt;
  const uint64_t at_start = rt->heartbeats_sent();  // the first goes out at once
  // A report every 10 ms for 1.2 s: six heartbeat periods with reports in each.
  const auto until = std::chrono::steady_clock::now() + milliseconds(1200);
  int step = 0;
  while (std::chrono::steady_clock::now() < until) {
    rt->Report(++step, {{"loss", 1.0 / step}});
    std::this_thread::sleep_for(milliseconds(10));
  }
  // Six or seven without the rule; a tick may beat the first report, and a
  // loaded machine may hold one sleep past a period.
  CHECK(rt->heartbeats_sent() <= at_start + 2);
  auto all = ReceiveUntil(*receiver, [&](const auto& got) {
    return Count(got, TelemetryType::kMetrics) >= static_cast<size_t>(step);
  });
  CHECK(Count(all, TelemetryType::kMetrics) == static_cast<size_t>(step));
  // Reports stop: heartbeats come again, carrying the last step.
  auto later = ReceiveUntil(
      *receiver, [](const auto& got) { return Count(got, TelemetryType::kHeartbeat) >= 2; });
  REQUIRE(Count(later, TelemetryType::kHeartbeat) >= 2);
  CHECK(later.back().step == step);
}

TEST_CASE("a rank takes the fence's id at start; once superseded, it can no longer checkpoint") {
  TempDir dir;
  auto receiver = TelemetryReceiver::Bind("ipc://" + dir.path + "/telemetry.sock");
  REQUIRE(receiver.ok());
  const AgentEnv env = TestEnv(dir, (*receiver)->endpoint());
  std::filesystem::create_directories(env.ckpt_dir);
  REQUIRE(WriteCheckpointFence(env.ckpt_dir, "1.aaaa").ok());  // what the launcher wrote
  RuntimeOptions options;
  options.install_signal_handlers = false;
  auto rt = Runtime::Create(env, OnePlan(), options);
  REQUIRE(rt.ok());
  CheckpointState state;
  int64_t step = 5;
  state.AddBytes("step", &step, sizeof step);
  REQUIRE((*rt)->checkpointer().Save(5, state).ok());
  // The controller relaunched the agent elsewhere (a partition): this rank is fenced off.
  REQUIRE(WriteCheckpointFence(env.ckpt_dir, "2.bbbb").ok());
  const Status fenced = (*rt)->checkpointer().Save(6, state);
  REQUIRE_FALSE(fenced.ok());
  CHECK_THAT(fenced.message(), Catch::Contains("fenced") && Catch::Contains("1.aaaa"));
  CHECK_FALSE(std::filesystem::exists(env.ckpt_dir + "/step-6"));
}

TEST_CASE("Report never blocks when nobody receives telemetry; drops are counted") {
  TempDir dir;
  RuntimeOptions options;
  options.install_signal_handlers = false;
  options.telemetry.send_high_water_mark = 8;
  options.telemetry.linger = milliseconds(0);
  auto rt = Runtime::Create(TestEnv(dir, "ipc://" + dir.path + "/nobody.sock"), OnePlan(), options);
  REQUIRE(rt.ok());
  auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < 2000; ++i) (*rt)->Report(i, {{"loss", 0.1}});
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(5));
  CHECK((*rt)->telemetry_dropped() >= 1900);
}

TEST_CASE("the plan's checkpoint.snapshot reaches the checkpointer; copy is the default") {
  TempDir dir;
  RuntimeOptions options;
  options.install_signal_handlers = false;
  auto copying = Runtime::Create(TestEnv(dir, ""), OnePlan(), options);
  REQUIRE(copying.ok());
  CHECK((*copying)->checkpointer().options().snapshot == CheckpointOptions::Snapshot::kCopy);
  copying->reset();
  Plan plan = OnePlan();
  plan.agents[0].checkpoint.snapshot = "fork";
  auto forking = Runtime::Create(TestEnv(dir, ""), plan, options);
  REQUIRE(forking.ok());
  CHECK((*forking)->checkpointer().options().snapshot == CheckpointOptions::Snapshot::kFork);
}

TEST_CASE("SIGUSR2 asks for a checkpoint; SIGTERM asks for a checkpoint and a stop") {
  TempDir dir;
  RuntimeOptions options;
  options.checkpoint.interval_s = 0;  // no timer: only the signals trigger
  auto rt_or = Runtime::Create(TestEnv(dir, ""), OnePlan(), options);
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
  auto first = Runtime::Create(TestEnv(dir, ""), OnePlan());
  REQUIRE(first.ok());
  auto second = Runtime::Create(TestEnv(dir, ""), OnePlan());
  REQUIRE_FALSE(second.ok());
  CHECK(second.status().message().find("already installed") != std::string::npos);
  first->reset();
  CHECK(Runtime::Create(TestEnv(dir, ""), OnePlan()).ok());
}

TEST_CASE("the checkpoint policy comes from the agent's entry in the plan") {
  TempDir dir;
  RuntimeOptions options;
  options.install_signal_handlers = false;
  ManualClock clock;
  options.clock = &clock;
  auto rt = Runtime::Create(TestEnv(dir, ""), OnePlan(/*interval_s=*/2, /*keep_last=*/2), options);
  REQUIRE(rt.ok());
  Checkpointer& ckpt = (*rt)->checkpointer();
  CHECK_FALSE(ckpt.SaveDue());
  clock.AdvanceSeconds(2.5);
  CHECK(ckpt.SaveDue());  // the plan's 2 s, not the 1800 s default
  CheckpointState state;
  int64_t step = 0;
  state.AddBytes("step", &step, sizeof step);
  for (step = 1; step <= 3; ++step) REQUIRE(ckpt.Save(step, state).ok());
  int kept = 0;
  for (const auto& e : fs::directory_iterator(dir.path + "/checkpoints/prey-0")) {
    kept += e.path().filename().string().rfind("step-", 0) == 0;
  }
  CHECK(kept == 2);  // keep_last from the plan
  CHECK((*rt)->agent_plan().name == "prey-0");
  CHECK((*rt)->args().is_object());
}

TEST_CASE("a runtime refuses a plan without its agent, or with another rank count") {
  TempDir dir;
  RuntimeOptions options;
  options.install_signal_handlers = false;
  AgentEnv env = TestEnv(dir, "");
  env.agent = "wolf";
  auto missing = Runtime::Create(env, OnePlan(), options);
  REQUIRE_FALSE(missing.ok());
  CHECK_THAT(missing.status().message(), Catch::Contains("no agent named 'wolf'"));
  env = TestEnv(dir, "");
  env.world_size = 2;
  auto ranks = Runtime::Create(env, OnePlan(), options);
  REQUIRE_FALSE(ranks.ok());
  CHECK_THAT(ranks.status().message(), Catch::Contains("WORLD_SIZE is 2"));
}

TEST_CASE("the runtime's group follows the plan's backend; a run without a bus says so") {
  TempDir dir;
  RuntimeOptions options;
  options.install_signal_handlers = false;
  auto rt = Runtime::Create(TestEnv(dir, ""), OnePlan(), options);
  REQUIRE(rt.ok());
  auto group = (*rt)->group();
  REQUIRE(group.ok());
  CHECK((*group)->backend() == "single");
  CHECK((*group)->size() == 1);
  CHECK(*(*rt)->group() == *group);  // made once
  auto bus = (*rt)->bus();
  REQUIRE_FALSE(bus.ok());
  CHECK_THAT(bus.status().message(), Catch::Contains("AGENTRT_BUS is not set"));
}

}  // namespace
}  // namespace agentrt
