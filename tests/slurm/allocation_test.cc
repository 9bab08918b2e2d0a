// Submitting and following a job, and the run driver's options inside an
// allocation, against SLURM's output replayed by a FakeRunner.
#include "slurm/allocation.h"

#include <catch2/catch.hpp>
#include <map>

#include "common/clock.h"
#include "common/file_util.h"
#include "slurm/job_follower.h"
#include "tests/common/temp_dir.h"
#include "tests/slurm/fake_runner.h"
#include "tests/slurm/test_plans.h"

namespace agentrt::slurm {
namespace {

using testing::FakeRunner;

std::string Job(const std::string& state, const std::string& exit = "0:0", int restarts = 0) {
  return "JobId=42 JobName=agentrt-run JobState=" + state +
         " Reason=None Restarts=" + std::to_string(restarts) + " ExitCode=" + exit +
         " NodeList=n1\n";
}

const char* kNodes =
    "NodeName=n1 CPUTot=8 Gres=(null) NodeAddr=10.0.0.1 State=ALLOCATED Partitions=all\n"
    "NodeName=n2 CPUTot=8 Gres=(null) NodeAddr=10.0.0.2 State=ALLOCATED Partitions=all\n"
    "NodeName=n3 CPUTot=8 Gres=(null) NodeAddr=10.0.0.3 State=IDLE Partitions=all\n";

TEST_CASE("following a job reports its states and returns its exit code") {
  ::agentrt::testing::TempDir dir;
  FakeRunner runner;
  runner.Push({0, Job("PENDING"), ""});
  runner.Push({0, Job("RUNNING"), ""});
  runner.Push({0, Job("RUNNING"), ""});
  runner.Push({0, Job("FAILED", "3:0"), ""});
  SlurmClient slurm(runner);
  ManualClock clock;
  std::vector<std::string> events;
  FollowHooks hooks;
  hooks.on_event = [&](const std::string& e) { events.push_back(e); };
  hooks.wait = [&] { clock.AdvanceSeconds(0.5); };
  CHECK(FollowJob(slurm, "42", RunDir(dir.path), clock, hooks) == 3);
  REQUIRE(events.size() == 3);  // a state is said once, when it changes
  CHECK(events[0] == "[    0.5s] job 42 PENDING");
  CHECK(events[1] == "[    1.0s] job 42 RUNNING");
  CHECK(events[2] == "[    2.0s] job 42 FAILED");
  CHECK(runner.calls.front() == "scontrol show job -o 42");
}

TEST_CASE("a first stop request signals the batch shell, a second cancels the job") {
  ::agentrt::testing::TempDir dir;
  FakeRunner runner;
  runner.Push({0, Job("RUNNING"), ""});
  runner.Push({0, "", ""});  // scancel --signal=TERM --batch
  runner.Push({0, Job("RUNNING"), ""});
  runner.Push({0, "", ""});  // scancel
  runner.Push({0, Job("CANCELLED", "0:15"), ""});
  SlurmClient slurm(runner);
  ManualClock clock;
  int polls = 0;
  FollowHooks hooks;
  hooks.wait = [&] { ++polls; };
  hooks.stop_requests = [&] { return polls - 1; };  // one more Ctrl-C every poll from the second
  CHECK(FollowJob(slurm, "42", RunDir(dir.path), clock, hooks) == 128 + 15);
  REQUIRE(runner.calls.size() == 5);
  CHECK(runner.calls[1] == "scancel --signal=TERM --batch 42");
  CHECK(runner.calls[3] == "scancel 42");
}

TEST_CASE("a job SLURM has forgotten has ended; status.json is shown while it runs") {
  ::agentrt::testing::TempDir dir;
  RunStatus status;
  status.run = "r";
  REQUIRE(WriteRunStatusFile(status, RunDir(dir.path).StatusPath()).ok());
  FakeRunner runner;
  runner.Push({1, "", "scontrol: error: temporarily unreachable\n"});  // tried again
  runner.Push({1, "", "slurm_load_jobs error: Invalid job id specified\n"});
  SlurmClient slurm(runner);
  ManualClock clock;
  int shown = 0;
  FollowHooks hooks;
  hooks.wait = [] {};
  hooks.on_status = [&](const RunStatus& s, double) { shown += s.run == "r" ? 1 : 0; };
  CHECK(FollowJob(slurm, "42", RunDir(dir.path), clock, hooks) == 0);
  CHECK(shown == 2);
}

TEST_CASE("an allocation is submitted with its plan and script, its job id recorded") {
  ::agentrt::testing::TempDir dir;
  Plan plan;
  plan.run = "r";
  testing::AddAgent(plan, "a", 0, 1, "n1", 20016, dir.path);
  FakeRunner runner;
  runner.Push({0, "77\n", ""});
  SlurmClient slurm(runner);
  AllocScriptOptions options;
  options.run_dir = dir.path;
  options.agentctl_path = "/opt/agentrt/bin/agentctl";
  const RunDir run(dir.path);
  auto job = SubmitAllocation(slurm, plan, SlurmConfig{}, run, options);
  REQUIRE(job.ok());
  CHECK(*job == "77");
  CHECK(runner.calls[0] == "sbatch --parsable " + run.AllocScriptPath());
  CHECK(ReadWholeFile(run.SlurmJobIdPath()).value() == "77\n");
  CHECK(ReadPlanFile(run.PlanPath()).ok());
  CHECK_THAT(ReadWholeFile(run.AllocScriptPath()).value(), Catch::Contains("#SBATCH"));
}

TEST_CASE("on several nodes the driver serves at this node's address and fails over") {
  Plan plan;
  testing::AddAgent(plan, "a", 0, 1, "n1", 20016, "/r");
  testing::AddAgent(plan, "b", 0, 1, "n2", 20032, "/r");
  FakeRunner runner;
  runner.Push({0, kNodes, ""});
  std::string warning;
  const auto env = testing::MapLookup({{"SLURM_JOB_NODELIST", "n[1-2]"}});
  RunDriverOptions o = AllocationDriverOptions(plan, "n1", runner, env, &warning);
  CHECK(warning.empty());
  CHECK(o.local_node == "n1");
  CHECK(o.bus_listen_host == "0.0.0.0");
  CHECK(o.bus_advertised_host == "10.0.0.1");
  CHECK(o.telemetry_host == "10.0.0.1");
  REQUIRE(o.allocation_nodes.size() == 2);  // n3 is not the job's
  CHECK(o.allocation_nodes[1].name == "n2");
  REQUIRE(o.down_nodes);
  runner.Push(
      {0, std::string(kNodes).replace(std::string(kNodes).find("ALLOCATED"), 9, "DOWN*"), ""});
  auto down = o.down_nodes();
  REQUIRE(down.ok());
  CHECK(*down == std::set<std::string>{"n1"});
}

TEST_CASE("one node serves on loopback; unreadable nodes are a warning, not a failure") {
  Plan plan;
  testing::AddAgent(plan, "a", 0, 1, "n1", 20016, "/r");
  FakeRunner runner;
  runner.Push({1, "", "scontrol: error: Unable to contact slurm controller\n"});
  std::string warning;
  RunDriverOptions o =
      AllocationDriverOptions(plan, "n1", runner, testing::MapLookup({}), &warning);
  CHECK_THAT(warning, Catch::Contains("no node failover"));
  CHECK(o.bus_listen_host == "127.0.0.1");
  CHECK(o.allocation_nodes.empty());
  CHECK_FALSE(o.down_nodes);
}

}  // namespace
}  // namespace agentrt::slurm
