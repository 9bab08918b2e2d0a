// PBT as a service of the run driver, alone: a real RunController over a fake
// backend and a ManualClock, metrics reports fed in by hand. A member in the
// bottom of its population asks its donor for a fresh checkpoint; once that is
// committed (or checkpoint_wait_s passed) the member is replaced, and while it
// is down it takes the donor's checkpoint and new args, or keeps its own when
// there is nothing to adopt; lineage.jsonl says which.
#include "scheduler/pbt_service.h"

#include <signal.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "agent_runtime/checkpointer.h"
#include "tests/scheduler/supervised_run.h"

namespace agentrt {
namespace {

using testing::SupervisedRun;

constexpr char kPopulation[] = R"(run: {name: pbt}
agents:
  - {name: good, args: {lr: 0.001}}
  - {name: bad, args: {lr: 0.001}}
pbt:
  - name: pop
    agents: [good, bad]
    interval_steps: 100
    fraction: 0.5
    resample_probability: 0
    checkpoint_wait_s: 5
    hyperparameters:
      lr: {min: 0.0001, max: 0.01, perturb: [2.0, 2.0]}
)";

struct Fixture : SupervisedRun {
  std::unique_ptr<PbtService> pbt;

  Fixture() : SupervisedRun(kPopulation) {
    pbt = std::make_unique<PbtService>(&plan, *dir, controller.get(), nullptr, &clock, &observer);
  }

