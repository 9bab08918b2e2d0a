#include "slurm/parse.h"

#include <catch2/catch.hpp>

using namespace agentrt::slurm;

// Captured from slurm-wlm 22.05 on the test cluster (two lines: an array task
// running, one with a WorkDir that has a space in it).
static const char* kScontrolJobs =
    "JobId=12 ArrayJobId=12 ArrayTaskId=1 JobName=wrap UserId=root(0) GroupId=root(0) "
    "MCS_label=N/A "
    "Priority=4294901758 Nice=0 Account=(null) QOS=(null) JobState=RUNNING Reason=None "
    "Dependency=(null) "
    "Requeue=1 Restarts=0 BatchFlag=1 Reboot=0 ExitCode=0:0 RunTime=00:00:01 NodeList=vm "
    "BatchHost=vm "
    "NumNodes=1 NumCPUs=2 NumTasks=2 CPUs/Task=1 WorkDir=/tmp StdOut=/dev/null Power= "
    "TresPerNode=gres:gpu:2 \n"
    "JobId=14 ArrayJobId=(null) JobName=train JobState=CANCELLED Reason=None Restarts=1 "
    "ExitCode=0:15 "
    "NodeList=(null) WorkDir=/home/a user/run Command=/bin/true\n";

TEST_CASE("scontrol show job -o lines become job records") {
  auto jobs = ParseScontrolJobs(kScontrolJobs);
  REQUIRE(jobs.ok());
  REQUIRE(jobs->size() == 2);
  const JobRecord& a = (*jobs)[0];
  CHECK(a.job_id == "12");
  CHECK(a.array_job_id == "12");
  CHECK(a.array_task == "1");
  CHECK(a.DisplayId() == "12_1");
  CHECK(a.name == "wrap");
  CHECK(a.state == JobState::kRunning);
  CHECK(a.node_list == "vm");
  CHECK(a.fields.at("TresPerNode") == "gres:gpu:2");
  CHECK(a.fields.at("Power").empty());
  const JobRecord& b = (*jobs)[1];
  CHECK(b.array_job_id.empty());
  CHECK(b.DisplayId() == "14");
  CHECK(b.state == JobState::kCancelled);
  CHECK(b.exit_signal == 15);
  CHECK(b.restarts == 1);
  CHECK(b.node_list.empty());
  CHECK(b.fields.at("WorkDir") == "/home/a user/run");
}

TEST_CASE("scontrol output without a JobId is an error naming the line") {
  auto jobs = ParseScontrolJobs("JobId=1 JobState=PENDING\nJobName=x JobState=RUNNING\n");
  REQUIRE_FALSE(jobs.ok());
  CHECK_THAT(jobs.status().message(), Catch::Contains("line 2"));
}

TEST_CASE("job states read from every spelling SLURM prints") {
  CHECK(ParseJobState("COMPLETED") == JobState::kCompleted);
  CHECK(ParseJobState("CANCELLED by 0") == JobState::kCancelled);
  CHECK(ParseJobState("CANCELLED+") == JobState::kCancelled);
  CHECK(ParseJobState("REQUEUE_HOLD") == JobState::kRequeued);
  CHECK(ParseJobState("OUT_OF_MEMORY") == JobState::kOutOfMemory);
  CHECK(ParseJobState("bogus") == JobState::kUnknown);
  CHECK(IsTerminal(JobState::kFailed));
  CHECK(IsTerminal(JobState::kTimeout));
  CHECK_FALSE(IsTerminal(JobState::kRequeued));
  CHECK_FALSE(IsTerminal(JobState::kCompleting));
  CHECK(JobStateName(JobState::kNodeFail) == "NODE_FAIL");
}

TEST_CASE("squeue --steps rows split into job and step") {
  auto steps =
      ParseSqueueSteps("12_1.0|sleep|vm\n12_1.batch|batch|vm\n13.extern|extern|node[01-02]\n");
  REQUIRE(steps.ok());
  REQUIRE(steps->size() == 3);
  CHECK((*steps)[0].job == "12_1");
  CHECK((*steps)[0].step == "0");
  CHECK((*steps)[0].name == "sleep");
  CHECK((*steps)[1].step == "batch");
  CHECK((*steps)[2].node_list == "node[01-02]");
  CHECK_FALSE(ParseSqueueSteps("12.0|x\n").ok());
  CHECK_FALSE(ParseSqueueSteps("12|x|vm\n").ok());
}

TEST_CASE("sacct parsable rows become accounting records") {
  auto rows = ParseSacct(
      "7_0|job|COMPLETED|0:0|vm\n7_0.batch|batch|COMPLETED|0:0|vm\n7_0.0|a|FAILED|3:0|vm\n");
  REQUIRE(rows.ok());
  REQUIRE(rows->size() == 3);
  CHECK((*rows)[2].state == JobState::kFailed);
  CHECK((*rows)[2].exit_code == 3);
  auto bad = ParseSacct("7|job|COMPLETED|zero|vm\n");
  REQUIRE_FALSE(bad.ok());
  CHECK_THAT(bad.status().message(), Catch::Contains("line 1"));
}

TEST_CASE("sbatch --parsable output gives the job id") {
  CHECK(ParseSbatchParsable("123\n").value() == "123");
  CHECK(ParseSbatchParsable("123;cluster\n").value() == "123");
  CHECK(ParseSbatchParsable("sbatch: warning: something\n77\n").value() == "77");
  CHECK_FALSE(ParseSbatchParsable("").ok());
  CHECK_FALSE(ParseSbatchParsable("Submitted batch job 5\n").ok());
}

TEST_CASE("exit codes are code:signal") {
  CHECK(ParseExitCode("2:0").value() == std::make_pair(2, 0));
  CHECK_FALSE(ParseExitCode("2").ok());
  CHECK_FALSE(ParseExitCode("a:b").ok());
}
