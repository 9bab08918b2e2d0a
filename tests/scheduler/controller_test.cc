// The supervision state machine (scheduler/run_controller.h), driven by a fake
// launch backend and a fake clock: every supervision transition without a
// process or a sleep.
#include <fmt/format.h>
#include <signal.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <set>

#include "agent_runtime/checkpointer.h"
#include "common/file_util.h"
#include "plan/agent_env.h"
#include "plan/rank_exec.h"
#include "plan/run_dir.h"
#include "scheduler/run_controller.h"
#include "scheduler/status.h"
#include "tests/common/temp_dir.h"
#include "tests/scheduler/fake_backend.h"

namespace agentrt {
namespace {

using testing::FakeBackend;

// A log folder of its own, removed at scope exit.
struct LogDir : testing::TempDir {
  LogDir() : testing::TempDir("agentrt-ctl") {}
  void Write(const std::string& name, const std::string& text) const {
    REQUIRE(WriteFileAtomic(Path(name), text).ok());
  }
  // What a rank prints: appended to its log, as every incarnation's output is.
  void Append(const std::string& name, const std::string& text) const {
    std::ofstream(Path(name), std::ios::app) << text;
  }
};

SupervisedAgent MakeAgent(const std::string& name, int ranks, int max_restarts = 2) {
  SupervisedAgent a;
  a.launch.name = name;
  for (int r = 0; r < ranks; ++r) a.launch.ranks.push_back({r, r, ranks, "localhost", {}});
  a.launch.command = {"agent"};
  a.launch.master_port = 20000;
  a.launch.log_dir = "/run/logs/" + name;
  a.restart.max_restarts = max_restarts;
  a.restart.backoff_s = 2;
  a.restart.heartbeat_timeout_s = 100;
  a.restart.grace_s = 3;
  return a;
}

// Two ranks under one mpirun, rank exit records in `log_dir` when not empty.
SupervisedAgent MpiAgent(const std::string& log_dir = "") {
  SupervisedAgent a = MakeAgent("m", 2);
  a.launch.use_mpirun = true;
  if (!log_dir.empty()) a.launch.log_dir = log_dir;
  return a;
}

TelemetryMessage Heartbeat(const std::string& agent, int rank, int restart_count = 0,
                           int64_t step = -1) {
  TelemetryMessage m;
  m.type = TelemetryType::kHeartbeat;
  m.agent = agent;
  m.rank = rank;
  m.restart_count = restart_count;
  m.step = step;
  return m;
}

struct Fixture {
  ManualClock clock;
  FakeBackend backend;
  std::unique_ptr<RunController> rc;
  std::string run_dir = "/run";  // set it (a temporary folder) when the test writes hang reports
  void Make(std::vector<SupervisedAgent> agents) {
    rc = std::make_unique<RunController>("test", run_dir, std::move(agents), &backend, &clock);
    rc->Start();
  }
  const AgentStatus& A(const std::string& name) { return *rc->status().FindAgent(name); }
  // Ranks 0..ranks-1 of `agent` close their runtime.
  void SayBye(const std::string& agent, int ranks) {
    for (int r = 0; r < ranks; ++r) {
      auto bye = Heartbeat(agent, r);
      bye.type = TelemetryType::kBye;
      rc->OnTelemetry(bye);
    }
  }
};

// A heartbeat's flight-recorder block, written as the JSON a rank sends.
CollectiveSnapshot Collective(const nlohmann::json& j) {
  auto s = CollectiveSnapshot::FromJson(j);
  REQUIRE(s.ok());
  return std::move(s).value();
}

}  // namespace

TEST_CASE("controller launches every agent and reports them running") {
  Fixture f;
  f.Make({MakeAgent("a", 2), MakeAgent("b", 1)});
  REQUIRE(f.backend.launches.size() == 2);
  CHECK(f.backend.launches[0].restart_count == 0);
  CHECK(f.A("a").state == AgentState::kRunning);
  CHECK(f.A("a").ranks.size() == 2);
  CHECK(f.A("a").ranks[1].pid == 1001);
  CHECK(f.rc->status().state == RunState::kRunning);
  CHECK_FALSE(f.rc->Finished());
}

// Each reading moves the clock on by 0.1 s: a launch that takes time.
class TickingClock final : public Clock {
 public:
  TimePoint Now() const override {
    return TimePoint(ticks_ += std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                         std::chrono::milliseconds(100)));
  }

 private:
  mutable std::chrono::steady_clock::duration ticks_{0};
};

TEST_CASE(
    "a long launch hands back every 0.25 s, with the started agents running, the rest pending") {
  TickingClock clock;
  FakeBackend backend;
  std::vector<SupervisedAgent> agents;
  for (int i = 0; i < 12; ++i) agents.push_back(MakeAgent("a" + std::to_string(i), 1));
  RunController rc("test", "/run", std::move(agents), &backend, &clock);
  std::vector<size_t> launched_at_call;
  rc.Start([&] {
    launched_at_call.push_back(backend.launches.size());
    const RunStatus& st = rc.status();
    for (size_t i = 0; i < st.agents.size(); ++i) {
      INFO(st.agents[i].name);
      CHECK(st.agents[i].state ==
            (i < backend.launches.size() ? AgentState::kRunning : AgentState::kPending));
    }
  });
  REQUIRE(launched_at_call.size() >= 2);
  CHECK(launched_at_call.front() >= 1);
  CHECK(launched_at_call.front() < 12);
  CHECK(std::is_sorted(launched_at_call.begin(), launched_at_call.end()));
  CHECK(backend.launches.size() == 12);
  CHECK(rc.status().state == RunState::kRunning);
}

TEST_CASE("an agent whose ranks all exit 0 has succeeded, and so has the run") {
  Fixture f;
  f.Make({MakeAgent("a", 2)});
  f.backend.Exit("a", 0, 1000, 0);
  f.rc->Tick();
  CHECK(f.A("a").state == AgentState::kRunning);  // rank 1 still runs
  f.backend.Exit("a", 1, 1001, 0);
  f.rc->Tick();
  CHECK(f.A("a").state == AgentState::kSucceeded);
  CHECK(f.rc->Finished());
  CHECK(f.rc->status().state == RunState::kSucceeded);
  CHECK(f.rc->ExitCode() == 0);
  CHECK(f.rc->Summary().empty());
}

TEST_CASE(
    "a killed rank tears the whole group down, and it restarts after the backoff with restart "
    "count 1") {
  Fixture f;
  f.Make({MakeAgent("a", 2), MakeAgent("b", 2)});
  f.backend.Exit("a", 1, 1001, 0, SIGKILL);
  f.rc->Tick();
  CHECK(f.A("a").state == AgentState::kRestarting);
  CHECK(f.backend.SignalsTo("a", SIGTERM) == 1);
  CHECK(f.backend.SignalsTo("a", SIGCONT) == 1);
  CHECK(f.A("a").ranks[1].exit_code == -SIGKILL);
  CHECK(f.A("a").reason.find("rank 1 (pid 1001) was killed by SIGKILL (signal 9)") !=
        std::string::npos);
  // Rank 0 ignores SIGTERM: after grace_s comes SIGKILL.
  f.clock.AdvanceSeconds(2.9);
  f.rc->Tick();
  CHECK(f.backend.SignalsTo("a", SIGKILL) == 0);
  f.clock.AdvanceSeconds(0.2);
  f.rc->Tick();
  CHECK(f.backend.SignalsTo("a", SIGKILL) == 1);
  f.backend.KillAll("a");
  f.rc->Tick();
  CHECK(f.backend.launches.size() == 2);  // not yet: backoff
  f.clock.AdvanceSeconds(2.1);
  f.rc->Tick();
  REQUIRE(f.backend.launches.size() == 3);
  CHECK(f.backend.launches[2].name == "a");
  CHECK(f.backend.launches[2].restart_count == 1);
  CHECK(f.A("a").restarts == 1);
  CHECK(f.A("a").state == AgentState::kRunning);
  CHECK(f.A("a").ranks[0].exit_code == std::nullopt);
  // The other agent was never touched.
  CHECK(f.backend.SignalsTo("b", SIGTERM) == 0);
  CHECK(f.backend.SignalsTo("b", SIGKILL) == 0);
  CHECK(f.A("b").ranks[0].pid == 1100);
  CHECK(f.A("b").restarts == 0);
}

