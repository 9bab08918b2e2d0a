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
#include "tests/scheduler/supervised_run.h"

namespace agentrt {
namespace {

using testing::SupervisedRun;

constexpr char kTwoAgents[] = "run: {name: ctl}\nagents: [{name: a}, {name: b}]\n";

struct Fixture : SupervisedRun {
  std::unique_ptr<ControlInbox> inbox;

  Fixture() : SupervisedRun(kTwoAgents) {
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
