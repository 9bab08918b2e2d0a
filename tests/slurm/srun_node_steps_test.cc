// slurm.steps: node in the SLURM backend, with a fake spawner (no cluster):
// the agents of one controller start wait for EndBatch and start as one srun
// per node, each agent's task file says which of the step's tasks are its
// ranks, a signal reaches one agent only (its signal file), an agent ends on
// its own exit records while the others run on, a restart is a step of its
// own, and a node step that does not start fails its agents. Also: an srun
// killed by a signal has its step cancelled.
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <filesystem>
#include <string>
#include <vector>

#include "common/file_util.h"
#include "plan/rank_exec.h"
#include "slurm/srun_backend.h"
#include "tests/common/temp_dir.h"
#include "tests/slurm/fake_runner.h"

using namespace agentrt;
using namespace agentrt::slurm;

namespace {

class FakeSpawner final : public ProcessSpawner {
 public:
  std::vector<SpawnRequest> spawned;
  std::vector<ProcessExit> exits;
  bool fail = false;

  Result<pid_t> Spawn(const SpawnRequest& request) override {
    if (fail) return Unavailable("srun: cannot execute");
    spawned.push_back(request);
    return static_cast<pid_t>(1000 + spawned.size());
  }
  Status SignalGroup(pid_t, int) override { return Status::Ok(); }
  std::vector<ProcessExit> ReapExited() override { return std::exchange(exits, {}); }
};

AgentLaunch OneNodeAgent(const std::string& dir, const std::string& name, const std::string& node,
                         int ranks) {
  AgentLaunch a;
  a.name = name;
  for (int r = 0; r < ranks; ++r) a.ranks.push_back({r, r, ranks, node, {}});
  a.command = {"/bin/sleep", "30"};
  a.log_dir = dir + "/logs/" + name;
  a.ports_first = 31000;
  a.ports_last = 31000 + 15;
  a.master_port = 31000;
  return a;
}

bool Has(const std::vector<std::string>& v, const std::string& s) {
  return std::find(v.begin(), v.end(), s) != v.end();
}

std::string After(const std::vector<std::string>& v, const std::string& flag) {
  auto it = std::find(v.begin(), v.end(), flag);
  return it == v.end() || it + 1 == v.end() ? "" : *(it + 1);
}

RankExecOptions TaskOf(const std::string& log_dir) {
  auto text = ReadWholeFile(log_dir + "/task.json", 1 << 20);
  REQUIRE(text.ok());
  auto task = RankExecOptions::FromJson(nlohmann::json::parse(*text));
  REQUIRE(task.ok());
  return *task;
}

void WriteExit(const std::string& log_dir, int rank, int code) {
  RankExit e;
  e.rank = rank;
  e.exit_code = code;
  e.restart_count = 0;
  REQUIRE(WriteFileAtomic(RankExitPath(log_dir, rank), e.ToJson().dump()).ok());
}

struct Fixture {
  agentrt::testing::TempDir dir;
  FakeSpawner* spawner = nullptr;
  std::unique_ptr<LaunchBackend> backend;

  Fixture() {
    auto owned = std::make_unique<FakeSpawner>();
    spawner = owned.get();
    SrunOptions options;
    options.srun = "/bin/true";  // resolvable; the fake never runs it
    options.node_steps = true;
    options.node_step_poll_s = 0;
    options.base_env = {"PATH=/usr/bin:/bin", "INHERITED=yes"};
    backend = MakeSrunBackend(std::move(owned), nullptr, options);
  }
};

}  // namespace

TEST_CASE("node steps: one srun per node, each agent its tasks, its environment, its signals") {
  Fixture f;
  f.backend->BeginBatch();
  const AgentLaunch a = OneNodeAgent(f.dir.path, "a", "n1", 1);
  const AgentLaunch b = OneNodeAgent(f.dir.path, "b", "n1", 2);
  const AgentLaunch c = OneNodeAgent(f.dir.path, "c", "n2", 1);
  for (const AgentLaunch* agent : {&a, &b, &c}) {
    auto launched = f.backend->Launch(*agent);
    REQUIRE(launched.ok());
    CHECK(launched->ranks.size() == agent->ranks.size());
    CHECK(launched->ranks[0].pid == 0);  // not started yet: the ranks tell theirs
  }
  CHECK(f.spawner->spawned.empty());
  f.backend->EndBatch();
  REQUIRE(f.spawner->spawned.size() == 2);  // n1 (a, b) and n2 (c)
  const std::vector<std::string>& n1 = f.spawner->spawned[0].argv;
  CHECK(Has(n1, "--nodelist=n1"));
  CHECK(Has(n1, "--ntasks=3"));
  CHECK(Has(n1, "--kill-on-bad-exit=0"));
  CHECK(Has(n1, "--gres=none"));
  auto conf = ReadWholeFile(After(n1, "--multi-prog"), 1 << 20);
  REQUIRE(conf.ok());
  CHECK(*conf == "0-0 agentrt-exec-rank --task-file " + a.log_dir + "/task.json\n" +
                     "1-2 agentrt-exec-rank --task-file " + b.log_dir + "/task.json\n");
  const RankExecOptions tb = TaskOf(b.log_dir);
  CHECK(tb.rank_base == 1);
  CHECK(tb.world_size == 2);
  CHECK(tb.exit_record);
  CHECK(tb.command == std::vector<std::string>{"/bin/sleep", "30"});
  CHECK(Has(tb.env, "AGENTRT_AGENT=b"));
  CHECK(Has(tb.env, "INHERITED=yes"));
  CHECK(tb.signal_file == b.log_dir + "/signals");
  CHECK(std::filesystem::status(b.log_dir + "/task.json").permissions() ==
        (std::filesystem::perms::owner_read | std::filesystem::perms::owner_write));

  // A signal for b reaches b's signal file only.
  REQUIRE(f.backend->Signal("b", SIGTERM).ok());
  CHECK(ReadWholeFile(b.log_dir + "/signals", 64).value_or("") == "15\n");
  CHECK_FALSE(std::filesystem::exists(a.log_dir + "/signals"));

  // b's rank 1 fails: b ends (the first failed record says how); a runs on.
  WriteExit(b.log_dir, 1, 3);
  std::vector<AgentProcessExit> exits = f.backend->PollExits();
  REQUIRE(exits.size() == 1);
  CHECK(exits[0].agent == "b");
  CHECK(exits[0].pid == 0);
  CHECK(exits[0].exit_code == 3);
  CHECK(f.backend->PollExits().empty());

  // Its restart is a step of its own that shares the node step's CPUs.
  AgentLaunch again = b;
  again.restart_count = 1;
  REQUIRE(f.backend->Launch(again).ok());
  REQUIRE(f.spawner->spawned.size() == 3);
  const auto& restart = f.spawner->spawned[2].argv;
  CHECK(std::count(restart.begin(), restart.end(), "--overlap") == 1);
  CHECK(Has(f.spawner->spawned[2].argv, "--job-name=b"));

  // a ends cleanly: every rank's record; then the n1 step ends with nobody left in it.
  WriteExit(a.log_dir, 0, 0);
  exits = f.backend->PollExits();
  REQUIRE(exits.size() == 1);
  CHECK(exits[0].agent == "a");
  CHECK(exits[0].success());
  // n2's step ends without c's record: c is lost, with the step's exit code.
  f.spawner->exits.push_back({1002, 1, 0});
  exits = f.backend->PollExits();
  REQUIRE(exits.size() == 1);
  CHECK(exits[0].agent == "c");
  CHECK_FALSE(exits[0].success());
  CHECK_THAT(exits[0].lost, Catch::Contains("rank(s) 0 left no clean exit record"));
}