TEST_CASE("a rank that stops heartbeating is declared dead after heartbeat_timeout_s") {
  Fixture f;
  auto agent = MakeAgent("a", 2);
  agent.restart.heartbeat_timeout_s = 5;
  f.Make({agent});
  f.rc->OnTelemetry(Heartbeat("a", 1));  // rank 1 says hello once, then falls silent
  for (int t = 0; t < 4; ++t) {
    f.clock.AdvanceSeconds(2);
    f.rc->OnTelemetry(Heartbeat("a", 0));
    f.rc->Tick();
    if (t < 2) CHECK(f.A("a").state == AgentState::kRunning);
  }
  CHECK(f.A("a").state == AgentState::kRestarting);
  CHECK(f.A("a").reason.find("rank 1 sent no heartbeat") != std::string::npos);
  CHECK(f.backend.SignalsTo("a", SIGTERM) == 1);
}

TEST_CASE("a rank that said bye is not expected to heartbeat while mpirun waits for the others") {
  Fixture f;
  auto agent = MpiAgent();
  agent.restart.heartbeat_timeout_s = 5;
  f.Make({agent});
  auto bye = Heartbeat("m", 0);
  bye.type = TelemetryType::kBye;
  f.rc->OnTelemetry(bye);
  for (int t = 0; t < 5; ++t) {
    f.clock.AdvanceSeconds(2);
    f.rc->OnTelemetry(Heartbeat("m", 1));
    f.rc->Tick();
  }
  CHECK(f.A("m").state == AgentState::kRunning);
  CHECK(f.backend.SignalsTo("m", SIGTERM) == 0);
}

TEST_CASE(
    "ranks that said bye must exit within heartbeat_timeout_s; one that does not is torn down") {
  Fixture f;
  auto agent = MakeAgent("a", 2);
  agent.restart.heartbeat_timeout_s = 5;
  f.Make({agent});
  f.SayBye("a", 2);
  f.backend.Exit("a", 0, 1000, 0);  // rank 0 leaves; rank 1 (pid 1001) is stopped on its way out
  f.clock.AdvanceSeconds(4);
  f.rc->Tick();
  CHECK(f.A("a").state == AgentState::kRunning);  // within the bound: it may still be leaving
  f.clock.AdvanceSeconds(2);
  f.rc->Tick();
  CHECK(f.A("a").state == AgentState::kRestarting);
  CHECK_THAT(f.A("a").reason,
             Catch::Matchers::Contains("every rank is done (the last bye 6.0 s ago), "
                                       "but rank 1 has not exited"));
  CHECK(f.backend.SignalsTo("a", SIGTERM) == 1);
  CHECK(f.backend.SignalsTo("a", SIGCONT) == 1);  // a stopped rank must run to see SIGTERM
}

TEST_CASE("under mpirun the rank wrappers' records name the rank that said bye and never left") {
  LogDir logs;
  logs.Write("rank0.exit",
             R"({"rank":0,"pid":5150,"exit_code":0,"signal":0,"restart_count":0,"time":100.0})");
  Fixture f;
  auto agent = MpiAgent(logs.path);
  agent.restart.heartbeat_timeout_s = 5;
  f.Make({agent});
  f.SayBye("m", 2);
  f.clock.AdvanceSeconds(6);
  f.rc->Tick();
  CHECK(f.A("m").state == AgentState::kRestarting);
  CHECK_THAT(f.A("m").reason, Catch::Matchers::Contains("but rank 1 has not exited"));
}

TEST_CASE("what an agent said before it exited, heard after its exit, still counts") {
  // The intake runs behind (a loaded controller): the exit is seen first.
  Fixture f;
  f.Make({MakeAgent("a", 1)});
  f.rc->OnTelemetry(Heartbeat("a", 0, 0, 1487));
  f.backend.Exit("a", 0, 1000, 0);
  f.rc->Tick();
  REQUIRE(f.A("a").state == AgentState::kSucceeded);
  TelemetryMessage last = Heartbeat("a", 0, 0, 1500);
  last.type = TelemetryType::kMetrics;
  last.metrics = {{"score", 1894.0}};
  f.rc->OnTelemetry(last);
  TelemetryMessage bye = Heartbeat("a", 0, 0, 1500);
  bye.type = TelemetryType::kBye;
  f.rc->OnTelemetry(bye);
  CHECK(f.A("a").step == 1500);
  CHECK(f.A("a").metrics["score"] == 1894.0);
  CHECK(f.A("a").state == AgentState::kSucceeded);
  // An earlier incarnation's (another restart count) and an older step change nothing.
  f.rc->OnTelemetry(Heartbeat("a", 0, 0, 1300));
  f.rc->OnTelemetry(Heartbeat("a", 0, 7, 9000));
  CHECK(f.A("a").step == 1500);
}

TEST_CASE("a succeeded agent's last reports never heard: its committed checkpoint gives its step") {
  // Telemetry still queued when a process exits goes once its linger ends,
  // when the controller runs behind: the checkpoint on disk proves the step.
  const testing::TempDir ckpt("agentrt-ctl-ckpt");
  SupervisedAgent agent = MakeAgent("a", 1);
  agent.launch.checkpoint_dir = ckpt.path;
  Fixture f;
  f.Make({agent});
  auto last = Heartbeat("a", 0, 0, 1496);
  last.type = TelemetryType::kCheckpoint;
  last.checkpoint_step = 1430;
  f.rc->OnTelemetry(last);
  {
    auto ck =
        Checkpointer::Create(CheckpointOptions{.dir = ckpt.path, .agent = "a", .interval_s = 0});
    REQUIRE(ck.ok());
    std::vector<float> w(16, 0.5f);
    CheckpointState state;
    state.AddArray("w", w.data(), "float32", {16}, sizeof(float));
    REQUIRE((*ck)->Save(1500, state).ok());
  }
  f.backend.Exit("a", 0, 1000, 0);
  f.rc->Tick();
  REQUIRE(f.A("a").state == AgentState::kSucceeded);
  CHECK(f.A("a").step == 1500);
  CHECK(f.A("a").last_checkpoint_step == 1500);
}

