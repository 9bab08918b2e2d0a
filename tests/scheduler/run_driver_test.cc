// The run driver as agentctl drives it, with a fake backend and a ManualClock:
// preparing a run (one inventory rule, the plan made once), then Start / Step /
// Finish — what it writes into the run directory, how stop signals become
// SIGTERM then SIGKILL, and the exit code. The bus is the real broker process
// (agentrt-bus), telemetry the real intake; no agent process is started.
#include "scheduler/run_driver.h"

#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <string>
#include <vector>

#include "common/file_util.h"
#include "scheduler/loader.h"
#include "scheduler/planner.h"
#include "tests/common/programs.h"
#include "tests/common/temp_dir.h"
#include "tests/scheduler/fake_backend.h"

namespace agentrt {
namespace {

namespace fs = std::filesystem;
using testing::FakeBackend;
using testing::TempDir;

class RecordingObserver final : public RunObserver {
 public:
  void Event(const std::string& line) override { events.push_back(line); }
  void Warn(const std::string& text) override { warnings.push_back(text); }
  void Progress(const RunStatus&, double, bool force) override { forced += force; }
  bool Saw(const std::string& part) const {
    for (const auto& e : events) {
      if (e.find(part) != std::string::npos) return true;
    }
    return false;
  }
  std::vector<std::string> events, warnings;
  int forced = 0;
};

class FakeStops final : public StopRequests {
 public:
  int count() const override { return n; }
  int last_signal() const override { return sig; }
  void Send(int s) {
    sig = s;
    ++n;
  }
  int n = 0;
  int sig = 0;
};

Config LoadConfig(const TempDir& dir, const std::string& yaml) {
  auto c = LoadConfigString(yaml, dir.Path("agents.yaml"));
  REQUIRE(c.ok());
  c->run.dir = dir.Path("runs");
  return *c;
}

constexpr char kTwoAgents[] = R"(run: {name: drv}
cluster:
  nodes: [{name: n1, gpus: 2, cpus: 8}]
  ports: {first: 31000, last: 31999, per_agent: 16}
agents:
  - {name: a, gpus: 1}
  - {name: b, ranks: 2}
)";

TEST_CASE("preparing a run plans once, before the run directory exists, and records it") {
  TempDir dir;
  Config config = LoadConfig(dir, kTwoAgents);
  InventoryRequest request;
  request.config_file = "agents.yaml";
  auto prepared = PrepareRun(config, request, nullptr);
  REQUIRE(prepared.ok());
  CHECK(prepared->plan.run_dir == prepared->dir.path());
  CHECK(fs::is_directory(prepared->dir.path()));
  CHECK(prepared->plan.agents[0].checkpoint_dir == "checkpoints/a");
  CHECK(prepared->inventory_source == "agents.yaml cluster:");

  Config big = LoadConfig(dir, std::string(kTwoAgents) + "  - {name: c, gpus: 4}\n");
  auto infeasible = PrepareRun(big, request, nullptr);
  REQUIRE_FALSE(infeasible.ok());
  CHECK(infeasible.status().code() == StatusCode::kResourceExhausted);
  CHECK_THAT(infeasible.status().message(), Catch::Contains("infeasible on agents.yaml cluster:"));
  int runs = 0;
  for (const auto& e : fs::directory_iterator(dir.Path("runs"))) runs += e.is_directory();
  CHECK(runs == 1);  // nothing made for the infeasible one
}

TEST_CASE("one inventory rule: --cluster, then SLURM, then the config's block, then the fallback") {
  TempDir dir;
  const std::string inv = dir.Write("inv.yaml", "cluster:\n  nodes: [{name: big, gpus: 8}]\n");
  const std::string scontrol = dir.Write(
      "nodes.txt", "NodeName=s1 CPUAlloc=0 CPUTot=8 Gres=gpu:4 State=IDLE Partitions=p\n");
  int live_reads = 0;
  ScontrolReader live = [&]() -> Result<std::string> {
    ++live_reads;
    return std::string("NodeName=live1 CPUAlloc=0 CPUTot=8 Gres=gpu:2 State=IDLE Partitions=p\n");
  };
  {
    Config c = LoadConfig(dir, kTwoAgents);
    InventoryRequest r;
    r.cluster_file = inv;
    auto i = ResolveInventory(c, r, live);
    REQUIRE(i.ok());
    CHECK(i->nodes.at(0).name == "big");
  }
  {
    Config c = LoadConfig(dir, kTwoAgents);
    InventoryRequest r;
    r.cluster_file = inv;
    r.live_slurm = true;
    auto i = ResolveInventory(c, r, live);
    REQUIRE_FALSE(i.ok());
    CHECK_THAT(i.status().message(), Catch::Contains("--backend slurm"));
  }
  {
    Config c = LoadConfig(dir, kTwoAgents);
    InventoryRequest r;
    r.config_file = "agents.yaml";
    r.scontrol = scontrol;
    auto i = ResolveInventory(c, r, live);
    REQUIRE(i.ok());
    CHECK(i->nodes.at(0).name == "s1");
    REQUIRE(i->warnings.size() == 1);  // the config's own block is not used, and it says so
    CHECK_THAT(i->warnings[0], Catch::Contains("cluster.nodes block is not used"));
  }
  {
    Config c = LoadConfig(dir, kTwoAgents);
    auto i = ResolveInventory(c, InventoryRequest{}, live);
    REQUIRE(i.ok());
    CHECK(i->nodes.at(0).name == "n1");
    CHECK(live_reads == 0);
  }
  {
    Config c = LoadConfig(dir, "agents: [{name: a}]\n");
    InventoryRequest r;
    r.fallback = InventoryRequest::Fallback::kSlurm;
    auto i = ResolveInventory(c, r, live);
    REQUIRE(i.ok());
    CHECK(i->nodes.at(0).name == "live1");
    CHECK(live_reads == 1);
    auto local = ResolveInventory(c, InventoryRequest{}, live);
    REQUIRE(local.ok());
    CHECK(local->source == "local machine");
  }
  {
    // A live allocation keeps one CPU of every node for the controller's task:
    // 8 CPUs hold 7 ranks (the allocation asks each node for ranks + 1 tasks).
    Config c = LoadConfig(dir, "agents: [{name: a, ranks: 8}]\n");
    InventoryRequest r;
    r.live_slurm = true;
    auto i = ResolveInventory(c, r, live);
    REQUIRE(i.ok());
    CHECK(i->nodes.at(0).cpus == 7);
    CHECK(i->controller_cpu_reserved);
    r.live_slurm = false;
    r.scontrol = "-";
    auto preview = ResolveInventory(c, r, live);
    REQUIRE(preview.ok());
    CHECK(preview->nodes.at(0).cpus == 8);
    PlanResult plan = MakePlan(c, *i);
    REQUIRE_FALSE(plan.feasible());
    CHECK_THAT(plan.infeasible().reason,
               Catch::Contains("a needs 8 CPU slots on one node; the most free is 7 on live1") &&
                   Catch::Contains("kept for the run controller's task"));
  }
}

struct DriverFixture {
  TempDir scratch;
  ManualClock clock;
  FakeBackend backend;
  RecordingObserver observer;
  FakeStops stops;
  std::unique_ptr<RunDriver> driver;

