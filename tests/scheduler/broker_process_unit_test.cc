// The run's broker supervision (scheduler/broker_process.h) over a fake
// spawner and a clock moved by hand: restarts, the doubling retry delay,
// a port taken, a start that never serves, and the lines the user is told.
// No process is started (scheduler_broker_process_test runs the real one).
#include <signal.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "common/file_util.h"
#include "comms/bus_server.h"
#include "scheduler/broker_process.h"
#include "tests/common/temp_dir.h"
#include "tests/scheduler/fake_spawner.h"

namespace agentrt {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;
using testing::FakeSpawner;

// The value after `flag` in a spawn's argv.
std::string Arg(const SpawnRequest& r, const std::string& flag) {
  for (size_t i = 0; i + 1 < r.argv.size(); ++i)
    if (r.argv[i] == flag) return r.argv[i + 1];
  FAIL("no " << flag << " in the broker's command line");
  return "";
}

// What a spawned "broker" does: serves (writes its report, then its address,
// as agentrt-bus does), exits at once unable to listen, or stays silent.
enum class Broker { kServes, kCannotListen, kSilent };

struct Harness {
  testing::TempDir tmp{"agentrt-broker-unit"};
  RunDir dir{tmp.path};
  ManualClock clock;
  FakeSpawner::Shared shared;
  Broker next = Broker::kServes;