TEST_CASE("ranks that said bye and exit in time end the agent succeeded") {
  Fixture f;
  auto agent = MakeAgent("a", 2);
  agent.restart.heartbeat_timeout_s = 5;
  f.Make({agent});
  f.SayBye("a", 2);
  f.clock.AdvanceSeconds(4);
  f.rc->Tick();
  f.backend.Exit("a", 0, 1000, 0);
  f.backend.Exit("a", 1, 1001, 0);
  f.clock.AdvanceSeconds(4);
  f.rc->Tick();
  CHECK(f.A("a").state == AgentState::kSucceeded);
  CHECK(f.backend.SignalsTo("a", SIGTERM) == 0);
}

TEST_CASE("a rank that never sends telemetry (a stock script) is supervised by its exit alone") {
  Fixture f;
  auto agent = MakeAgent("plain", 1);
  agent.restart.heartbeat_timeout_s = 5;
  f.Make({agent});
  f.clock.AdvanceSeconds(60);
  f.rc->Tick();
  CHECK(f.A("plain").state == AgentState::kRunning);
  f.backend.Exit("plain", 0, 1000, 0);
  f.rc->Tick();
  CHECK(f.A("plain").state == AgentState::kSucceeded);
}

TEST_CASE("heartbeats from an earlier incarnation do not keep a new one alive") {
  Fixture f;
  auto agent = MakeAgent("a", 1);
  agent.restart.heartbeat_timeout_s = 5;
  f.Make({agent});
  f.backend.Exit("a", 0, 1000, 1);
  f.rc->Tick();
  f.clock.AdvanceSeconds(2.5);
  f.rc->Tick();
  REQUIRE(f.A("a").restarts == 1);
  f.rc->OnTelemetry(Heartbeat("a", 0, /*restart_count=*/1));  // the new incarnation's hello
  for (int t = 0; t < 6; ++t) {
    f.clock.AdvanceSeconds(1);
    f.rc->OnTelemetry(Heartbeat("a", 0, /*restart_count=*/0));
    f.rc->Tick();
  }
  CHECK(f.A("a").state == AgentState::kRestarting);
}

TEST_CASE("an agent that always fails ends failed after max_restarts and the run exits non-zero") {
  Fixture f;
  f.Make({MakeAgent("bad", 1, /*max_restarts=*/2), MakeAgent("good", 1)});
  for (int attempt = 0; attempt < 3; ++attempt) {
    REQUIRE(f.backend.live["bad"].size() == 1);
    const pid_t pid = *f.backend.live["bad"].begin();
    f.rc->OnTelemetry(Heartbeat("bad", 0, attempt, 10));  // a step: not a start-up failure
    f.backend.Exit("bad", 0, pid, 3);
    f.rc->Tick();
    f.clock.AdvanceSeconds(8.5);  // backoff 2, then 4
    f.rc->Tick();
  }
  CHECK(f.A("bad").state == AgentState::kFailed);
  CHECK(f.A("bad").restarts == 2);
  CHECK(f.A("good").state == AgentState::kRunning);
  CHECK_FALSE(f.rc->Finished());
  f.backend.Exit("good", 0, *f.backend.live["good"].begin(), 0);
  f.rc->Tick();
  CHECK(f.rc->Finished());
  CHECK(f.rc->status().state == RunState::kFailed);
  CHECK(f.rc->ExitCode() != 0);
  const std::string summary = f.rc->Summary();
  CHECK(summary.find("agent bad failed after 2 restarts") != std::string::npos);
  CHECK(summary.find("exited with code 3") != std::string::npos);
  CHECK(summary.find("/run/logs/bad/rank0.log") != std::string::npos);
}

TEST_CASE("every launch, first and relaunch, has an incarnation of its own") {
  ManualClock clock;
  FakeBackend backend;
  RunController rc("test", "/run", {MakeAgent("a", 1)}, &backend, &clock);
  rc.Start();
  backend.Exit("a", 0, *backend.live["a"].begin(), 9);
  rc.Tick();
  clock.AdvanceSeconds(2.5);
  rc.Tick();
  REQUIRE(backend.launches.size() == 2);
  CHECK_FALSE(backend.launches[0].incarnation.empty());
  CHECK(backend.launches[0].incarnation != backend.launches[1].incarnation);
  CHECK(backend.launches[1].incarnation.rfind("1.", 0) == 0);  // restart count first
}

TEST_CASE("a launch error that cannot go away fails the agent at once") {
  Fixture f;
  f.backend.fail_next_launch = NotFound("program 'nope' not found");
  f.Make({MakeAgent("a", 1)});
  CHECK(f.A("a").state == AgentState::kFailed);
  CHECK(f.A("a").reason.find("nope") != std::string::npos);
  CHECK(f.rc->Finished());
}

TEST_CASE(
    "mpirun standing for all ranks: its exit ends every rank, and a rank's hello gives its pid") {
  Fixture f;
  f.Make({MpiAgent()});
  CHECK(f.A("m").ranks[0].pid == 1000);
  CHECK(f.A("m").ranks[1].pid == 1000);
  auto hello = Heartbeat("m", 1);
  hello.type = TelemetryType::kHello;
  hello.pid = 4242;
  f.rc->OnTelemetry(hello);
  CHECK(f.A("m").ranks[1].pid == 4242);
  f.backend.Exit("m", -1, 1000, 0);
  f.rc->Tick();
  CHECK(f.A("m").state == AgentState::kSucceeded);
  CHECK(f.A("m").ranks[0].exit_code == 0);
  CHECK(f.A("m").ranks[1].exit_code == 0);
}

TEST_CASE("telemetry updates step, metrics, steps/s and the last checkpoint step") {
  Fixture f;
  f.Make({MakeAgent("a", 1)});
  f.rc->OnTelemetry(Heartbeat("a", 0, 0, 100));
  f.clock.AdvanceSeconds(4);
  auto m = Heartbeat("a", 0, 0, 500);
  m.type = TelemetryType::kMetrics;
  m.metrics = {{"loss", 0.5}, {"return", 12}};
  f.rc->OnTelemetry(m);
  CHECK(f.A("a").step == 500);
  CHECK(f.A("a").steps_per_s == Approx(100.0));
  CHECK(f.A("a").metrics["loss"] == 0.5);
  auto c = Heartbeat("a", 0, 0, 500);
  c.type = TelemetryType::kCheckpoint;
  c.checkpoint_step = 400;
  const auto v = f.rc->state_version();
  const auto any = f.rc->version();
  f.rc->OnTelemetry(c);
  CHECK(f.A("a").last_checkpoint_step == 400);
  // A checkpoint is news for status.json (within a second), not a state change
  // written at once: a thousand agents checkpointing must not rewrite it each poll.
  CHECK(f.rc->version() > any);
  CHECK(f.rc->state_version() == v);
}

TEST_CASE("a stop request sends SIGTERM, then SIGKILL after the grace, and ends the run stopped") {
  Fixture f;
  f.Make({MakeAgent("a", 1), MakeAgent("b", 1)});
  f.backend.Exit("b", 0, 1100, 1);  // b is in backoff when the stop comes
  f.rc->Tick();
  f.rc->RequestStop("SIGINT");
  CHECK(f.backend.SignalsTo("a", SIGTERM) == 1);
  CHECK(f.A("b").state == AgentState::kStopped);
  CHECK_FALSE(f.rc->Finished());
  f.clock.AdvanceSeconds(3.5);
  f.rc->Tick();
  CHECK(f.backend.SignalsTo("a", SIGKILL) == 1);
  f.backend.KillAll("a");
  f.clock.AdvanceSeconds(10);
  f.rc->Tick();
  CHECK(f.backend.launches.size() == 2);  // nothing restarted
  CHECK(f.A("a").state == AgentState::kStopped);
  CHECK(f.rc->Finished());
  CHECK(f.rc->status().state == RunState::kStopped);
  CHECK(f.rc->ExitCode() != 0);
}

