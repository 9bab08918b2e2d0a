#include "slurm/slurm_client.h"

#include <catch2/catch.hpp>

#include "tests/slurm/fake_runner.h"

using namespace agentrt;
using namespace agentrt::slurm;

using agentrt::slurm::testing::FakeRunner;

namespace {

// The status a client call ends with when its one command answers `reply`.
template <typename Call>
Status FailureOf(CommandOutput reply, Call call) {
  FakeRunner runner;
  runner.Push(std::move(reply));
  SlurmClient client(runner);
  auto result = call(client);
  REQUIRE_FALSE(result.ok());
  return result.status();
}

}  // namespace

TEST_CASE("Submit runs sbatch --parsable with the extra arguments before the script") {
  FakeRunner runner;
  runner.Push({0, "42\n", ""});
  SlurmClient client(runner);
  auto id = client.Submit("/run/a b.sbatch", {"--dependency=after:41"});
  REQUIRE(id.ok());
  CHECK(*id == "42");
  REQUIRE(runner.calls.size() == 1);
  CHECK(runner.calls[0] == "sbatch --parsable --dependency=after:41 '/run/a b.sbatch'");
}

TEST_CASE("a failing sbatch is an error carrying its stderr") {
  const Status s = FailureOf({1, "", "sbatch: error: invalid partition specified: gpu\n"},
                             [](SlurmClient& c) { return c.Submit("x.sbatch"); });
  CHECK_THAT(s.message(), Catch::Contains("invalid partition specified: gpu"));
  CHECK_THAT(s.message(), Catch::Contains("sbatch --parsable x.sbatch"));
  CHECK_THAT(s.message(), Catch::Contains("exit code 1"));
}

TEST_CASE("ShowJob of an unknown job is NotFound") {
  const Status s = FailureOf({1, "", "slurm_load_jobs error: Invalid job id specified\n"},
                             [](SlurmClient& c) { return c.ShowJob("999"); });
  CHECK(s.code() == StatusCode::kNotFound);
  CHECK_THAT(s.message(), Catch::Contains("999"));
}

TEST_CASE("Accounting without slurmdbd says so") {
  const Status s = FailureOf({1, "", "Slurm accounting storage is disabled\n"},
                             [](SlurmClient& c) { return c.Accounting("5"); });
  CHECK(s.code() == StatusCode::kFailedPrecondition);
}

TEST_CASE("Cancel passes the signal and batch flags to scancel") {
  FakeRunner runner;
  runner.Push({0, "", ""});
  runner.Push({1, "", "scancel: error: Kill job error on job id 9: Invalid job id specified\n"});
  SlurmClient client(runner);
  CHECK(client.Cancel("8_1", {"USR2", true, false}).ok());
  CHECK(runner.calls[0] == "scancel --signal=USR2 --batch 8_1");
  Status s = client.Cancel("9");
  REQUIRE_FALSE(s.ok());
  CHECK_THAT(s.message(), Catch::Contains("Invalid job id"));
}

TEST_CASE("WaitForJobs polls until every array task is terminal") {
  FakeRunner runner;
  // A pending array not yet split, then one task running, then both done.
  runner.Push({0, "JobId=5 ArrayJobId=5 ArrayTaskId=0-1 JobState=PENDING\n", ""});
  runner.Push(
      {0,
       "JobId=5 ArrayJobId=5 ArrayTaskId=1 JobState=RUNNING\nJobId=6 ArrayJobId=5 ArrayTaskId=0 "
       "JobState=COMPLETED\n",
       ""});
  runner.Push(
      {0,
       "JobId=5 ArrayJobId=5 ArrayTaskId=1 JobState=COMPLETED\nJobId=6 ArrayJobId=5 ArrayTaskId=0 "
       "JobState=COMPLETED\n",
       ""});
  SlurmClient client(runner, {10, 0.001});
  auto jobs = client.WaitForJobs({"5"}, 30);
  REQUIRE(jobs.ok());
  CHECK(jobs->size() == 2);
  CHECK(runner.calls.size() == 3);
}

TEST_CASE("WaitForJobs gives up at its deadline naming the unfinished job") {
  FakeRunner runner;
  for (int i = 0; i < 1000; ++i) runner.Push({0, "JobId=7 JobState=RUNNING\n", ""});
  SlurmClient client(runner, {10, 0.01});
  auto jobs = client.WaitForJobs({"7"}, 0.05);
  REQUIRE_FALSE(jobs.ok());
  CHECK(jobs.status().code() == StatusCode::kDeadlineExceeded);
  CHECK_THAT(jobs.status().message(), Catch::Contains("7=RUNNING"));
}