  // A metrics report of `agent`'s rank 0, current incarnation.
  void Report(const std::string& agent, int64_t step, double metric) {
    TelemetryMessage m;
    m.type = TelemetryType::kMetrics;
    m.agent = agent;
    m.step = step;
    m.metrics = {{"episode_return_mean", metric}};
    controller->OnTelemetry(m);
    pbt->OnReport(m);
  }
  // Both members judged: `bad` is the bottom, `good` its donor.
  void DecideExploit() {
    Report("good", 100, 10.0);
    Report("bad", 100, 1.0);
    Report("good", 200, 10.0);
    Report("bad", 200, 1.0);
    REQUIRE(backend.SignalsTo("good", SIGUSR2) == 1);  // the donor's fresh checkpoint, asked for
  }
  // The recipient's teardown ends; the controller relaunches it after the hook.
  void FinishReplacement() {
    REQUIRE(backend.SignalsTo("bad", SIGTERM) == 1);
    backend.KillAll("bad", SIGTERM);
    controller->Tick();
  }
  // The donor commits a checkpoint at `step` and says so.
  void CommitDonorCheckpoint(int64_t step) {
    CheckpointOptions o{.dir = dir->Resolve(plan.FindAgent("good")->checkpoint_dir),
                        .agent = "good",
                        .interval_s = 0};
    auto donor = Checkpointer::Create(o);
    REQUIRE(donor.ok());
    std::vector<float> weights(64, 1.5f);
    CheckpointState state;
    state.AddArray("w", weights.data(), "float32", {64}, sizeof(float));
    REQUIRE((*donor)->Save(step, state).ok());
    TelemetryMessage committed;
    committed.type = TelemetryType::kCheckpoint;
    committed.agent = "good";
    committed.step = step;
    committed.checkpoint_step = step;
    controller->OnTelemetry(committed);
  }
  std::vector<LineageRecord> Lineage() const {
    auto read = ReadLineageFile(dir->LineagePath());
    REQUIRE(read.ok());
    return *read;
  }
};

TEST_CASE("pbt service: past checkpoint_wait_s with nothing to adopt, the member keeps its own") {
  Fixture f;
  f.DecideExploit();
  f.pbt->Advance();
  CHECK(f.backend.SignalsTo("bad", SIGTERM) == 0);  // still waiting for the donor
  f.clock.AdvanceSeconds(6);
  f.pbt->Advance();
  const size_t launches = f.backend.launches.size();
  f.FinishReplacement();
  CHECK(f.backend.launches.size() == launches + 1);  // relaunched as its next incarnation
  const auto lineage = f.Lineage();
  REQUIRE(lineage.size() == 1);
  CHECK_FALSE(lineage[0].exploited());
  CHECK(lineage[0].decision.recipient == "bad");
  CHECK(lineage[0].decision.donor == "good");
  CHECK(f.plan.FindAgent("bad")->args["lr"] == 0.001);  // its own args too
  REQUIRE_FALSE(f.observer.warnings.empty());
  CHECK_THAT(f.observer.warnings.back(), Catch::Contains("bad keeps its own weights"));
}

TEST_CASE("pbt service: a committed donor checkpoint is adopted with the new args") {
  Fixture f;
  f.DecideExploit();
  f.CommitDonorCheckpoint(200);
  f.pbt->Advance();  // fresh: no need to wait out checkpoint_wait_s
  f.FinishReplacement();
  const auto lineage = f.Lineage();
  REQUIRE(lineage.size() == 1);
  CHECK(lineage[0].exploited());
  CHECK(lineage[0].donor_step == 200);
  CHECK(f.plan.FindAgent("bad")->args["lr"] == 0.002);  // perturbed by 2.0
  auto written = ReadPlanFile(f.dir->PlanPath());
  REQUIRE(written.ok());
  CHECK(written->FindAgent("bad")->args["lr"] == 0.002);  // and in plan.json for the relaunch
}

TEST_CASE(
    "pbt service: an exploit whose lineage line a dying controller never wrote is recovered") {
  Fixture f;
  f.DecideExploit();
  f.CommitDonorCheckpoint(200);
  f.pbt->Advance();
  f.FinishReplacement();
  REQUIRE(f.Lineage().size() == 1);
  // As if the controller had died after the adoption, before plan.json and the line.
  std::filesystem::remove(f.dir->LineagePath());
  Plan resumed = *ReadPlanFile(f.dir->PlanPath());
  resumed.FindAgent("bad")->args["lr"] = 0.001;
  REQUIRE(WriteRunPlan(resumed, f.dir->path()).ok());

  RecoverExploits(&resumed, *f.dir, &f.observer);
  const auto lineage = f.Lineage();
  REQUIRE(lineage.size() == 1);
  CHECK(lineage[0].exploited());
  CHECK(lineage[0].decision.recipient == "bad");
  CHECK(lineage[0].decision.donor == "good");
  CHECK(lineage[0].donor_step == 200);
  CHECK(lineage[0].why.find("recovered") == 0);
  CHECK(resumed.FindAgent("bad")->args["lr"] == 0.002);
  CHECK(ReadPlanFile(f.dir->PlanPath())->FindAgent("bad")->args["lr"] == 0.002);
  // Once written, nothing more: a second start recovers nothing.
  RecoverExploits(&resumed, *f.dir, &f.observer);
  CHECK(f.Lineage().size() == 1);
}

TEST_CASE(
    "pbt service: a lineage line the file refuses is kept, and written once it takes lines again") {
  Fixture f;
  // lineage.jsonl cannot be appended to (a folder stands in its place; as
  // root, file modes would not stop the append).
  std::filesystem::create_directories(f.dir->LineagePath());
  f.DecideExploit();
  f.CommitDonorCheckpoint(200);
  f.pbt->Advance();
  f.FinishReplacement();
  REQUIRE_FALSE(f.observer.warnings.empty());
  CHECK_THAT(f.observer.warnings.back(), Catch::Contains("is kept and written when the file"));
  const size_t warned = f.observer.warnings.size();
  f.pbt->Advance();  // still refused: not said again
  CHECK(f.observer.warnings.size() == warned);

  SECTION("once the file takes lines again, the line is written, once") {
    std::filesystem::remove(f.dir->LineagePath());
    f.pbt->Advance();
    auto lineage = f.Lineage();
    REQUIRE(lineage.size() == 1);
    CHECK(lineage[0].exploited());
    CHECK(lineage[0].donor_step == 200);
    f.pbt->Advance();
    CHECK(f.Lineage().size() == 1);
    CHECK(f.observer.warnings.size() == warned);
  }
  SECTION("a line never written is said when the service ends") {
    f.pbt.reset();
    CHECK(f.observer.warnings.size() == warned + 1);
    CHECK_THAT(f.observer.warnings.back(),
               Catch::Contains("1 lineage line(s) could not be written"));
  }
}

}  // namespace
}  // namespace agentrt