TEST_CASE("an agent that exits 78 (its own configuration) fails at once, quoting its message") {
  LogDir logs;
  logs.Append("rank0.log", "an earlier incarnation's last words\n");
  Fixture f;
  auto a = MakeAgent("a", 1, /*max_restarts=*/5);
  a.launch.log_dir = logs.path;
  f.Make({a});
  logs.Append("rank0.log", "starting\nagent-worker: args.lr: expected a number, got \"fast\"\n\n");
  f.backend.Exit("a", 0, 1000, kExitConfigError);
  f.rc->Tick();
  f.clock.AdvanceSeconds(10);
  f.rc->Tick();
  CHECK(f.backend.launches.size() == 1);  // not restarted
  CHECK(f.A("a").state == AgentState::kFailed);
  CHECK(f.A("a").reason ==
        "configuration error: agent-worker: args.lr: expected a number, got \"fast\"");
  CHECK(f.rc->ExitCode() != 0);
  CHECK_THAT(f.rc->Summary(), Catch::Matchers::Contains("configuration error: agent-worker"));
}

TEST_CASE("mpirun's exit is explained by the rank wrappers' records: which rank, which signal") {
  LogDir logs;
  // Rank 1 was killed first; rank 0 then lost its peer and exited 1.
  logs.Write("rank1.exit",
             R"({"rank":1,"pid":5151,"exit_code":0,"signal":9,"restart_count":0,"time":100.0})");
  logs.Write("rank0.exit",
             R"({"rank":0,"pid":5150,"exit_code":1,"signal":0,"restart_count":0,"time":100.5})");
  // A record of an earlier incarnation says nothing about this one.
  logs.Write("rank2.exit",
             R"({"rank":2,"pid":4000,"exit_code":3,"signal":0,"restart_count":7,"time":1.0})");
  Fixture f;
  f.Make({MpiAgent(logs.path)});
  f.backend.Exit("m", -1, 1000, 1);
  f.rc->Tick();
  const AgentStatus& s = f.A("m");
  CHECK(s.reason.rfind("rank 1 (pid 5151) ", 0) == 0);
  CHECK_THAT(s.reason, Catch::Matchers::Contains("was killed by SIGKILL"));
  CHECK_THAT(s.reason, Catch::Matchers::Contains("mpirun (pid 1000)"));
  CHECK(s.ranks[0].pid == 5150);
  CHECK(s.ranks[1].pid == 5151);
  CHECK(s.ranks[1].exit_code == -9);
  CHECK(s.ranks[0].exit_code == 1);
  CHECK(s.state == AgentState::kRestarting);
}

TEST_CASE("the checkpoint an agent commits while being stopped is its last checkpoint") {
  Fixture f;
  f.Make({MakeAgent("a", 1)});
  auto c = Heartbeat("a", 0, 0, 300);
  c.type = TelemetryType::kCheckpoint;
  c.checkpoint_step = 200;
  f.rc->OnTelemetry(c);
  f.rc->RequestStop("SIGTERM");
  c.checkpoint_step = 300;  // written on SIGTERM, before the rank exits
  f.rc->OnTelemetry(c);
  CHECK(f.A("a").last_checkpoint_step == 300);
  auto stale = c;
  stale.restart_count = 4;  // another incarnation's word does not count
  stale.checkpoint_step = 900;
  f.rc->OnTelemetry(stale);
  CHECK(f.A("a").last_checkpoint_step == 300);
  f.backend.Exit("a", 0, 1000, 0);
  f.rc->Tick();
  f.rc->OnTelemetry(c);  // late, after the exit: still no regression
  CHECK(f.A("a").last_checkpoint_step == 300);
}

TEST_CASE("a restore report records the step and the corrupt checkpoints it passed over") {
  Fixture f;
  f.Make({MakeAgent("a", 1), MakeAgent("b", 1)});
  auto r = Heartbeat("a", 0);
  r.type = TelemetryType::kRestore;
  r.checkpoint_step = 400;
  r.skipped_steps = {600, 500};
  f.rc->OnTelemetry(r);
  r.agent = "b";
  r.checkpoint_step = -1;
  r.skipped_steps = {100};
  f.rc->OnTelemetry(r);
  CHECK(f.A("a").restored_step == 400);
  CHECK(f.A("a").skipped_checkpoints == std::vector<int64_t>{600, 500});
  CHECK(RestoreNote(f.A("a")) ==
        "agent a resumed from step 400, past corrupt checkpoints 600, 500");
  CHECK(RestoreNote(f.A("b")) ==
        "agent b started fresh: every checkpoint was corrupt (skipped step 100)");
  f.backend.Exit("a", 0, 1000, 0);
  f.backend.Exit("b", 0, 1100, 0);
  f.rc->Tick();
  REQUIRE(f.rc->status().state == RunState::kSucceeded);
  CHECK_THAT(f.rc->Summary(), Catch::Matchers::Contains("agent b started fresh"));
  CHECK_THAT(RenderStatusTable(f.rc->status()), Catch::Matchers::Contains("note: agent a resumed"));
  const auto back = RunStatusFromJson(RunStatusToJson(f.rc->status()));
  REQUIRE(back.ok());
  CHECK(back->FindAgent("b")->restored_step == -1);
  CHECK(back->FindAgent("b")->skipped_checkpoints == std::vector<int64_t>{100});
}

// An agent as the status of an ended run recorded it.
AgentStatus Recorded(const std::string& name, AgentState state, int restarts) {
  AgentStatus a;
  a.name = name;
  a.state = state;
  a.restarts = restarts;
  return a;
}

TEST_CASE("resume: finished agents are left alone, the others start a new incarnation") {
  RunStatus before;
  AgentStatus done = Recorded("done", AgentState::kSucceeded, 1);
  done.step = 500;
  done.ranks = {{0, 77, "localhost", 0, std::nullopt}};
  AgentStatus busy = Recorded("busy", AgentState::kRunning, 2);
  busy.step = 120;
  busy.last_checkpoint_step = 100;
  before.agents = {done, busy};

  ManualClock clock;
  FakeBackend backend;
  RunController rc("test", "/run", {MakeAgent("done", 1), MakeAgent("busy", 1, 5)}, &backend,
                   &clock);
  rc.Resume(before);
  rc.Start();
  REQUIRE(backend.launches.size() == 1);
  CHECK(backend.launches[0].name == "busy");
  CHECK(backend.launches[0].restart_count == 3);  // its telemetry is told from the dead run's
  const AgentStatus& b = *rc.status().FindAgent("busy");
  CHECK(b.state == AgentState::kRunning);
  CHECK(b.last_checkpoint_step == 100);
  const AgentStatus& d = *rc.status().FindAgent("done");
  CHECK(d.state == AgentState::kSucceeded);
  CHECK(d.step == 500);
  CHECK(d.ranks[0].pid == 77);
  backend.Exit("busy", 0, *backend.live["busy"].begin(), 0);
  rc.Tick();
  CHECK(rc.Finished());
  CHECK(rc.status().state == RunState::kSucceeded);
}

