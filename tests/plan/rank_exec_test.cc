// The rank wrapper's port lease (--lease-ports): the first rank of a node
// leases its agent's block for the rank's lifetime; a block another run holds
// there is an error naming the holder; the run's own controller's lease counts.
#include "plan/rank_exec.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "common/file_util.h"
#include "plan/port_lease.h"
#include "tests/common/temp_dir.h"
#include "tests/common/wait_for.h"

namespace agentrt {
namespace {

namespace fs = std::filesystem;

using Scratch = testing::TempDir;
using testing::WaitFor;

struct Wrapped {
  pid_t pid = -1;
  std::string stderr_path;
};

// Starts the wrapper as srun would start rank `local` of one node: SLURM's
// variables, the run dir, the lease dir; stderr to a file.
Wrapped Start(const Scratch& s, const std::string& run_dir, int local,
              const std::vector<std::string>& args) {
  Wrapped w;
  w.stderr_path = s.path + "/stderr" + std::to_string(local);
  w.pid = ::fork();
  REQUIRE(w.pid >= 0);
  if (w.pid == 0) {
    ::setenv("SLURM_PROCID", std::to_string(local).c_str(), 1);
    ::setenv("SLURM_NTASKS", "2", 1);
    ::setenv("SLURM_LOCALID", std::to_string(local).c_str(), 1);
    ::setenv("SLURM_NODEID", "0", 1);
    ::setenv("SLURM_TASKS_PER_NODE", "2", 1);
    ::setenv("SLURMD_NODENAME", "node07", 1);
    ::setenv("AGENTRT_RUN_DIR", run_dir.c_str(), 1);
    ::setenv("AGENTRT_PORT_LEASE_DIR", (s.path + "/leases").c_str(), 1);
    const int fd = ::open(w.stderr_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    ::dup2(fd, 2);
    std::vector<char*> argv = {const_cast<char*>("agentrt-exec-rank")};
    for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    ::_exit(ExecRankMain(static_cast<int>(argv.size()) - 1, argv.data()));
  }
  return w;
}

int Wait(pid_t pid) {
  int status = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

std::string Slurp(const std::string& path) {
  auto text = ReadWholeFile(path, 1 << 20);
  return text.ok() ? *text : "";
}

// Run `run`'s leases in the scratch lease dir, holding first..last when first > 0.
std::unique_ptr<PortLeases> LeasesOf(const Scratch& s, const std::string& run, int first = 0,
                                     int last = 0) {
  auto leases = PortLeases::Open(run, s.path + "/leases");
  REQUIRE(leases.ok());
  if (first > 0) REQUIRE((*leases)->Acquire(first, last).ok());
  return std::move(leases).value();
}

}  // namespace

TEST_CASE("a rank exit record reads back what was written; a bad one is refused") {
  RankExit e;
  e.rank = 3;
  e.pid = 4242;
  e.exit_code = 0;
  e.signal = 9;
  e.restart_count = 2;
  e.time = 1.5e9;
  e.node = "node07";
  auto back = RankExit::FromJson(nlohmann::json::parse(e.ToJson().dump()));
  REQUIRE(back.ok());
  CHECK(back->ToJson() == e.ToJson());
  auto sparse = RankExit::FromJson(nlohmann::json::parse(R"({"pid": 1})"));
  REQUIRE(sparse.ok());
  CHECK(sparse->rank == -1);
  CHECK_FALSE(RankExit::FromJson(nlohmann::json::parse("[1]")).ok());
  CHECK_FALSE(RankExit::FromJson(nlohmann::json::parse(R"({"rank": "three"})")).ok());
}

TEST_CASE("the node's first rank leases its agent's block while it runs") {
  Scratch s;
  auto probe = LeasesOf(s, "/runs/probe");
  const std::vector<std::string> args = {"--lease-ports", "31000-31007", "--", "/bin/sleep", "30"};
  Wrapped first = Start(s, "/runs/mine", 0, args);
  CHECK(WaitFor([&] { return !probe->Free(31000, 31007); }));
  // The node's second rank leases nothing (the block is the agent's, once):
  // it runs although the first rank holds the block.
  Wrapped second =
      Start(s, "/runs/other-rank", 1, {"--lease-ports", "31000-31007", "--", "/bin/true"});
  CHECK(Wait(second.pid) == 0);
  CHECK(Slurp(second.stderr_path).empty());
  CHECK_FALSE(probe->Free(31000, 31007));
  REQUIRE(::kill(first.pid, SIGTERM) == 0);  // relayed to sleep, or ends the wrapper itself
  CHECK(Wait(first.pid) == 128 + SIGTERM);
  CHECK(probe->Free(31000, 31007));  // released with the rank
}

TEST_CASE("a block another run holds on the node stops the rank, naming node and holder") {
  Scratch s;
  auto other = LeasesOf(s, "/runs/other", 31004, 31004);
  Wrapped w = Start(s, "/runs/mine", 0, {"--lease-ports", "31000-31007", "--", "/bin/true"});
  CHECK(Wait(w.pid) == 2);
  const std::string err = Slurp(w.stderr_path);
  CHECK_THAT(err, Catch::Contains("rank 0 on node node07: cannot lease its agent's ports "
                                  "31000-31007: port 31004") &&
                      Catch::Contains("run /runs/other (pid " + std::to_string(::getpid()) + ")"));
}

TEST_CASE("the run's own controller holding the block on this node counts as leased") {
  Scratch s;
  auto controller = LeasesOf(s, "/runs/mine", 31000, 31007);
  Wrapped w = Start(s, "/runs/mine", 0, {"--lease-ports", "31000-31007", "--", "/bin/true"});
  CHECK(Wait(w.pid) == 0);
  CHECK(Slurp(w.stderr_path).empty());
  // Partly another run's: not the run's own, refused.
  auto other = LeasesOf(s, "/runs/other", 31008, 31008);
  Wrapped partly = Start(s, "/runs/mine", 0, {"--lease-ports", "31000-31008", "--", "/bin/true"});
  CHECK(Wait(partly.pid) == 2);
}

TEST_CASE("a block the run's controller holds only part of (its bus port) is leased for the rest") {
  Scratch s;
  auto controller = LeasesOf(s, "/runs/mine", 31000, 31000);  // the bus, inside the agent's block
  Wrapped w = Start(s, "/runs/mine", 0, {"--lease-ports", "31000-31007", "--", "/bin/sleep", "30"});
  // While the rank runs, its wrapper holds 31001-31007: another run cannot have them.
  auto other = LeasesOf(s, "/runs/other");
  bool held = false;
  for (int i = 0; i < 200 && !held; ++i) {
    held = !other->Free(31001, 31007);
    if (!held) std::this_thread::sleep_for(std::chrono::milliseconds(25));
  }
  CHECK(held);
  CHECK_FALSE(other->Free(31007, 31007));
  ::kill(w.pid, SIGKILL);
  Wait(w.pid);
  CHECK(other->Free(31001, 31007));
}

TEST_CASE("--lease-ports must be a port range") {
  Scratch s;
  Wrapped w = Start(s, "/runs/mine", 0, {"--lease-ports", "31000", "--", "/bin/true"});
  CHECK(Wait(w.pid) == 2);
  CHECK_THAT(Slurp(w.stderr_path), Catch::Contains("--lease-ports 31000: expected FIRST-LAST"));
}

TEST_CASE("a rank task record reads back what was written; a bad one is refused") {
  RankExecOptions o;
  o.log_dir = "/run/logs/a-0";
  o.node_gpus = {"n1=0,1"};
  o.exit_record = true;
  o.lease_first = 20016;
  o.lease_last = 20031;
  o.command = {"/bin/agent", "--steps", "a b"};
  o.env = {"AGENTRT_AGENT=a-0", "PATH=/usr/bin"};
  o.rank_base = 3;
  o.world_size = 2;
  o.signal_file = "/run/logs/a-0/signals";
  auto back = RankExecOptions::FromJson(nlohmann::json::parse(o.ToJson().dump()));
  REQUIRE(back.ok());
  CHECK(back->ToJson() == o.ToJson());
  CHECK_THAT(
      RankExecOptions::FromJson(nlohmann::json::parse(R"({"log_dir": "x"})")).status().message(),
      Catch::Contains("no command"));
  CHECK_THAT(RankExecOptions::FromJson(
                 nlohmann::json::parse(R"({"command": ["/bin/true"], "rank_base": 0})"))
                 .status()
                 .message(),
             Catch::Contains("world_size"));
  CHECK_FALSE(RankExecOptions::FromJson(nlohmann::json::parse(R"({"command": "true"})")).ok());
}

TEST_CASE("a task file gives the agent its own environment and its ranks in a shared step") {
  Scratch s;
  RankExecOptions o;
  o.log_dir = s.path + "/logs";
  fs::create_directories(o.log_dir);
  o.exit_record = true;
  o.env = {"AGENT_ONLY=yes", "PATH=/usr/bin:/bin"};
  o.rank_base = 1;  // the step's task 1 is this agent's rank 0
  o.world_size = 1;
  o.command = {"/bin/sh", "-c",
               "echo \"$RANK $WORLD_SIZE $LOCAL_RANK $LOCAL_WORLD_SIZE $AGENT_ONLY "
               "${INHERITED:-none} $SLURM_PROCID\" > " +
                   s.path + "/seen"};
  REQUIRE(WriteFileAtomic(s.path + "/task.json", o.ToJson().dump()).ok());
  ::setenv("INHERITED", "from-the-step", 1);
  Wrapped w = Start(s, "/runs/mine", 1, {"--task-file", s.path + "/task.json"});
  ::unsetenv("INHERITED");
  CHECK(Wait(w.pid) == 0);
  CHECK(Slurp(s.path + "/seen") == "0 1 0 1 yes none 1\n");
  CHECK(Slurp(w.stderr_path).empty());
  // Task 0 is not this agent's: refused, naming the tasks it has.
  Wrapped other = Start(s, "/runs/mine", 0, {"--task-file", s.path + "/task.json"});
  CHECK(Wait(other.pid) == 2);
  CHECK_THAT(Slurp(other.stderr_path),
             Catch::Contains("task 0 is not one of the agent's tasks 1-1"));
  Wrapped missing = Start(s, "/runs/mine", 0, {"--task-file", s.path + "/nothing.json"});
  CHECK(Wait(missing.pid) == 2);
  CHECK_THAT(Slurp(missing.stderr_path),
             Catch::Contains("--task-file " + s.path + "/nothing.json"));
}

TEST_CASE("signals appended to the signal file reach the program, also those written before") {
  Scratch s;
  RankExecOptions o;
  o.log_dir = s.path + "/logs";
  fs::create_directories(o.log_dir);
  o.signal_file = s.path + "/signals";
  o.command = {"/bin/sleep", "30"};
  REQUIRE(WriteFileAtomic(s.path + "/task.json", o.ToJson().dump()).ok());
  // Written while it runs: SIGTERM ends sleep, and the wrapper ends the same way.
  Wrapped running = Start(s, "/runs/mine", 0, {"--task-file", s.path + "/task.json"});
  REQUIRE(WaitFor([&] { return fs::exists(s.path + "/logs/rank0.log"); }));
  {
    const int fd = ::open(o.signal_file.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0600);
    REQUIRE(fd >= 0);
    REQUIRE(::write(fd, "15\n", 3) == 3);
    ::close(fd);
  }
  CHECK(Wait(running.pid) == 128 + SIGTERM);
  auto exits = ReadRankExits(o.log_dir, 0);
  REQUIRE(exits.size() == 1);
  CHECK(exits[0].signal == SIGTERM);
  // Written before it started (the file already says 15): delivered at once.
  fs::remove(RankExitPath(o.log_dir, 0));
  Wrapped early = Start(s, "/runs/mine", 0, {"--task-file", s.path + "/task.json"});
  CHECK(Wait(early.pid) == 128 + SIGTERM);
}

TEST_CASE("InterfaceToward names the interface that holds the route's source address") {
  auto lo = InterfaceToward("127.0.0.1");
  REQUIRE(lo.ok());
  CHECK(lo->name == "lo");
  CHECK(lo->loopback);
  auto bad = InterfaceToward("no-such-host.invalid");
  CHECK(!bad.ok());
  CHECK_THAT(bad.status().message(), Catch::Contains("cannot resolve no-such-host.invalid"));
}

}  // namespace agentrt

namespace agentrt {
namespace {

TEST_CASE("NCCL's interface is named for an exact match; loopback never crosses nodes") {
  auto eth = SocketInterfacesFor("eth1", false, true, "10.0.0.1");
  REQUIRE(eth.ok());
  CHECK(eth->nccl == "=eth1");  // not a prefix: eth10 must not match
  CHECK(eth->gloo == "eth1");
  auto lo_one_node = SocketInterfacesFor("lo", true, false, "node1");
  REQUIRE(lo_one_node.ok());
  CHECK(lo_one_node->nccl == "=lo");
  auto lo_across = SocketInterfacesFor("lo", true, true, "node1");
  REQUIRE_FALSE(lo_across.ok());
  CHECK_THAT(lo_across.status().message(),
             Catch::Contains("MASTER_ADDR node1 is reached through the loopback interface lo") &&
                 Catch::Contains("ranks span nodes"));
}

}  // namespace
}  // namespace agentrt
