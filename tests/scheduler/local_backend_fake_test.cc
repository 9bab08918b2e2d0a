// The local backend's logic over a fake ProcessSpawner: what it asks to spawn
// (argv, environment, log file, process group) for plain ranks and for an
// mpirun agent, how it cleans up after a failed launch, and how exits are
// routed back to agent and rank. No process is started.
#include <signal.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "common/file_util.h"
#include "plan/agent_env.h"
#include "plan/rank_exec.h"
#include "scheduler/local_backend.h"
#include "tests/scheduler/fake_spawner.h"

namespace agentrt {
namespace {

using testing::FakeSpawner;

std::string Env(const std::vector<std::string>& env, const std::string& name) {
  return EnvLookupOf(env)(name).value_or("<unset>");
}

AgentLaunch TwoRanks(const std::string& name, std::vector<int> gpus = {}) {
  AgentLaunch a;
  a.name = name;
  a.index = 1;
  a.ranks = {{0, 0, 2, "localhost", gpus}, {1, 1, 2, "localhost", gpus}};
  a.command = {"/bin/true", "--flag"};
  a.env = {{"PYTHONUNBUFFERED", "1"}};
  a.master_addr = "127.0.0.1";
  a.master_port = 0;  // the backend probes the block for a free one
  a.ports_first = 40000;
  a.ports_last = 40999;
  a.run_dir = "/tmp";
  a.checkpoint_dir = "/tmp/agentrt-fake-backend-logs/checkpoints/" + name;
  a.log_dir = "/tmp/agentrt-fake-backend-logs/" + name;
  a.bus_address = "127.0.0.1:20000";
  a.token_file = "/tmp/secrets/" + name + ".token";
  a.telemetry_endpoint = "ipc:///tmp/t.sock";
  a.restart_count = 2;
  return a;
}

struct Fixture {
  FakeSpawner::Shared shared;
  std::unique_ptr<LaunchBackend> backend;
  Fixture() {
    LocalBackendOptions options;
    options.base_env = {"PATH=/usr/bin:/bin", "HOME=/root", "RANK=9", "OMPI_COMM_WORLD_RANK=4"};
    options.rank_exec = {"/opt/agentrt/bin/agentrt-exec-rank"};
    options.mpirun = "/bin/sh";  // any executable stands in for mpirun: the fake never runs it
    backend = MakeLocalBackend(std::make_unique<FakeSpawner>(&shared), options);
  }
  ~Fixture() {
    std::error_code ec;
    std::filesystem::remove_all("/tmp/agentrt-fake-backend-logs", ec);  // the log dirs it made
  }
};

TEST_CASE("fake spawner: plain ranks get their own contract, log file and one process group") {
  Fixture f;
  auto launched = f.backend->Launch(TwoRanks("learner", {2, 3}));
  REQUIRE(launched.ok());
  REQUIRE(f.shared.spawned.size() == 2);
  const SpawnRequest& r0 = f.shared.spawned[0];
  const SpawnRequest& r1 = f.shared.spawned[1];
  CHECK(r0.argv == std::vector<std::string>{"/bin/true", "--flag"});
  CHECK(r0.join_group == 0);                        // rank 0 leads the agent's group
  CHECK(r1.join_group == launched->process_group);  // rank 1 joins it
  CHECK(r0.log_path == "/tmp/agentrt-fake-backend-logs/learner/rank0.log");
  CHECK(r1.log_path == "/tmp/agentrt-fake-backend-logs/learner/rank1.log");
  for (int rank = 0; rank < 2; ++rank) {
    const auto& env = f.shared.spawned[static_cast<size_t>(rank)].env;
    auto parsed = AgentEnv::Parse(EnvLookupOf(env));
    REQUIRE(parsed.ok());
    CHECK(parsed->rank == rank);
    CHECK(parsed->local_rank == rank);
    CHECK(parsed->world_size == 2);
    CHECK(parsed->agent == "learner");
    CHECK(parsed->agent_index == 1);
    CHECK(parsed->restart_count == 2);
    CHECK(parsed->master_port == launched->master_port);
    CHECK(parsed->cuda_visible_devices == "2,3");
    CHECK(Env(env, "PYTHONUNBUFFERED") == "1");
    CHECK(Env(env, "HOME") == "/root");
    CHECK(Env(env, "OMPI_COMM_WORLD_RANK") == "<unset>");  // not inherited from agentctl's own
  }
}

TEST_CASE("fake spawner: an incarnation starts without its predecessors' rank exit records") {
  // A requeued allocation counts restarts from 0 again: a record left by an
  // earlier incarnation would pass for how this one's ranks ended.
  Fixture f;
  const AgentLaunch a = TwoRanks("learner");
  std::filesystem::create_directories(a.log_dir);
  RankExit old;
  old.rank = 0;
  old.restart_count = a.restart_count;
  REQUIRE(WriteFileAtomic(RankExitPath(a.log_dir, 0), old.ToJson().dump()).ok());
  REQUIRE(WriteFileAtomic(a.log_dir + "/rank0.log", "kept\n").ok());
  REQUIRE(ReadRankExits(a.log_dir, a.restart_count).size() == 1);
  REQUIRE(f.backend->Launch(a).ok());
  CHECK(ReadRankExits(a.log_dir, a.restart_count).empty());
  CHECK(std::filesystem::exists(a.log_dir + "/rank0.log"));
}

TEST_CASE("fake spawner: plan GPU ids index the GPUs agentctl itself sees (indices or UUIDs)") {
  Fixture f;
  AgentLaunch a = TwoRanks("remapped", {0, 1});
  a.launcher_visible_devices = "GPU-aaaa,GPU-bbbb,5";
  REQUIRE(f.backend->Launch(a).ok());
  REQUIRE(f.shared.spawned.size() == 2);
  auto parsed = AgentEnv::Parse(EnvLookupOf(f.shared.spawned[0].env));
  REQUIRE(parsed.ok());
  CHECK(parsed->cuda_visible_devices == "GPU-aaaa,GPU-bbbb");
  CHECK(parsed->VisibleGpuCount() == 2);  // UUIDs are GPUs too

  // A plan GPU the launcher cannot see is refused before anything starts.
  Fixture g;
  AgentLaunch beyond = TwoRanks("beyond", {2, 3});
  beyond.launcher_visible_devices = "0,1";
  auto refused = g.backend->Launch(beyond);
  REQUIRE_FALSE(refused.ok());
  CHECK_THAT(refused.status().message(),
             Catch::Contains("agent beyond rank 0 on localhost") &&
                 Catch::Contains("the plan gives GPU 2 but agentctl runs with "
                                 "CUDA_VISIBLE_DEVICES=\"0,1\""));
  CHECK(g.shared.spawned.empty());
}

TEST_CASE(
    "fake spawner: an MPI agent is one mpirun passing exactly the contract and the agent's env") {
  Fixture f;
  AgentLaunch a = TwoRanks("mpi-agent");
  a.use_mpirun = true;
  auto launched = f.backend->Launch(a);
  REQUIRE(launched.ok());
  REQUIRE(f.shared.spawned.size() == 1);
  const SpawnRequest& req = f.shared.spawned[0];
  CHECK(req.argv[0] == "/bin/sh");
  CHECK(std::find(req.argv.begin(), req.argv.end(), "-np") != req.argv.end());
  const auto np = std::find(req.argv.begin(), req.argv.end(), "-np");
  CHECK(*(np + 1) == "2");
  std::vector<std::string> passed;
  for (size_t i = 0; i + 1 < req.argv.size(); ++i) {
    if (req.argv[i] == "-x") passed.push_back(req.argv[i + 1]);
  }
  for (const char* name :
       {"AGENTRT_AGENT", "AGENTRT_RUN_DIR", "MASTER_PORT", "CUDA_VISIBLE_DEVICES",
        "AGENTRT_TOKEN_FILE", "PYTHONUNBUFFERED", "AGENTRT_WORKDIR"}) {
    INFO(name);
    CHECK(std::find(passed.begin(), passed.end(), name) != passed.end());
  }
  CHECK(std::find(passed.begin(), passed.end(), "RANK") == passed.end());  // the wrapper sets it
  CHECK(std::find(passed.begin(), passed.end(), "HOME") == passed.end());
  const auto wrapper =
      std::find(req.argv.begin(), req.argv.end(), "/opt/agentrt/bin/agentrt-exec-rank");
  REQUIRE(wrapper != req.argv.end());
  CHECK(std::vector<std::string>(wrapper + 1, req.argv.end()) ==
        std::vector<std::string>{"--log-dir", "/tmp/agentrt-fake-backend-logs/mpi-agent",
                                 "--exit-record", "--", "/bin/true", "--flag"});
  CHECK(Env(req.env, "RANK") == "<unset>");
  CHECK(req.log_path == "/tmp/agentrt-fake-backend-logs/mpi-agent/mpirun.log");
  REQUIRE(launched->ranks.size() == 2);
  CHECK(launched->ranks[0].pid == launched->ranks[1].pid);  // mpirun stands for both ranks
}

TEST_CASE("fake spawner: a rank that cannot start takes its started siblings down with it") {
  Fixture f;
  f.shared.fail_spawn_at = 1;
  auto launched = f.backend->Launch(TwoRanks("half"));
  REQUIRE_FALSE(launched.ok());
  CHECK_THAT(launched.status().message(), Catch::Contains("agent half rank 1"));
  REQUIRE(f.shared.signals.size() == 1);
  CHECK(f.shared.signals[0] == std::make_pair(pid_t{1000}, SIGKILL));
  CHECK(f.shared.group_of.empty());       // rank 0 was reaped
  CHECK(f.backend->PollExits().empty());  // and is not reported as an exit of a live agent
  // The agent can be launched again.
  f.shared.fail_spawn_at = -1;
  CHECK(f.backend->Launch(TwoRanks("half")).ok());
}

TEST_CASE("fake spawner: signals go to the agent's group; exits come back per agent and rank") {
  Fixture f;
  auto a = f.backend->Launch(TwoRanks("a"));
  auto b = f.backend->Launch(TwoRanks("b"));
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  CHECK(f.backend->Launch(TwoRanks("a")).status().code() == StatusCode::kFailedPrecondition);
  REQUIRE(f.backend->Signal("b", SIGTERM).ok());
  CHECK(f.shared.signals.back() == std::make_pair(b->process_group, SIGTERM));
  f.shared.exits.push_back({a->ranks[1].pid, 3, 0});
  const auto exits = f.backend->PollExits();
  REQUIRE(exits.size() == 1);
  CHECK(exits[0].agent == "a");
  CHECK(exits[0].rank == 1);
  CHECK(exits[0].exit_code == 3);
  CHECK(exits[0].Describe() == "exited with code 3");
  CHECK(f.backend->Signal("nobody", SIGTERM).ok());  // nothing running: not an error
}

}  // namespace
}  // namespace agentrt