TEST_CASE("before a relaunch the advisor may move the agent, or hold it for a requeue") {
  Fixture f;
  auto a = MakeAgent("a", 2);
  a.launch.ranks[1].node = "n2";
  auto b = MakeAgent("b", 1);
  f.Make({a, b});
  int asked = 0;
  bool hold = false;
  f.rc->SetRelaunchAdvisor([&](AgentLaunch& launch) {
    ++asked;
    RelaunchAdvice advice;
    if (hold) {
      advice.hold = true;
      advice.reason = "node n3 failed and no spare node left";
      advice.failures.push_back({"n3", 1.0, launch.name, ""});
      return advice;
    }
    launch.ranks[1].node = "n4";
    launch.master_addr = "10.0.0.4";
    advice.failures.push_back({"n2", 1.0, launch.name, "n4"});
    return advice;
  });
  CHECK(asked == 0);  // not for the first launch
  f.backend.KillAll("a");
  f.rc->Tick();  // the teardown ends: the advisor moves it
  REQUIRE(asked == 1);
  f.rc->Tick();  // relaunched at once, without the backoff: its node failed, not the agent
  REQUIRE(f.backend.launches.size() == 3);
  CHECK(f.backend.launches.back().name == "a");
  CHECK(f.backend.launches.back().ranks[1].node == "n4");
  CHECK(f.backend.launches.back().master_addr == "10.0.0.4");
  CHECK(f.A("a").state == AgentState::kRunning);
  CHECK(f.A("b").restarts == 0);  // the other agent was not touched
  REQUIRE(f.rc->status().node_failures.size() == 1);
  CHECK(f.rc->status().node_failures[0].moved_to == "n4");
  CHECK(f.rc->requeue_reason().empty());

  // The next failure finds no spare: a is held, not relaunched, and the run
  // is told to requeue.
  hold = true;
  f.backend.KillAll("a");
  f.rc->Tick();
  f.clock.AdvanceSeconds(2.5);
  f.rc->Tick();
  f.clock.AdvanceSeconds(100);
  f.rc->Tick();
  CHECK(asked == 2);
  CHECK(f.backend.launches.size() == 3);
  CHECK(f.A("a").state == AgentState::kRestarting);
  CHECK(f.A("a").reason == "node n3 failed and no spare node left");
  CHECK(f.rc->requeue_reason() == "node n3 failed and no spare node left");
  CHECK(f.rc->status().node_failures.size() == 2);
  f.rc->RequestStop("requeue");
  f.backend.KillAll("b");
  f.rc->Tick();
  CHECK(f.A("a").state == AgentState::kStopped);
  CHECK(f.rc->Finished());
  const std::string summary = f.rc->Summary();
  CHECK_THAT(summary, Catch::Contains("node n2 failed at") && Catch::Contains("a moved to n4") &&
                          Catch::Contains("node n3 failed at") &&
                          Catch::Contains("requeue: node n3 failed and no spare node left"));
}

TEST_CASE("an agent the advisor shrank says its current and planned ranks, in JSON and notes") {
  Fixture f;
  auto a = MakeAgent("a", 2);
  a.launch.ranks[1].node = "n2";
  f.Make({a});
  f.rc->SetRelaunchAdvisor([&](AgentLaunch& launch) {
    RelaunchAdvice advice;
    launch.ranks.pop_back();  // n2 failed; it goes on with rank 0 (restart.elastic)
    launch.planned_ranks = 2;
    advice.failures.push_back({"n2", 1.0, launch.name, "", /*shrunk=*/true});
    return advice;
  });
  CHECK(f.A("a").planned_ranks == 0);
  f.backend.KillAll("a");
  f.rc->Tick();
  f.clock.AdvanceSeconds(2.5);
  f.rc->Tick();
  REQUIRE(f.A("a").state == AgentState::kRunning);
  CHECK(f.A("a").ranks.size() == 1);
  CHECK(f.A("a").planned_ranks == 2);
  const auto back = RunStatusFromJson(RunStatusToJson(f.rc->status()));
  REQUIRE(back.ok());
  CHECK(back->agents[0].planned_ranks == 2);
  const std::vector<std::string> notes = RunNotes(f.rc->status(), false);
  CHECK(std::find(notes.begin(), notes.end(),
                  "agent a runs 1 of its 2 planned ranks: a node of it failed and no spare fit "
                  "(restart.elastic); it grows back when its allocation is requeued") !=
        notes.end());
}

TEST_CASE("a rank that never enters the collective its peers wait in is a hang: named, dumped") {
  LogDir dir;
  ManualClock clock;
  FakeBackend backend;
  auto agent = MakeAgent("a", 3);
  agent.group.collective_timeout_s = 5;
  RunController rc("test", dir.path, {agent}, &backend, &clock);
  rc.Start();
  auto beat = [&](int rank, uint64_t seq, bool in, double in_for) {
    TelemetryMessage m = Heartbeat("a", rank);
    m.time = 1000;
    m.collective =
        Collective({{"seq", seq},
                    {"in", in},
                    {"op", "all_reduce"},
                    {"since", 1000 - in_for},
                    {"recent", nlohmann::json::array({{{"seq", seq}, {"op", "all_reduce"}}})}});
    rc.OnTelemetry(m);
  };
  // Ranks 0 and 2 wait in #42; rank 1 is still at #41 (computing).
  beat(0, 42, true, 1);
  beat(1, 41, false, 0);
  beat(2, 42, true, 1);
  clock.AdvanceSeconds(3);
  rc.Tick();
  CHECK(rc.status().agents[0].state == AgentState::kRunning);  // 4 s < 5 s
  clock.AdvanceSeconds(2);
  rc.Tick();
  const AgentStatus& s = rc.status().agents[0];
  REQUIRE(s.state == AgentState::kRestarting);
  CHECK_THAT(s.reason, Catch::StartsWith("rank 1 never entered all_reduce #42 that ranks 0,2 "
                                         "entered 6 s ago (hang report: " +
                                         dir.path + "/hangs/a-"));
  CHECK(backend.SignalsTo("a", SIGTERM) == 1);
  auto files = std::vector<std::filesystem::path>(
      std::filesystem::directory_iterator(dir.path + "/hangs"), {});
  REQUIRE(files.size() == 1);
  const auto dump =
      HangReport::FromJson(nlohmann::json::parse(ReadWholeFile(files[0].string()).value()));
  REQUIRE(dump.ok());
  CHECK(dump->agent == "a");
  REQUIRE(dump->ranks.size() == 3);
  REQUIRE(dump->ranks[1].collective);
  CHECK(dump->ranks[1].collective->seq == 41);
  CHECK(dump->summary.find("rank 1 never entered") == 0);
}

