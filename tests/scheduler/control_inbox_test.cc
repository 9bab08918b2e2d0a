// The run driver's control inbox alone: requests written as the dashboard
// writes them (WriteControlRequest) are carried out on a real RunController
// over a fake backend, at most every kPollIntervalS on a ManualClock; what it
// cannot carry out is said.
#include "scheduler/control_inbox.h"

#include <signal.h>

#include <catch2/catch.hpp>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "scheduler/control.h"
#include "scheduler/loader.h"
#include "scheduler/run_driver.h"
#include "tests/common/temp_dir.h"
#include "tests/scheduler/fake_backend.h"

namespace agentrt {
namespace {

using testing::FakeBackend;
using testing::TempDir;

class Observer final : public RunObserver {
 public:
  void Event(const std::string& line) override { events.push_back(line); }
  void Warn(const std::string& text) override { warnings.push_back(text); }
  void Progress(const RunStatus&, double, bool) override {}
  std::vector<std::string> events, warnings;
};

struct Fixture {
  TempDir scratch;
  ManualClock clock;
  FakeBackend backend;
  Observer observer;
  std::unique_ptr<RunDir> dir;
  std::unique_ptr<RunController> controller;
  std::unique_ptr<ControlInbox> inbox;

  Fixture() {
    auto config = LoadConfigString(R"(run: {name: ctl}
cluster:
  nodes: [{name: n1, cpus: 8}]
  ports: {first: 33000, last: 33999, per_agent: 16}
agents: [{name: a}, {name: b}]
)",
                                   scratch.Path("agents.yaml"));
    REQUIRE(config.ok());
    config->run.dir = scratch.Path("runs");
    auto prepared = PrepareRun(*config, InventoryRequest{}, nullptr);
    REQUIRE(prepared.ok());
    dir = std::make_unique<RunDir>(std::move(prepared->dir));
    controller = std::make_unique<RunController>(
        prepared->plan.run, dir->path(),
        SupervisedAgentsOf(prepared->plan, *dir, "127.0.0.1:1", "ipc:///unused"), &backend, &clock);
    controller->Start();
    inbox = std::make_unique<ControlInbox>(*dir, controller.get(), &clock, &observer);
  }
  void Ask(const std::string& action, const std::string& agent = "") {
    ControlRequest r;
    r.action = action;
    r.agent = agent;
    r.by = "the test";
    REQUIRE(WriteControlRequest(*dir, r).ok());
  }
};

TEST_CASE("control inbox: a restart request replaces the agent, a stop request stops the run") {
  Fixture f;
  f.Ask("restart", "b");
  f.inbox->Poll();
  CHECK(f.backend.SignalsTo("b", SIGTERM) == 1);
  CHECK(f.backend.SignalsTo("a", SIGTERM) == 0);
  CHECK(f.observer.events.back() == "agentctl run: the test asked to restart b");
  f.Ask("stop");
  f.inbox->Poll();
  CHECK_FALSE(f.controller->stop_requested());  // not yet: within kPollIntervalS
  f.clock.AdvanceSeconds(ControlInbox::kPollIntervalS);
  f.inbox->Poll();
  CHECK(f.controller->stop_requested());
  CHECK(f.backend.SignalsTo("a", SIGTERM) == 1);
}

TEST_CASE("control inbox: what it cannot carry out is said, not dropped") {
  Fixture f;
  f.Ask("restart", "nobody");
  {
    std::ofstream junk(f.dir->ControlDir() + "/junk.json");
    junk << "not json";
  }
  f.inbox->Poll();
  REQUIRE_FALSE(f.observer.events.empty());
  CHECK_THAT(f.observer.events.back(), Catch::Contains("asked to restart nobody: "));
  REQUIRE(f.observer.warnings.size() == 1);
  CHECK_THAT(f.observer.warnings[0], Catch::Contains("junk.json"));
  CHECK(TakeControlRequests(*f.dir, nullptr).empty());  // every file taken
}

}  // namespace
}  // namespace agentrt
