// A fake ProcessSpawner for the unit tests of what starts processes (the
// local backend, the broker process): spawns are recorded and get made-up
// pids, signals are recorded (SIGKILL ends the group at once, SIGTERM too
// when told), and the test decides which process exits when (`exits`, handed
// out by the next ReapExited). No process is started.
#pragma once

#include <signal.h>

#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "scheduler/process.h"

namespace agentrt::testing {

class FakeSpawner final : public ProcessSpawner {
 public:
  struct Shared {
    std::vector<SpawnRequest> spawned;
    std::vector<std::pair<pid_t, int>> signals;  // (pgid, signal)
    std::vector<ProcessExit> exits;              // handed out by the next ReapExited
    std::map<pid_t, pid_t> group_of;             // pid -> pgid
    int fail_spawn_at = -1;                      // this spawn (0-based) fails
    bool fail_spawns = false;                    // every spawn fails
    bool sigterm_ends = false;                   // SIGTERM ends the group at once, as SIGKILL
    pid_t next_pid = 1000;
    // Runs after each spawn that succeeds (the "process" doing its part).
    std::function<void(const SpawnRequest&, pid_t)> on_spawn;
  };
  explicit FakeSpawner(Shared* shared) : s_(shared) {}

  Result<pid_t> Spawn(const SpawnRequest& request) override {
    if (s_->fail_spawns || static_cast<int>(s_->spawned.size()) == s_->fail_spawn_at) {
      s_->spawned.push_back(request);
      return NotFound("cannot execute " + request.argv[0] + ": No such file or directory");
    }
    s_->spawned.push_back(request);
    const pid_t pid = s_->next_pid++;
    s_->group_of[pid] = request.join_group != 0 ? request.join_group : pid;
    if (s_->on_spawn) s_->on_spawn(request, pid);
    return pid;
  }
  Status SignalGroup(pid_t pgid, int sig) override {
    s_->signals.emplace_back(pgid, sig);
    if (sig == SIGKILL || (sig == SIGTERM && s_->sigterm_ends)) {  // the group dies at once
      for (const auto& [pid, group] : s_->group_of) {
        if (group == pgid) s_->exits.push_back({pid, 0, sig});
      }
    }
    return Status::Ok();
  }
  std::vector<ProcessExit> ReapExited() override {
    std::vector<ProcessExit> out;
    out.swap(s_->exits);
    for (const auto& e : out) s_->group_of.erase(e.pid);
    return out;
  }

 private:
  Shared* s_;
};

}  // namespace agentrt::testing