TEST_CASE("node steps: only inside a batch, and a node step that cannot start fails its agents") {
  Fixture f;
  const AgentLaunch a = OneNodeAgent(f.dir.path, "a", "n1", 1);
  REQUIRE(f.backend->Launch(a).ok());  // no batch: a step of its own at once
  REQUIRE(f.spawner->spawned.size() == 1);
  CHECK(Has(f.spawner->spawned[0].argv, "--job-name=a"));

  f.spawner->fail = true;
  f.backend->BeginBatch();
  const AgentLaunch b = OneNodeAgent(f.dir.path, "b", "n1", 1);
  REQUIRE(f.backend->Launch(b).ok());
  f.backend->EndBatch();
  const std::vector<AgentProcessExit> exits = f.backend->PollExits();
  REQUIRE(exits.size() == 1);
  CHECK(exits[0].agent == "b");
  CHECK(exits[0].exit_code == 127);
  CHECK_THAT(exits[0].lost, Catch::Contains("its node step on n1 did not start") &&
                                Catch::Contains("srun: cannot execute"));
}

TEST_CASE("a launch on a node the allocation does not hold fails at once, saying which") {
  agentrt::testing::TempDir dir;
  auto owned = std::make_unique<FakeSpawner>();
  FakeSpawner* spawner = owned.get();
  SrunOptions options;
  options.srun = "/bin/true";
  options.allocation_nodes = {"n1", "n2"};
  auto backend = MakeSrunBackend(std::move(owned), nullptr, options);
  REQUIRE(backend->Launch(OneNodeAgent(dir.path, "a", "n2", 1)).ok());
  auto stray = backend->Launch(OneNodeAgent(dir.path, "b", "n3", 2));
  REQUIRE_FALSE(stray.ok());
  CHECK(stray.status().code() == StatusCode::kFailedPrecondition);  // the agent fails at once
  CHECK_THAT(stray.status().message(),
             Catch::Contains("agent b: rank 0 is placed on node n3, which this allocation does "
                             "not hold (n1,n2)"));
  CHECK(spawner->spawned.size() == 1);  // no srun for it
}

TEST_CASE("an srun killed by a signal has its step cancelled; one that ended has not") {
  agentrt::testing::TempDir dir;
  auto owned = std::make_unique<FakeSpawner>();
  FakeSpawner* spawner = owned.get();
  agentrt::slurm::testing::FakeRunner runner;
  SrunOptions options;
  options.srun = "/bin/true";
  options.base_env = {"PATH=/usr/bin:/bin"};
  auto backend = MakeSrunBackend(std::move(owned), &runner, options);

  const AgentLaunch a = OneNodeAgent(dir.path, "a", "n1", 1);
  auto launched = backend->Launch(a);
  REQUIRE(launched.ok());
  REQUIRE(WriteFileAtomic(a.log_dir + "/step.id", "7.3\n").ok());  // as rank 0's wrapper does
  runner.Push({});
  spawner->exits.push_back({launched->process_group, 0, SIGKILL});
  auto exits = backend->PollExits();
  REQUIRE(exits.size() == 1);
  CHECK(exits[0].term_signal == SIGKILL);
  CHECK(runner.calls == std::vector<std::string>{"scancel 7.3"});

  launched = backend->Launch(a);
  REQUIRE(launched.ok());
  REQUIRE(WriteFileAtomic(a.log_dir + "/step.id", "7.4\n").ok());
  spawner->exits.push_back({launched->process_group, 1, 0});
  REQUIRE(backend->PollExits().size() == 1);
  CHECK(runner.calls.size() == 1);  // an srun that exited: its step is over
}