  DriverFixture() {
    Config config = LoadConfig(scratch, kTwoAgents);
    auto prepared = PrepareRun(config, InventoryRequest{}, nullptr);
    REQUIRE(prepared.ok());
    RunDriverOptions options;
    options.poll = std::chrono::milliseconds(0);
    options.broker_program = testing::ProgramPath("agentrt-bus");
    driver = std::make_unique<RunDriver>(std::move(prepared->plan), std::move(prepared->dir),
                                         &backend, &clock, &observer, &stops, options);
  }
  const RunDir& dir() const { return driver->dir(); }
};

TEST_CASE("the driver starts the bus, writes the run's files and launches every agent") {
  DriverFixture f;
  REQUIRE(f.driver->Start().ok());
  CHECK(ReadWholeFile(f.dir().ControllerPidPath()).value_or("") ==
        std::to_string(::getpid()) + "\n");
  auto plan = ReadPlanFile(f.dir().PlanPath());
  REQUIRE(plan.ok());
  CHECK(plan->bus.port > 0);  // the port the bus actually listens on
  CHECK(f.driver->bus_address() == "127.0.0.1:" + std::to_string(plan->bus.port));
  struct stat st {};
  REQUIRE(::stat(f.dir().TokenPath("b").c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == 0600);
  REQUIRE(f.backend.launches.size() == 2);
  const AgentLaunch& a = f.backend.launches[0];
  CHECK(a.checkpoint_dir == f.dir().path() + "/checkpoints/a");  // resolved against the run dir
  CHECK(a.bus_address == f.driver->bus_address());
  CHECK(a.token_file == f.dir().TokenPath("a"));
  CHECK(f.backend.launches[1].use_mpirun);  // b: 2 CPU ranks, an MPI world
  CHECK(f.observer.Saw("a running"));
  auto status = ReadRunStatusFile(f.dir().StatusPath());
  REQUIRE(status.ok());
  CHECK(status->agents.size() == 2);

  // Both agents end well: the run succeeds, exit 0, and controller.pid is gone.
  for (const auto& r : f.backend.live) {
    for (pid_t pid : std::set<pid_t>(r.second)) f.backend.Exit(r.first, -1, pid, 0);
  }
  while (f.driver->Step()) {
  }
  CHECK(f.driver->Finish() == 0);
  CHECK(ReadRunStatusFile(f.dir().StatusPath())->state == RunState::kSucceeded);
  CHECK(f.observer.forced == 1);
  const std::string pid_file = f.dir().ControllerPidPath();
  f.driver.reset();
  CHECK_FALSE(fs::exists(pid_file));
}

TEST_CASE("a stop signal asks every agent to stop; a second one kills; the run ends stopped") {
  DriverFixture f;
  REQUIRE(f.driver->Start().ok());
  REQUIRE(f.driver->Step());
  f.stops.Send(SIGINT);
  REQUIRE(f.driver->Step());
  CHECK(f.backend.SignalsTo("a", SIGTERM) == 1);
  CHECK(f.backend.SignalsTo("b", SIGTERM) == 1);
  CHECK(f.observer.Saw("SIGINT received: stopping every agent"));
  f.stops.Send(SIGINT);
  REQUIRE(f.driver->Step());
  CHECK(f.backend.SignalsTo("a", SIGKILL) == 1);
  f.backend.KillAll("a");
  f.backend.KillAll("b");
  while (f.driver->Step()) {
  }
  CHECK(f.driver->Finish() == 130);
  CHECK(f.driver->last_signal() == SIGINT);
  CHECK(ReadRunStatusFile(f.dir().StatusPath())->state == RunState::kStopped);
}

TEST_CASE("a failed agent is restarted after its backoff, on the clock, then the run fails") {
  DriverFixture f;
  REQUIRE(f.driver->Start().ok());
  const pid_t a0 = *f.backend.live["a"].begin();
  f.backend.Exit("a", 0, a0, 3);
  REQUIRE(f.driver->Step());
  CHECK(f.backend.launches.size() == 2);  // not yet: backoff_s
  f.clock.AdvanceSeconds(2.5);
  REQUIRE(f.driver->Step());
  REQUIRE(f.backend.launches.size() == 3);
  CHECK(f.backend.launches[2].name == "a");
  CHECK(f.backend.launches[2].restart_count == 1);
  for (int i = 0; i < 2; ++i) {  // every incarnation fails the same way at start-up
    const pid_t pid = *f.backend.live["a"].begin();
    f.backend.Exit("a", 0, pid, 3);
    f.driver->Step();
    f.clock.AdvanceSeconds(60);  // past the doubled backoff
    f.driver->Step();
  }
  f.backend.KillAll("b", 0);
  while (f.driver->Step()) {
  }
  CHECK(f.driver->Finish() == 1);
  REQUIRE_FALSE(f.observer.warnings.empty());
  // The third identical failure at start-up is a crash loop (crash_loop_after 3).
  CHECK_THAT(f.observer.warnings.back(), Catch::Contains("agent a failed after 2 restarts"));
  CHECK_THAT(f.observer.warnings.back(), Catch::Contains("crash loop"));
}

}  // namespace
}  // namespace agentrt