  Harness() {
    shared.on_spawn = [this](const SpawnRequest& r, pid_t pid) {
      if (next == Broker::kCannotListen) {
        shared.exits.push_back({pid, kBrokerExitCannotListen, 0});
      } else if (next == Broker::kServes) {
        BrokerReport report;
        report.pid = pid;
        report.port = 31000;
        report.incarnation = 0xabcdef;
        REQUIRE(WriteFileAtomic(Arg(r, "--report-file"), report.ToJson().dump()).ok());
        REQUIRE(WriteFileAtomic(Arg(r, "--address-file"), "127.0.0.1:31000\n").ok());
      }
    };
  }
  BrokerProcessOptions Options() {
    BrokerProcessOptions o;
    o.program = "/opt/agentrt/bin/agentrt-bus";
    o.port = 31000;
    o.ready_timeout = seconds(10);
    o.clock = &clock;
    o.make_spawner = [this] { return std::make_unique<FakeSpawner>(&shared); };
    return o;
  }
  void Kill(pid_t pid) { shared.exits.push_back({pid, 0, SIGKILL}); }
};

TEST_CASE(
    "a broker that dies is started again at once, and a start that fails after a delay "
    "that doubles up to 4 s") {
  Harness h;
  auto started = BrokerProcess::Start(h.dir, h.Options());
  REQUIRE(started.ok());
  BrokerProcess& broker = **started;
  CHECK(broker.pid() == 1000);
  CHECK(h.shared.spawned[0].argv[0] == "/opt/agentrt/bin/agentrt-bus");
  CHECK(Arg(h.shared.spawned[0], "--plan") == h.dir.PlanPath());
  CHECK(h.shared.spawned[0].log_path == h.dir.BusProcessLogPath());
  REQUIRE(broker.Report().has_value());
  CHECK(broker.Report()->bus.broker_pid == 1000);
  CHECK(broker.Supervise().empty());  // nothing happened

  h.Kill(1000);
  std::vector<std::string> lines = broker.Supervise();
  REQUIRE(lines.size() == 2);
  CHECK(lines[0] ==
        "the bus broker (pid 1000) was killed by signal 9 (Killed); starting it "
        "again on port 31000");
  CHECK(lines[1] ==
        "the bus broker serves again on port 31000 (pid 1001, restart 1, 0.00 s after it died)");
  CHECK(broker.restarts() == 1);
  CHECK(broker.Report()->bus.broker_pid == 1001);
  CHECK(broker.Report()->bus.broker_restarts == 1);

  // It cannot be started again for a while: each try says when the next is.
  h.shared.fail_spawns = true;
  h.Kill(1001);
  lines = broker.Supervise();
  REQUIRE(lines.size() == 2);
  CHECK_THAT(lines[1], Catch::Contains("cannot start the bus broker") &&
                           Catch::EndsWith("trying again in 0.25 s"));
  const size_t tries = h.shared.spawned.size();
  CHECK(broker.Supervise().empty());  // not before its time
  h.clock.Advance(milliseconds(249));
  CHECK(broker.Supervise().empty());
  CHECK(h.shared.spawned.size() == tries);
  h.clock.Advance(milliseconds(1));
  for (const char* next : {"0.50", "1.00", "2.00", "4.00", "4.00"}) {
    lines = broker.Supervise();
    REQUIRE(lines.size() == 1);
    CHECK_THAT(lines[0], Catch::EndsWith(std::string("trying again in ") + next + " s"));
    h.clock.AdvanceSeconds(std::stod(next));
  }
  CHECK(h.shared.spawned.size() == tries + 5);
  CHECK(broker.Report()->bus.broker_pid == 0);  // none serves meanwhile

  h.shared.fail_spawns = false;
  lines = broker.Supervise();
  REQUIRE(lines.size() == 1);
  CHECK_THAT(lines[0], Catch::Contains("restart 2, 11.75 s after it died"));
  // The delay starts over: the next death is answered at once.
  h.Kill(broker.pid());
  lines = broker.Supervise();
  REQUIRE(lines.size() == 2);
  CHECK_THAT(lines[1], Catch::Contains("restart 3, 0.00 s after it died"));
}

TEST_CASE("a broker that cannot listen, or never serves, is said, killed and tried again") {
  SECTION("at the run's start: AlreadyExists, so the caller may move to another port") {
    Harness h;
    h.next = Broker::kCannotListen;
    auto started = BrokerProcess::Start(h.dir, h.Options());
    REQUIRE_FALSE(started.ok());
    CHECK(started.status().code() == StatusCode::kAlreadyExists);
    CHECK_THAT(started.status().message(), Catch::Contains("cannot listen on 127.0.0.1:31000"));
  }
  SECTION("at a restart: tried again on its port") {
    Harness h;
    auto started = BrokerProcess::Start(h.dir, h.Options());
    REQUIRE(started.ok());
    BrokerProcess& broker = **started;
    h.next = Broker::kCannotListen;
    h.Kill(1000);
    std::vector<std::string> lines = broker.Supervise();
    REQUIRE(lines.size() == 2);
    CHECK(lines[1] ==
          "the bus broker cannot listen on 127.0.0.1:31000 (port taken?); trying again in 0.25 s");
    // The next one starts but never serves: killed once ready_timeout has passed.
    h.next = Broker::kSilent;
    h.clock.Advance(milliseconds(250));
    CHECK(broker.Supervise().empty());
    const pid_t silent = h.shared.next_pid - 1;
    h.clock.Advance(seconds(9));
    CHECK(broker.Supervise().empty());
    h.clock.Advance(seconds(1));
    lines = broker.Supervise();
    REQUIRE(lines.size() == 1);
    CHECK_THAT(lines[0], Catch::StartsWith("the bus broker did not serve within 10 s of its "
                                           "start, and was killed") &&
                             Catch::EndsWith("trying again in 0.50 s"));
    CHECK(h.shared.signals.back() == std::make_pair(silent, SIGKILL));
  }
}

TEST_CASE("a broker shut down is sent SIGTERM and not started again") {
  Harness h;
  h.shared.sigterm_ends = true;
  auto started = BrokerProcess::Start(h.dir, h.Options());
  REQUIRE(started.ok());
  BrokerProcess& broker = **started;
  broker.Shutdown(seconds(5));
  REQUIRE(h.shared.signals.size() == 1);
  CHECK(h.shared.signals[0] == std::make_pair(pid_t{1000}, SIGTERM));
  CHECK(broker.pid() == 0);
  CHECK(broker.Supervise().empty());
  CHECK(h.shared.spawned.size() == 1);
}

}  // namespace
}  // namespace agentrt