TEST_CASE("every rank in the same collective too long is a hang; a slow but moving group is not") {
  ManualClock clock;
  FakeBackend backend;
  auto agent = MakeAgent("a", 2);
  agent.group.collective_timeout_s = 5;
  agent.restart.progress_timeout_s = 20;
  LogDir dir;  // the hang report goes to <run dir>/hangs
  RunController rc("test", dir.path, {agent}, &backend, &clock);
  rc.Start();
  uint64_t seq = 1;
  for (int i = 0; i < 10; ++i) {  // 40 s of collectives that each take 4 s: no alarm
    for (int r = 0; r < 2; ++r) {
      TelemetryMessage m = Heartbeat("a", r, 0, i);
      m.time = 1000;  // heard halfway through: in it for 2 s so far
      m.collective = Collective({{"seq", seq}, {"in", true}, {"op", "all_reduce"}, {"since", 998}});
      rc.OnTelemetry(m);
    }
    ++seq;
    clock.AdvanceSeconds(2);
    rc.Tick();
    clock.AdvanceSeconds(2);
  }
  CHECK(rc.status().agents[0].state == AgentState::kRunning);
  for (int r = 0; r < 2; ++r) {
    TelemetryMessage m = Heartbeat("a", r, 0, 10);
    m.time = 1000;
    m.collective = Collective({{"seq", seq}, {"in", true}, {"op", "all_gather"}, {"since", 994}});
    rc.OnTelemetry(m);
  }
  rc.Tick();
  CHECK_THAT(rc.status().agents[0].reason,
             Catch::StartsWith("every rank is stuck in all_gather #11 for 6 s"));
}

TEST_CASE("a step of a rank's wall clock neither makes a collective hang nor hides a hang") {
  ManualClock clock;
  FakeBackend backend;
  auto agent = MakeAgent("a", 2);
  agent.group.collective_timeout_s = 5;
  LogDir dir;
  RunController rc("test", dir.path, {agent}, &backend, &clock);
  rc.Start();
  // Both ranks entered #7 a second ago by their steady clocks; rank 1's wall clock then stepped
  // an hour forward, so its `since` is an hour before its `time`.
  auto beat = [&](int rank, double time, double since, double in_for) {
    TelemetryMessage m = Heartbeat("a", rank, 0, 3);
    m.time = time;
    m.collective = Collective(
        {{"seq", 7}, {"in", true}, {"op", "all_reduce"}, {"since", since}, {"in_for_s", in_for}});
    rc.OnTelemetry(m);
  };
  beat(0, 1000, 999, 1);
  beat(1, 4600, 999, 1);
  rc.Tick();
  CHECK(rc.status().agents[0].state == AgentState::kRunning);
  // Their clocks stepped back instead: `since` after `time`; the wait still counts, and 6 s later
  // it is a hang.
  beat(0, 900, 999, 1);
  beat(1, 900, 999, 1);
  clock.AdvanceSeconds(5);
  rc.Tick();
  CHECK_THAT(rc.status().agents[0].reason,
             Catch::StartsWith("every rank is stuck in all_reduce #7 for 6 s"));
}

TEST_CASE("a rank is heard at the controller's time, whatever its node's clock says") {
  Fixture f;
  f.Make({MakeAgent("a", 2)});
  // Rank 0's node is an hour behind, rank 1's an hour ahead: neither is an hour old or new.
  for (int rank = 0; rank < 2; ++rank) {
    TelemetryMessage m = Heartbeat("a", rank, 0, 3);
    m.time = UnixTimeSeconds() + (rank == 0 ? -3600 : 3600);
    f.rc->OnTelemetry(m);
  }
  for (const auto& r : f.A("a").ranks) {
    REQUIRE(r.heard_unix_s);
    CHECK(std::abs(*r.heard_unix_s - UnixTimeSeconds()) < 60);
  }
}

TEST_CASE("a training loop that stops reporting steps is a hang after progress_timeout_s") {
  LogDir dir;  // the hang report goes to <run dir>/hangs
  Fixture f;
  f.run_dir = dir.path;
  auto agent = MakeAgent("a", 1);
  agent.restart.progress_timeout_s = 10;
  f.Make({agent});
  f.rc->OnTelemetry(Heartbeat("a", 0, 0, 1));
  for (int t = 0; t < 6; ++t) {  // heartbeats go on (the thread lives), the step does not
    f.clock.AdvanceSeconds(1.5);
    f.rc->OnTelemetry(Heartbeat("a", 0, 0, 1));
    f.rc->Tick();
  }
  CHECK(f.A("a").state == AgentState::kRunning);  // 9 s without a new step
  f.clock.AdvanceSeconds(1.5);
  f.rc->OnTelemetry(Heartbeat("a", 0, 0, 1));
  f.rc->Tick();
  CHECK(f.A("a").state == AgentState::kRestarting);
  CHECK_THAT(f.A("a").reason,
             Catch::StartsWith("no new step reported for 10.5 s (progress_timeout_s 10)"));
}

TEST_CASE("declared FLOPs per sample give achieved FLOP/s, efficiency and the biggest phase") {
  Fixture f;
  auto agent = MakeAgent("a", 2);
  agent.peak_flops = 2e12;  // two CPU ranks of 1 TFLOP/s
  f.Make({agent});
  CHECK(f.A("a").peak_flops == 2e12);
  // Rank 0 heartbeats every second, 1000 samples further each time, with 0.6 s
  // more inside collectives; each sample is 1e8 FLOPs: 1e11 FLOP/s, 5% of the peak.
  for (int t = 0; t <= 4; ++t) {
    TelemetryMessage m = Heartbeat("a", 0, 0, 1000 * t);
    m.time = 1000 + t;
    m.flops_per_sample = 1e8;
    m.collective = Collective({{"seq", t}, {"in", false}, {"busy_s", 0.6 * t}});
    f.rc->OnTelemetry(m);
    f.rc->OnTelemetry(Heartbeat("a", 1, 0, 1000 * t));
    f.clock.AdvanceSeconds(1);
  }
  const AgentStatus& s = f.A("a");
  CHECK(s.flops_per_sample == 1e8);
  CHECK(s.steps_per_s == Approx(1000));
  CHECK(s.achieved_flops == Approx(1e11));
  CHECK(s.collective_share == Approx(0.6));
  CHECK(EfficiencyNote(s) ==
        "agent a reaches 5.0% of its peak (0.1 TFLOP/s achieved of 2 TFLOP/s); the biggest phase: "
        "collectives, 60% of its time");
  CHECK(RenderStatusTable(f.rc->status()).find("note: agent a reaches 5.0% of its peak") !=
        std::string::npos);
  AgentStatus fast = s;
  fast.achieved_flops = 1.8e12;
  CHECK(EfficiencyNote(fast).empty());  // 90%: nothing to flag
}

TEST_CASE("status.json round-trips through its JSON shape") {
  RunStatus s;
  s.run = "demo";
  s.state = RunState::kFailed;
  AgentStatus a;
  a.name = "predator-0";
  a.state = AgentState::kRestarting;
  a.restarts = 2;
  a.ranks = {{0, 11, "n1", std::nullopt, 1764460031.5}, {1, 12, "n2", -9, std::nullopt}};
  a.last_checkpoint_step = 40;
  a.metrics = {{"loss", 1.5}};
  s.agents.push_back(a);
  s.node_failures = {{"n3", 1764460040.0, "predator-0", "n4"}, {"n4", 1764460050.0, "prey-0", ""}};
  s.requeue_reason = "node n4 failed and no spare node left";
  const auto j = RunStatusToJson(s);
  CHECK(j["agents"][0]["ranks"][0]["exit_code"].is_null());
  CHECK(j["agents"][0]["ranks"][1]["exit_code"] == -9);
  CHECK(j["agents"][0]["state"] == "restarting");
  auto back = RunStatusFromJson(nlohmann::json::parse(j.dump()));
  REQUIRE(back.ok());
  CHECK(back->state == RunState::kFailed);
  CHECK(back->agents[0].ranks[1].exit_code == -9);
  CHECK(back->agents[0].last_checkpoint_step == 40);
  CHECK(back->agents[0].ranks[0].heard_unix_s == 1764460031.5);
  CHECK_FALSE(back->agents[0].ranks[1].heard_unix_s);
  REQUIRE(back->node_failures.size() == 2);
  CHECK(back->node_failures[0].node == "n3");
  CHECK(back->node_failures[0].moved_to == "n4");
  CHECK(back->node_failures[1].moved_to.empty());
  CHECK(back->requeue_reason == s.requeue_reason);
  const std::string table = RenderStatusTable(*back);
  CHECK(table.find("predator-0") != std::string::npos);
  CHECK(table.find("n1 n2") != std::string::npos);  // the agent's nodes
  CHECK(table.find("node n3 failed at 23:47:20 UTC: predator-0 moved to n4") != std::string::npos);
  CHECK(table.find("prey-0 has no spare node left") != std::string::npos);
  CHECK(table.find("requeue: node n4 failed") != std::string::npos);
}

}  // namespace agentrt

