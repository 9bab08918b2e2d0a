// What the tests of the run driver's services share: a real RunController
// (started) over a fake backend and a ManualClock for a config, and an observer
// that records what the run says. No process is started.
#pragma once

#include <catch2/catch.hpp>
#include <memory>
#include <string>
#include <vector>

#include "scheduler/loader.h"
#include "scheduler/run_driver.h"
#include "tests/common/temp_dir.h"
#include "tests/scheduler/fake_backend.h"

namespace agentrt::testing {

class RecordingObserver final : public RunObserver {
 public:
  void Event(const std::string& line) override { events.push_back(line); }
  void Warn(const std::string& text) override { warnings.push_back(text); }
  void Progress(const RunStatus&, double, bool) override {}
  std::vector<std::string> events, warnings;
};

struct SupervisedRun {
  TempDir scratch;
  ManualClock clock;
  FakeBackend backend;
  RecordingObserver observer;
  Plan plan;
  std::unique_ptr<RunDir> dir;
  std::unique_ptr<RunController> controller;

  // `yaml`: an agents.yaml without a cluster block (one 8-CPU node is); its
  // run directory goes under the scratch folder.
  explicit SupervisedRun(const std::string& yaml) {
    const std::string cluster =
        "cluster:\n  nodes: [{name: n1, cpus: 8}]\n"
        "  ports: {first: 32000, last: 32999, per_agent: 16}\n";
    auto config = LoadConfigString(cluster + yaml, scratch.Path("agents.yaml"));
    REQUIRE(config.ok());
    config->run.dir = scratch.Path("runs");
    PrepareOptions options;
    options.lease_ports = false;  // nothing binds them; tests running at once need not queue
    auto prepared = PrepareRun(*config, InventoryRequest{}, nullptr, options);
    REQUIRE(prepared.ok());
    plan = std::move(prepared->plan);
    dir = std::make_unique<RunDir>(std::move(prepared->dir));
    controller = std::make_unique<RunController>(
        plan.run, dir->path(), SupervisedAgentsOf(plan, *dir, "127.0.0.1:1", "ipc:///unused"),
        &backend, &clock);
    controller->Start();
  }
};

}  // namespace agentrt::testing
