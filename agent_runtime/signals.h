// agentrt::SignalWatcher — turns SIGTERM, SIGINT and SIGUSR2 into callbacks on
// an ordinary thread.
//
// The signal handler only does async-signal-safe work: it bumps a per-signal
// counter and writes the signal number into a self-pipe. A watcher thread reads
// the pipe and runs the registered callbacks, where locks, allocation and I/O
// are allowed.
//
// Meaning of the signals in agentrt:
//   SIGTERM, SIGINT  stop: the controller's stop request (it signals the agent's
//                    process group) or a SLURM preemption; checkpoint, then exit.
//   SIGUSR2          checkpoint now (SLURM --signal=USR2@grace), keep running.
//
// Signal dispositions are process-wide, so at most one SignalWatcher may be
// installed at a time; a second Install() fails. Destruction restores the
// previous handlers.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "common/status.h"

namespace agentrt {

class SignalWatcher {
 public:
  using Callback = std::function<void(int signo)>;

  // Installs handlers for SIGTERM, SIGINT and SIGUSR2 and starts the watcher thread.
  static Result<std::unique_ptr<SignalWatcher>> Install();
  ~SignalWatcher();
  SignalWatcher(const SignalWatcher&) = delete;
  SignalWatcher& operator=(const SignalWatcher&) = delete;

  // Adds a callback, run on the watcher thread for every signal received
  // afterwards (in registration order). Thread-safe.
  void AddCallback(Callback callback);

  // How many times `signo` arrived since Install(). Thread-safe.
  uint64_t count(int signo) const;

 private:
  SignalWatcher(int read_fd, int write_fd);
  void Run();

  int read_fd_;
  int write_fd_;
  std::mutex mu_;
  std::vector<Callback> callbacks_;
  std::thread thread_;
};

}  // namespace agentrt
