// A fake LaunchBackend for the supervisor's tests: launches are recorded and
// get made-up pids, signals are recorded, and the test decides which process
// exits when (Exit, KillAll). No process is started.
#pragma once

#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "scheduler/launch_backend.h"

namespace agentrt::testing {

class FakeBackend final : public LaunchBackend {
 public:
  Result<LaunchedAgent> Launch(const AgentLaunch& agent) override {
    launches.push_back(agent);
    if (fail_next_launch) {
      Status s = *fail_next_launch;
      fail_next_launch.reset();
      return s;
    }
    LaunchedAgent out;
    out.process_group = next_pid;
    out.master_port = agent.master_port;
    for (const auto& r : agent.ranks) {
      const pid_t pid = agent.use_mpirun ? next_pid : next_pid + r.rank;
      out.ranks.push_back({r.rank, pid, r.node});
      live[agent.name].insert(pid);
    }
    next_pid += 100;
    return out;
  }
  Status Signal(const std::string& agent, int sig) override {
    signals.push_back({agent, sig});
    return Status::Ok();
  }
  std::vector<AgentProcessExit> PollExits() override {
    std::vector<AgentProcessExit> out;
    std::swap(out, exits);
    return out;
  }
  // Makes `pid` of `agent` exit as if reaped.
  void Exit(const std::string& agent, int rank, pid_t pid, int code, int sig = 0) {
    live[agent].erase(pid);
    exits.push_back({agent, rank, pid, code, sig, ""});
  }
  // Every process of the agent dies (what SIGKILL of the group does).
  void KillAll(const std::string& agent, int sig = 9 /* SIGKILL */) {
    for (pid_t pid : live[agent]) exits.push_back({agent, -1, pid, 0, sig, ""});
    live[agent].clear();
  }
  int SignalsTo(const std::string& agent, int sig) const {
    int n = 0;
    for (const auto& [a, s] : signals) n += (a == agent && s == sig);
    return n;
  }

  std::vector<AgentLaunch> launches;
  std::vector<std::pair<std::string, int>> signals;
  std::vector<AgentProcessExit> exits;
  std::map<std::string, std::set<pid_t>> live;
  std::optional<Status> fail_next_launch;
  pid_t next_pid = 1000;
};

}  // namespace agentrt::testing
