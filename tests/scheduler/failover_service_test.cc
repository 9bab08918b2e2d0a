// The run driver's node failover alone: a failed agent on a down node moves
// to a spare (its launch and plan.json rewritten), stays where it was when no
// node of its is down or nobody can say, and is held for a requeue when no
// spare fits.
#include "scheduler/failover_service.h"

#include <catch2/catch.hpp>
#include <memory>
#include <set>
#include <string>

#include "tests/scheduler/supervised_run.h"

namespace agentrt {
namespace {

using testing::SupervisedRun;

struct Fixture : SupervisedRun {
  std::set<std::string> down;
  bool know_down = true;
  std::unique_ptr<FailoverService> failover;

  // The plan's node n1 and, with `spare`, an idle n2 like it.
  explicit Fixture(bool spare) : SupervisedRun("run: {name: fo}\nagents: [{name: a}]\n") {
    std::vector<NodeSpec> nodes(1);
    nodes[0].name = "n1";
    nodes[0].cpus = 8;
    if (spare) {
      nodes.push_back(nodes[0]);
      nodes[1].name = "n2";
    }
    failover = std::make_unique<FailoverService>(
        &plan, *dir, nodes,
        [this]() -> Result<std::set<std::string>> {
          if (!know_down) return Unavailable("scontrol: no answer");
          return down;
        },
        RunEndpoints{"10.0.0.1:5000", "tcp://10.0.0.1:6000", "n1"}, &observer);
  }
  // The agent's launch as the supervisor holds it.
  AgentLaunch Launch() {
    return SupervisedAgentsOf(plan, *dir, "10.0.0.1:5000", "tcp://10.0.0.1:6000", "n1")
        .at(0)
        .launch;
  }
};

TEST_CASE("failover: an agent on a down node moves to the spare; plan.json says so") {
  Fixture f(/*spare=*/true);
  AgentLaunch launch = f.Launch();
  REQUIRE(launch.ranks.at(0).node == "n1");
  f.down = {"n1"};
  const RelaunchAdvice advice = f.failover->Advise(launch);
  CHECK_FALSE(advice.hold);
  REQUIRE(advice.failures.size() == 1);
  CHECK(advice.failures[0].node == "n1");
  CHECK(launch.ranks.at(0).node == "n2");
  CHECK(launch.master_addr == "n2");
  auto written = ReadPlanFile(f.dir->PlanPath());
  REQUIRE(written.ok());
  CHECK(written->agents.at(0).placement.at(0).node == "n2");
  CHECK(f.observer.events.back() == "agentctl run: node n1 failed: a moves to n2");
}

TEST_CASE("failover: once the allocation lost a node, every relaunch overlaps other steps") {
  // SLURM keeps counting the CPUs of steps that started before the job
  // shrank: a relaunch on a healthy node must not wait for them.
  Fixture f(/*spare=*/true);
  AgentLaunch launch = f.Launch();
  f.failover->Advise(launch);
  CHECK_FALSE(launch.overlap_steps);
  f.down = {"n2"};  // the spare, not the agent's node
  launch = f.Launch();
  f.failover->Advise(launch);
  CHECK(launch.ranks.at(0).node == "n1");
  CHECK(launch.overlap_steps);
  f.down = {};  // it came back, but the job has dropped it
  launch = f.Launch();
  f.failover->Advise(launch);
  CHECK(launch.overlap_steps);
  f.know_down = false;  // and when SLURM cannot say which nodes are down
  launch = f.Launch();
  f.failover->Advise(launch);
  CHECK(launch.overlap_steps);
}

TEST_CASE("failover: no node down, or nobody can say, relaunches where it was") {
  Fixture f(/*spare=*/true);
  AgentLaunch launch = f.Launch();
  CHECK_FALSE(f.failover->Advise(launch).hold);
  CHECK(launch.ranks.at(0).node == "n1");
  f.down = {"n1"};
  f.know_down = false;
  const RelaunchAdvice advice = f.failover->Advise(launch);
  CHECK_FALSE(advice.hold);
  CHECK(advice.failures.empty());
  CHECK(launch.ranks.at(0).node == "n1");
  REQUIRE(f.observer.warnings.size() == 1);
  CHECK_THAT(f.observer.warnings[0], Catch::Contains("scontrol: no answer") &&
                                         Catch::Contains("a is relaunched where it was"));
}

TEST_CASE("failover: with no spare that fits the relaunch is held for a requeue") {
  Fixture f(/*spare=*/false);
  AgentLaunch launch = f.Launch();
  f.down = {"n1"};
  const RelaunchAdvice advice = f.failover->Advise(launch);
  CHECK(advice.hold);
  CHECK_THAT(advice.reason, Catch::StartsWith("node n1 failed and ") &&
                                Catch::EndsWith("requeueing the allocation"));
  CHECK(launch.ranks.at(0).node == "n1");
}

}  // namespace
}  // namespace agentrt