namespace agentrt {

TEST_CASE(
    "a planned replacement tears the agent down, runs its hook while nothing runs, and relaunches "
    "at once without using up max_restarts") {
  Fixture f;
  f.Make({MakeAgent("a", 2, /*max_restarts=*/1), MakeAgent("b", 1)});
  CHECK(f.rc->RequestCheckpoint("a").ok());
  CHECK(f.backend.SignalsTo("a", SIGUSR2) == 1);
  bool hook_ran = false;
  size_t launches_when_hook_ran = 0;
  REQUIRE(f.rc->Replace("a", "pbt: restarting from b's checkpoint",
                        [&] {
                          hook_ran = true;
                          launches_when_hook_ran = f.backend.launches.size();
                          CHECK(f.backend.live["a"].empty());  // nothing of it runs now
                        })
              .ok());
  CHECK(f.A("a").state == AgentState::kRestarting);
  CHECK(f.backend.SignalsTo("a", SIGTERM) == 1);
  // A second replacement while the first is under way is refused.
  CHECK_FALSE(f.rc->Replace("a", "again", [] {}).ok());
  f.backend.KillAll("a");
  f.rc->Tick();
  f.rc->Tick();  // no backoff: relaunched on the next tick
  CHECK(hook_ran);
  CHECK(launches_when_hook_ran == 2);
  REQUIRE(f.backend.launches.size() == 3);
  CHECK(f.backend.launches[2].restart_count == 1);
  CHECK(f.A("a").state == AgentState::kRunning);
  CHECK(f.A("a").replacements == 1);
  CHECK(f.A("a").reason == "pbt: restarting from b's checkpoint");
  // max_restarts 1 is still there for a real failure.
  f.backend.Exit("a", 0, f.A("a").ranks[0].pid, 1);
  f.rc->Tick();
  f.backend.KillAll("a");
  f.rc->Tick();
  f.clock.AdvanceSeconds(2.1);
  f.rc->Tick();
  CHECK(f.A("a").state == AgentState::kRunning);
  CHECK(f.A("a").restarts == 2);
  // Agents that do not run cannot be replaced or asked for a checkpoint.
  f.backend.Exit("b", 0, f.A("b").ranks[0].pid, 0);
  f.rc->Tick();
  CHECK(f.A("b").state == AgentState::kSucceeded);
  CHECK_FALSE(f.rc->Replace("b", "x", [] {}).ok());
  CHECK_FALSE(f.rc->RequestCheckpoint("b").ok());
  CHECK_FALSE(f.rc->Replace("nobody", "x", [] {}).ok());
}

TEST_CASE("the backoff doubles with each failure in a row, up to backoff_max_s") {
  RestartPolicy p;
  p.backoff_s = 2;
  p.backoff_max_s = 60;
  CHECK(BackoffDelay(p, 1) == 2);
  CHECK(BackoffDelay(p, 2) == 4);
  CHECK(BackoffDelay(p, 5) == 32);
  CHECK(BackoffDelay(p, 6) == 60);
  CHECK(BackoffDelay(p, 1000) == 60);  // no overflow however long the row
  p.backoff_max_s = 1;                 // a cap below backoff_s: backoff_s still holds
  CHECK(BackoffDelay(p, 3) == 2);
  p.backoff_s = 0;
  CHECK(BackoffDelay(p, 7) == 0);
}

// Agent `name`'s only rank is killed from outside (not a crash of its own).
void KillOnly(Fixture& f, const std::string& name) {
  REQUIRE(f.backend.live[name].size() == 1);
  f.backend.Exit(name, 0, *f.backend.live[name].begin(), 0, SIGKILL);
  f.rc->Tick();
}

TEST_CASE("failures in a row wait 2, 4, 8 s; an incarnation that checkpointed starts over") {
  Fixture f;
  f.Make({MakeAgent("a", 1, /*max_restarts=*/10)});
  const auto relaunched_after = [&](double wait) {
    const size_t before = f.backend.launches.size();
    f.clock.AdvanceSeconds(wait - 0.1);
    f.rc->Tick();
    if (f.backend.launches.size() != before) return false;  // too early
    f.clock.AdvanceSeconds(0.2);
    f.rc->Tick();
    return f.backend.launches.size() == before + 1;
  };
  KillOnly(f, "a");
  CHECK(relaunched_after(2));
  KillOnly(f, "a");
  CHECK(relaunched_after(4));
  KillOnly(f, "a");
  CHECK(relaunched_after(8));
  // This incarnation commits a checkpoint before it is killed: it got
  // somewhere, so the next wait is backoff_s again.
  TelemetryMessage ckpt = Heartbeat("a", 0, f.A("a").restarts);
  ckpt.type = TelemetryType::kCheckpoint;
  ckpt.checkpoint_step = 100;
  f.rc->OnTelemetry(ckpt);
  KillOnly(f, "a");
  CHECK(relaunched_after(2));
  KillOnly(f, "a");
  CHECK(relaunched_after(4));
  // One that ran backoff_max_s (60 s) before failing starts over too.
  f.clock.AdvanceSeconds(61);
  KillOnly(f, "a");
  CHECK(relaunched_after(2));
  CHECK(f.A("a").restarts == 6);
  CHECK(f.A("a").state == AgentState::kRunning);  // external kills are no crash loop
}

TEST_CASE(
    "the same failure at start-up three times in a row is a crash loop: failed, with its last "
    "lines of output, before max_restarts is spent") {
  LogDir logs;
  Fixture f;
  auto a = MakeAgent("py", 1, /*max_restarts=*/10);
  a.launch.log_dir = logs.path;
  f.Make({a});
  const std::string traceback =
      "Traceback (most recent call last):\n  File \"/opt/agent.py\", line 3, in <module>\n"
      "    import numpy\nModuleNotFoundError: No module named 'numpy'\n";
  const auto fail_at_startup = [&](const std::string& output, int code) {
    REQUIRE(f.backend.live["py"].size() == 1);
    logs.Append("rank0.log", output);
    f.backend.Exit("py", 0, *f.backend.live["py"].begin(), code);
    f.rc->Tick();
    f.clock.AdvanceSeconds(59);  // past any backoff, within the start-up window
    f.rc->Tick();
  };
  fail_at_startup(traceback, 1);
  // A different failure in between breaks the row.
  fail_at_startup("OSError: [Errno 98] Address already in use\n", 1);
  fail_at_startup(traceback, 1);
  fail_at_startup(traceback, 1);
  CHECK(f.A("py").state == AgentState::kRunning);
  fail_at_startup(traceback, 1);
  CHECK(f.A("py").state == AgentState::kFailed);
  CHECK(f.backend.launches.size() == 5);  // 4 restarts of the 10 allowed
  CHECK(f.A("py").reason ==
        "crash loop: failed at start-up 3 times in a row the same way (rank 0 exited with code "
        "1): ModuleNotFoundError: No module named 'numpy'");
  CHECK(f.A("py").log_tail ==
        std::vector<std::string>{
            "Traceback (most recent call last):", "  File \"/opt/agent.py\", line 3, in <module>",
            "    import numpy", "ModuleNotFoundError: No module named 'numpy'"});
  const std::string summary = f.rc->Summary();
  CHECK_THAT(summary, Catch::Matchers::Contains(
                          "agent py failed after 4 restarts: crash loop: failed at start-up 3 "
                          "times in a row the same way"));
  CHECK_THAT(summary, Catch::Matchers::Contains("the last lines of rank0.log:\n"
                                                "    Traceback (most recent call last):\n"));
  CHECK_THAT(summary,
             Catch::Matchers::Contains("    ModuleNotFoundError: No module named 'numpy'\n"));
  // status.json carries the tail.
  const auto back = RunStatusFromJson(RunStatusToJson(f.rc->status()));
  REQUIRE(back.ok());
  CHECK(back->FindAgent("py")->log_tail == f.A("py").log_tail);
}

TEST_CASE(
    "under mpirun the first rank to fail varies; the same failure is a crash loop all the same") {
  LogDir logs;
  Fixture f;
  auto a = MpiAgent(logs.path);
  a.restart.max_restarts = 10;
  f.Make({a});
  for (int attempt = 0; attempt < 3; ++attempt) {
    const int first = attempt % 2;  // rank 0, then rank 1, then rank 0 fails first
    const int restart = f.A("m").restarts;
    for (int r = 0; r < 2; ++r) {
      logs.Append(fmt::format("rank{}.log", r), "ModuleNotFoundError: No module named 'numpy'\n");
      logs.Write(fmt::format("rank{}.exit", r),
                 fmt::format(R"({{"rank":{},"pid":{},"exit_code":1,"signal":0,)"
                             R"("restart_count":{},"time":{}}})",
                             r, 5000 + r, restart, r == first ? 100.0 : 100.5));
    }
    f.backend.Exit("m", -1, *f.backend.live["m"].begin(), 1);
    f.rc->Tick();
    f.clock.AdvanceSeconds(30);
    f.rc->Tick();
  }
  CHECK(f.A("m").state == AgentState::kFailed);
  CHECK(f.A("m").restarts == 2);
  CHECK(f.A("m").reason ==
        "crash loop: failed at start-up 3 times in a row the same way (rank 0 exited with code "
        "1): ModuleNotFoundError: No module named 'numpy'");
}

TEST_CASE("failures after a step, or past the start-up window, are no crash loop") {
  LogDir logs;
  Fixture f;
  auto a = MakeAgent("a", 1, /*max_restarts=*/4);
  a.launch.log_dir = logs.path;
  a.restart.crash_loop_after = 2;
  f.Make({a});
  for (int n = 0; n < 4; ++n) {
    REQUIRE(f.backend.live["a"].size() == 1);
    if (n % 2 == 0) {
      f.rc->OnTelemetry(Heartbeat("a", 0, f.A("a").restarts, 5));  // it trained a step
    } else {
      f.clock.AdvanceSeconds(RunController::kStartupWindowS + 1);  // it ran a while
    }
    logs.Append("rank0.log", "RuntimeError: CUDA error: an illegal memory access\n");
    f.backend.Exit("a", 0, *f.backend.live["a"].begin(), 0, SIGABRT);
    f.rc->Tick();
    f.clock.AdvanceSeconds(60);
    f.rc->Tick();
  }
  CHECK(f.A("a").state == AgentState::kRunning);
  CHECK(f.A("a").restarts == 4);
}

TEST_CASE("an agent that exits 75 (its bus is not there yet) is retried, never a crash loop") {
  LogDir logs;
  Fixture f;
  auto a = MakeAgent("a", 1, /*max_restarts=*/3);
  a.launch.log_dir = logs.path;
  f.Make({a});
  for (int n = 0; n < 4; ++n) {
    REQUIRE(f.backend.live["a"].size() == 1);
    logs.Append("rank0.log", "agent-worker: UNAVAILABLE: bus 10.0.0.1:20000 not reachable\n");
    f.backend.Exit("a", 0, *f.backend.live["a"].begin(), kExitTempFail);
    f.rc->Tick();
    f.clock.AdvanceSeconds(59);
    f.rc->Tick();
  }
  CHECK(f.A("a").state == AgentState::kFailed);
  CHECK(f.A("a").restarts == 3);  // max_restarts spent, with backoff: 2, 4, 8 s
  CHECK_THAT(f.A("a").reason, !Catch::Matchers::Contains("crash loop"));
  CHECK_THAT(
      f.rc->Summary(),
      Catch::Matchers::Contains("    agent-worker: UNAVAILABLE: bus 10.0.0.1:20000 not reachable"));
}

TEST_CASE("resume after a stop or a lost controller spends no restart; after a failure it does") {
  RunStatus before;
  AgentStatus stopped = Recorded("stopped", AgentState::kStopped, 2);
  stopped.resumes = 1;  // an earlier stop and resume
  // "cut" was running when its controller was killed; "backing-off" had
  // failed and was waiting for its restart.
  before.agents = {stopped, Recorded("cut", AgentState::kRunning, 1),
                   Recorded("backing-off", AgentState::kRestarting, 1)};

  ManualClock clock;
  FakeBackend backend;
  RunController rc(
      "test", "/run",
      {MakeAgent("stopped", 1, 2), MakeAgent("cut", 1, 2), MakeAgent("backing-off", 1, 2)},
      &backend, &clock);
  rc.Resume(before);
  rc.Start();
  CHECK(rc.status().FindAgent("stopped")->restarts == 3);
  CHECK(rc.status().FindAgent("stopped")->resumes == 2);
  CHECK(rc.status().FindAgent("cut")->resumes == 1);
  CHECK(rc.status().FindAgent("backing-off")->resumes == 0);
  // "stopped" has one restart after a failure to its name (of 2, 1 was a
  // resume) and this resume is none: a SIGKILL now is its second failure,
  // which max_restarts 2 still restarts.
  backend.Exit("stopped", 0, *backend.live["stopped"].begin(), 0, SIGKILL);
  // "backing-off" has spent both of its restarts (1 before, this resume).
  backend.Exit("backing-off", 0, *backend.live["backing-off"].begin(), 0, SIGKILL);
  rc.Tick();
  clock.AdvanceSeconds(2.1);
  rc.Tick();
  CHECK(rc.status().FindAgent("stopped")->state == AgentState::kRunning);
  CHECK(rc.status().FindAgent("stopped")->restarts == 4);
  CHECK(rc.status().FindAgent("backing-off")->state == AgentState::kFailed);
  const auto back = RunStatusFromJson(RunStatusToJson(rc.status()));
  REQUIRE(back.ok());
  CHECK(back->FindAgent("stopped")->resumes == 2);
}

}  // namespace agentrt
