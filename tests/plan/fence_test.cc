// The checkpoint fence (plan/fence.h): the launch a process belongs to, for
// a controller's launch and a SLURM job-array task's, and the check that
// fences a replaced launch off the checkpoint directory.
#include "plan/fence.h"

#include <algorithm>
#include <catch2/catch.hpp>
#include <chrono>
#include <filesystem>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "tests/common/temp_dir.h"
#include "tests/common/wait_for.h"

using namespace agentrt;

namespace {

EnvLookup Env(std::map<std::string, std::string> vars) {
  return [vars = std::move(vars)](const std::string& name) -> std::optional<std::string> {
    auto it = vars.find(name);
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
}

}  // namespace

TEST_CASE("an array task's process belongs to its own launch where the task fenced its directory") {
  testing::TempDir dir;
  AgentEnv env;
  env.agent = "prey-0";
  env.restart_count = 1;  // SLURM_RESTART_COUNT: requeued once
  const std::string mine = dir.path + "/mine", other = dir.path + "/other",
                    none = dir.path + "/none";
  for (const std::string& d : {mine, other, none}) std::filesystem::create_directories(d);
  CHECK(ArrayTaskIncarnation("4711", 1) == "slurm-4711.1");
  REQUIRE(WriteCheckpointFence(mine, ArrayTaskIncarnation("4711", 1)).ok());
  REQUIRE(WriteCheckpointFence(other, ArrayTaskIncarnation("4711", 2)).ok());  // a newer launch

  env.ckpt_dir = mine;
  CHECK(LaunchIncarnation(env, Env({{"SLURM_JOB_ID", "4711"}})).value() == "slurm-4711.1");
  // Read once: a successor's fence does not change this process's id.
  REQUIRE(WriteCheckpointFence(mine, ArrayTaskIncarnation("4711", 2)).ok());
  CHECK(LaunchIncarnation(env, Env({{"SLURM_JOB_ID", "4711"}})).value() == "slurm-4711.1");
  CHECK_THAT(CheckCheckpointFence(mine, "slurm-4711.1").message(),
             Catch::Contains("fenced") && Catch::Contains("slurm-4711.2"));
  // A process of this task that reads the fence first after a requeue
  // replaced its launch still takes its own launch's id, which is fenced.
  env.ckpt_dir = other;
  CHECK(LaunchIncarnation(env, Env({{"SLURM_JOB_ID", "4711"}})).value() == "slurm-4711.1");
  CHECK_THAT(CheckCheckpointFence(other, "slurm-4711.1").message(),
             Catch::Contains("fenced") && Catch::Contains("slurm-4711.2"));
  // No fence (not started by `agentctl array-task`), or a process outside SLURM: no launch.
  env.ckpt_dir = none;
  CHECK(LaunchIncarnation(env, Env({{"SLURM_JOB_ID", "4711"}})).value().empty());
  env.ckpt_dir = dir.path + "/outside";
  std::filesystem::create_directories(env.ckpt_dir);
  REQUIRE(WriteCheckpointFence(env.ckpt_dir, ArrayTaskIncarnation("4711", 1)).ok());
  CHECK(LaunchIncarnation(env, Env({})).value().empty());
}

TEST_CASE("a controller's launch takes the fence's id, whatever it is") {
  testing::TempDir dir;
  AgentEnv env;
  env.agent = "predator-0";
  env.telemetry = "ipc:///tmp/x";  // launched by a controller
  env.ckpt_dir = dir.path;
  REQUIRE(WriteCheckpointFence(env.ckpt_dir, "3.abcd").ok());
  CHECK(LaunchIncarnation(env, Env({})).value() == "3.abcd");
  CHECK(CheckCheckpointFence(env.ckpt_dir, "3.abcd").ok());
  CHECK(CheckCheckpointFence(env.ckpt_dir, "").ok());  // no launch: never fenced
}

TEST_CASE("a fence watcher tells each new fence of its agents, folders made later included") {
  testing::TempDir dir;
  const std::string a = dir.Path("a"), b = dir.Path("b");  // b is made after the watcher starts
  std::filesystem::create_directories(a);
  std::mutex mu;
  std::vector<std::string> seen;  // "agent=id"
  auto watcher = FenceWatcher::Start({{"hunter", a}, {"runner", b}},
                                     [&](const std::string& agent, const std::string& id) {
                                       std::lock_guard<std::mutex> lock(mu);
                                       seen.push_back(agent + "=" + id);
                                     });
  REQUIRE(watcher.ok());
  auto told = [&](const std::string& what) {
    std::lock_guard<std::mutex> lock(mu);
    return std::find(seen.begin(), seen.end(), what) != seen.end();
  };
  // Writes `id` to the fence in `folder` until the watcher tells it: a folder
  // is watched within half a second of being made, and a fence written before
  // that is not told (its readers re-read).
  auto told_once_written = [&](const std::string& folder, const std::string& id,
                               const std::string& what) {
    return testing::WaitFor(
        [&] {
          REQUIRE(WriteCheckpointFence(folder, id).ok());
          return told(what);
        },
        std::chrono::seconds(10));
  };
  REQUIRE(WriteCheckpointFence(a, "0.first").ok());
  CHECK(testing::WaitFor([&] { return told("hunter=0.first"); }, std::chrono::seconds(10)));
  REQUIRE(WriteCheckpointFence(a, "1.second").ok());
  CHECK(testing::WaitFor([&] { return told("hunter=1.second"); }, std::chrono::seconds(10)));
  std::filesystem::create_directories(b);
  CHECK(told_once_written(b, "0.late", "runner=0.late"));
  // A folder removed and made again is watched again.
  std::filesystem::remove_all(a);
  std::filesystem::create_directories(a);
  CHECK(told_once_written(a, "2.third", "hunter=2.third"));
}
