#include "plan/fence.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/inotify.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <map>
#include <mutex>

#include "common/file_util.h"

namespace agentrt {

Status WriteCheckpointFence(const std::string& checkpoint_dir, const std::string& incarnation) {
  return WriteFileAtomic(checkpoint_dir + "/" + kFenceFile, incarnation + "\n", {.mode = 0600})
      .WithContext("cannot fence " + checkpoint_dir);
}

Result<std::optional<std::string>> ReadCheckpointFence(const std::string& checkpoint_dir) {
  auto text = ReadWholeFile(checkpoint_dir + "/" + kFenceFile, 4096);
  if (!text.ok()) {
    if (text.status().code() == StatusCode::kNotFound) return std::optional<std::string>();
    return text.status();
  }
  std::string id = *text;
  while (!id.empty() && (id.back() == '\n' || id.back() == '\r')) id.pop_back();
  return std::optional<std::string>(id);
}

Status CheckCheckpointFence(const std::string& checkpoint_dir, const std::string& incarnation) {
  if (incarnation.empty()) return Status::Ok();
  AGENTRT_ASSIGN_OR_RETURN(const std::optional<std::string> fence,
                           ReadCheckpointFence(checkpoint_dir));
  if (!fence || *fence == incarnation) return Status::Ok();
  return FailedPrecondition("fenced: incarnation " + incarnation + " may no longer write to " +
                            checkpoint_dir + "; a newer one (" + *fence +
                            ") has been launched in its place");
}

std::string ArrayTaskIncarnation(std::string_view job_id, int restart_count) {
  return "slurm-" + std::string(job_id) + "." + std::to_string(restart_count);
}

Result<std::string> LaunchIncarnation(const AgentEnv& env, const EnvLookup& lookup) {
  // An array task's launch has no controller; its id says which task it is.
  std::string array_launch;
  if (env.telemetry.empty()) {
    const std::optional<std::string> job = lookup("SLURM_JOB_ID");
    if (!job || job->empty()) return std::string();
    array_launch = ArrayTaskIncarnation(*job, env.restart_count);
  }
  static std::mutex mu;
  static std::map<std::string, std::string> read;  // checkpoint dir -> the id found first
  std::lock_guard<std::mutex> lock(mu);
  if (auto it = read.find(env.ckpt_dir); it != read.end()) return it->second;
  auto fence = ReadCheckpointFence(env.ckpt_dir);
  if (!fence.ok()) return fence.status().WithContext("checkpoint fence of agent " + env.agent);
  std::string id = fence->value_or(std::string());
  // An array task's own launch, also where a requeue has fenced it meanwhile
  // (then refused); none where no task fenced the directory.
  if (!array_launch.empty() && !id.empty()) id = std::move(array_launch);
  return read.emplace(env.ckpt_dir, std::move(id)).first->second;
}

Result<std::unique_ptr<FenceWatcher>> FenceWatcher::Start(
    std::map<std::string, std::string> checkpoint_dirs, Changed changed) {
  const int inotify_fd = ::inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
  if (inotify_fd < 0) return ErrnoStatus(errno, "cannot watch the checkpoint fences (inotify)");
  const int stop_fd = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (stop_fd < 0) {
    const Status failed = ErrnoStatus(errno, "cannot watch the checkpoint fences (eventfd)");
    ::close(inotify_fd);
    return failed;
  }
  std::unique_ptr<FenceWatcher> w(
      new FenceWatcher(std::move(checkpoint_dirs), std::move(changed), inotify_fd, stop_fd));
  w->WatchMissing();  // before Start returns: a fence written after it is seen
  w->thread_ = std::thread([raw = w.get()] { raw->Run(); });
  return w;
}

FenceWatcher::FenceWatcher(std::map<std::string, std::string> dirs, Changed changed, int inotify_fd,
                           int stop_fd)
    : dirs_(std::move(dirs)),
      changed_(std::move(changed)),
      inotify_fd_(inotify_fd),
      stop_fd_(stop_fd) {
  for (const auto& [agent, dir] : dirs_) missing_.push_back(agent);
}

FenceWatcher::~FenceWatcher() {
  const uint64_t one = 1;
  if (::write(stop_fd_, &one, sizeof one) != sizeof one) {
    // An eventfd write fails only on overflow: the thread is told already.
  }
  if (thread_.joinable()) thread_.join();
  ::close(inotify_fd_);
  ::close(stop_fd_);
}

void FenceWatcher::WatchMissing() {
  std::vector<std::string> still;
  for (std::string& agent : missing_) {
    // A fence is written to a temporary name and renamed over FENCE.
    const int wd = ::inotify_add_watch(inotify_fd_, dirs_.at(agent).c_str(),
                                       IN_MOVED_TO | IN_CLOSE_WRITE | IN_ONLYDIR);
    if (wd >= 0) {
      watched_[wd].push_back(std::move(agent));  // the same folder twice: the same wd
    } else if (errno != ENOSPC) {
      still.push_back(std::move(agent));  // not there yet
    }  // ENOSPC: out of watches (fs.inotify.max_user_watches); re-reads only
  }
  missing_ = std::move(still);
}

void FenceWatcher::Run() {
  alignas(struct inotify_event) char buf[16384];
  for (;;) {
    pollfd fds[2] = {{inotify_fd_, POLLIN, 0}, {stop_fd_, POLLIN, 0}};
    const int ready = ::poll(fds, 2, 500);
    if (ready < 0 && errno != EINTR) return;
    if (fds[1].revents != 0) return;
    if (ready > 0 && (fds[0].revents & POLLIN) != 0) {
      const ssize_t n = ::read(inotify_fd_, buf, sizeof buf);
      for (ssize_t at = 0; n > 0 && at < n;) {
        const auto* e = reinterpret_cast<const struct inotify_event*>(buf + at);
        at += static_cast<ssize_t>(sizeof(struct inotify_event) + e->len);
        auto it = watched_.find(e->wd);
        if (it == watched_.end()) continue;
        if ((e->mask & IN_IGNORED) != 0) {  // the folder went: watched again once it is back
          for (std::string& agent : it->second) missing_.push_back(std::move(agent));
          watched_.erase(it);
          continue;
        }
        if (e->len == 0 || std::strcmp(e->name, kFenceFile) != 0) continue;
        for (const std::string& agent : it->second) {
          auto fence = ReadCheckpointFence(dirs_.at(agent));
          if (fence.ok() && fence->has_value()) changed_(agent, **fence);
        }
      }
    }
    if (!missing_.empty()) WatchMissing();
  }
}

}  // namespace agentrt
