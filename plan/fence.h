// The checkpoint fence: <checkpoint dir>/FENCE holds the id of the agent's
// newest launch (AgentLaunch::incarnation). The launcher writes it before
// starting an incarnation (PrepareLaunch, scheduler/launch_backend.h); each
// rank takes the id it finds there when it starts as its own (Runtime: no
// variable is added to the agent contract), and its Checkpointer reads the
// file again before each save and commit and refuses when it names another
// incarnation. So when an agent is restarted elsewhere while
// its old ranks still run (a node cut off by a network partition, an srun the
// scheduler could not reach), exactly one incarnation writes checkpoints.
//
// Format: the id and a newline, written atomically (temp file + rename).
// Thread-safe (LaunchIncarnation remembers what it read behind a mutex).
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "common/status.h"
#include "plan/agent_env.h"

namespace agentrt {

inline constexpr char kFenceFile[] = "FENCE";

Status WriteCheckpointFence(const std::string& checkpoint_dir, const std::string& incarnation);

// The id in <checkpoint_dir>/FENCE; nullopt when there is no fence.
Result<std::optional<std::string>> ReadCheckpointFence(const std::string& checkpoint_dir);

// OK when `incarnation` may write to `checkpoint_dir`: it is empty (not
// launched by a controller), there is no fence, or the fence names it. Else
// FailedPrecondition naming both ids.
Status CheckCheckpointFence(const std::string& checkpoint_dir, const std::string& incarnation);

// The launch id a SLURM job-array task writes to the fence before it starts
// its agent (`agentctl array-task`): "slurm-<job id>.<restart count>", new
// for each requeue of the task.
std::string ArrayTaskIncarnation(std::string_view job_id, int restart_count);

// The launch the process of `env` belongs to: the fence's id when a
// controller launched it (env.telemetry is set; the launcher fenced the
// directory just before starting it); for a SLURM job-array task whose
// directory holds a fence, its own launch (ArrayTaskIncarnation of its
// SLURM_JOB_ID and restart count, from `lookup`), even where a requeue's
// newer launch has replaced it meanwhile, so that it is refused; else "".
// Read once per process (and
// checkpoint directory) and remembered: later the file may name a successor,
// and a process of a replaced launch must not take its successor's id.
Result<std::string> LaunchIncarnation(const AgentEnv& env,
                                      const EnvLookup& lookup = ProcessEnvLookup());

// Says when an agent's fence changes on this machine (inotify on each
// checkpoint folder): `changed(agent, id)` runs on the watcher's thread once
// a new fence is in place. A folder that does not exist yet is watched once
// it does (looked for every half second). A fence written on another machine
// of a network file system goes unseen: a reader of fences keeps re-reading
// them as it would without the watcher.
class FenceWatcher {
 public:
  using Changed = std::function<void(const std::string& agent, const std::string& id)>;

  // `checkpoint_dirs`: agent -> its checkpoint folder. Internal when inotify
  // cannot be had (the caller goes on without: re-reads only).
  static Result<std::unique_ptr<FenceWatcher>> Start(
      std::map<std::string, std::string> checkpoint_dirs, Changed changed);
  ~FenceWatcher();  // stops and joins the thread
  FenceWatcher(const FenceWatcher&) = delete;
  FenceWatcher& operator=(const FenceWatcher&) = delete;

 private:
  FenceWatcher(std::map<std::string, std::string> dirs, Changed changed, int inotify_fd,
               int stop_fd);
  void Run();
  void WatchMissing();

  const std::map<std::string, std::string> dirs_;
  const Changed changed_;
  const int inotify_fd_;
  const int stop_fd_;                                // eventfd: the destructor's signal
  std::map<int, std::vector<std::string>> watched_;  // watch descriptor -> its agents
  std::vector<std::string> missing_;                 // agents whose folder is not watched yet
  std::thread thread_;
};

}  // namespace agentrt
