// The run driver's status writer alone, on a real RunController over a fake
// backend and a ManualClock: a line per agent state change, status.json at
// once on a state change and at most every MinIntervalS (0.2 s for a small
// run, 1 s from 1,000 agents) for anything else.
#include "scheduler/status_writer.h"

#include <catch2/catch.hpp>
#include <filesystem>
#include <memory>
#include <string>

#include "comms/telemetry.h"
#include "tests/scheduler/supervised_run.h"

namespace agentrt {
namespace {

namespace fs = std::filesystem;
using testing::SupervisedRun;

struct Fixture : SupervisedRun {
  std::unique_ptr<StatusWriter> writer;

  Fixture() : SupervisedRun("run: {name: st}\nagents: [{name: a}, {name: b}]\n") {
    writer = std::make_unique<StatusWriter>(dir->StatusPath(), controller.get(), nullptr, 1.0e9,
                                            &clock, &observer);
  }
  // True when status.json was written since the last call (which removes it).
  bool Written() {
    const bool written = fs::exists(dir->StatusPath());
    fs::remove(dir->StatusPath());
    return written;
  }
  void Step(const std::string& agent, int64_t step) {
    TelemetryMessage m;
    m.type = TelemetryType::kHeartbeat;
    m.agent = agent;
    m.rank = 0;
    m.step = step;
    controller->OnTelemetry(m);
  }
};

TEST_CASE("status writer: the first status and a line for every agent") {
  Fixture f;
  f.writer->Start();
  auto status = ReadRunStatusFile(f.dir->StatusPath());
  REQUIRE(status.ok());
  CHECK(status->agents.size() == 2);
  CHECK(status->started_unix_s == 1.0e9);
  REQUIRE(f.observer.events.size() == 2);
  CHECK_THAT(f.observer.events[0], Catch::StartsWith("[    0.0s] a running (restart 0, pids "));
  CHECK_THAT(f.observer.events[1], Catch::StartsWith("[    0.0s] b running"));
}

TEST_CASE("status writer: progress is written at most every 1 ms per agent, 0.2 s to 1 s") {
  CHECK(StatusWriter::MinIntervalS(2) == Approx(0.2));
  CHECK(StatusWriter::MinIntervalS(500) == Approx(0.5));
  CHECK(StatusWriter::MinIntervalS(10000) == Approx(1.0));
}

TEST_CASE("status writer: a state change at once, progress at most every 0.2 s (2 agents)") {
  Fixture f;
  f.writer->Start();
  REQUIRE(f.Written());
  f.writer->Update();
  CHECK_FALSE(f.Written());  // nothing changed
  f.Step("a", 10);
  f.clock.AdvanceSeconds(0.15);
  f.writer->Update();
  CHECK_FALSE(f.Written());  // a step, within the interval
  f.clock.AdvanceSeconds(0.1);
  f.writer->Update();
  CHECK(f.Written());
  CHECK(f.observer.events.size() == 2);  // no state changed: no line
  // b exits with an error: written at once, with a line that says why.
  f.backend.KillAll("b");
  f.controller->Tick();
  f.writer->Update();
  CHECK(f.Written());
  REQUIRE(f.observer.events.size() == 3);
  CHECK_THAT(f.observer.events[2], Catch::StartsWith("[    0.2s] b "));  // 0.25 s
  f.writer->Finish();
  auto last = ReadRunStatusFile(f.dir->StatusPath());
  REQUIRE(last.ok());
  CHECK(last->FindAgent("a")->step == 10);
}

}  // namespace
}  // namespace agentrt
