// agentrt::Runtime — what an agent process gets from agentrt: its assignment
// (DESIGN §4), a heartbeat to the run controller, metrics reporting, stop and
// checkpoint signals, and its Checkpointer.
//
//   auto rt = agentrt::Runtime::FromEnvironment();      // inside `agentctl run`
//   if (!rt.ok()) { std::cerr << rt.status().ToString() << "\n"; return 2; }
//   auto& ckpt = (*rt)->checkpointer();
//   auto restored = ckpt.Restore();  ...
//   for (int64_t step = start; !(*rt)->ShouldStop(); ++step) {
//     ... train ...
//     (*rt)->Report(step, {{"loss", loss}});
//     if (ckpt.SaveDue()) ckpt.SaveAsync(step, state);
//   }
//   ckpt.Save(step, state);   // the stop path: a final checkpoint before exit
//
// How a stop reaches the agent: the controller (agentctl stop, Ctrl-C on
// agentctl run, a restart of the agent) sends SIGTERM to the agent's process
// group; SLURM does the same on preemption or time limit. SIGTERM and SIGINT make
// ShouldStop() true, run the OnStop callbacks, and request a checkpoint. SIGUSR2
// requests a checkpoint and training goes on. RequestStop() does the same from
// inside the process. With the handlers installed SIGTERM no longer kills the
// process by itself: the program must poll ShouldStop() (or use OnStop) and
// exit; otherwise the controller's SIGKILL after its grace period ends it.
//
// Telemetry (comms/telemetry.h): "hello" at start, a heartbeat every
// heartbeat_period carrying the latest step, "metrics" on Report(), "checkpoint"
// with checkpoint_step after every commit (rank 0), "bye" on destruction.
//
// Hooks for later integration: the agent's Group (agent_runtime/group.h,
// MakeGroup) and the bus client (comms/) will be exposed here; the assignment
// already carries everything they need (master addr/port, bus address, token file).
//
// Thread-safety: all methods may be called from any thread.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "agent_runtime/checkpointer.h"
#include "agent_runtime/signals.h"
#include "common/status.h"
#include "comms/telemetry.h"

namespace agentrt {

// The DESIGN §4 process contract, parsed.
struct Assignment {
  std::string run_dir;       // AGENTRT_RUN_DIR
  std::string agent;         // AGENTRT_AGENT
  int agent_index = 0;       // AGENTRT_AGENT_INDEX
  int rank = 0;              // RANK (or OMPI_COMM_WORLD_RANK / PMIX_RANK / SLURM_PROCID)
  int world_size = 1;        // WORLD_SIZE (or OMPI_COMM_WORLD_SIZE / SLURM_NTASKS)
  int local_rank = 0;        // LOCAL_RANK (or OMPI_COMM_WORLD_LOCAL_RANK / SLURM_LOCALID)
  int local_world_size = 1;  // LOCAL_WORLD_SIZE
  std::string master_addr;   // MASTER_ADDR
  int master_port = 0;       // MASTER_PORT
  int ports_first = 0;       // AGENTRT_PORTS "first-last"
  int ports_last = 0;
  std::string cuda_visible_devices;  // CUDA_VISIBLE_DEVICES as given
  std::vector<int> visible_gpus;     // its integer entries (empty for CPU agents)
  std::string ckpt_dir;              // AGENTRT_CKPT_DIR
  std::string bus;                   // AGENTRT_BUS host:port (may be empty: no bus)
  std::string token_file;            // AGENTRT_TOKEN_FILE
  std::string telemetry;             // AGENTRT_TELEMETRY ZeroMQ endpoint (empty: none)
  int restart_count = 0;             // AGENTRT_RESTART_COUNT
  // Optional checkpoint settings from agents.yaml (AGENTRT_CKPT_INTERVAL_S,
  // AGENTRT_CKPT_KEEP_LAST); <0 / 0 when not set.
  double ckpt_interval_s = -1;
  int ckpt_keep_last = 0;
};

// Reads the assignment through `getenv` (tests pass a map). A missing required
// variable or a malformed number is an error naming the variable and saying that
// agents are meant to be started by `agentctl run`.
Result<Assignment> AssignmentFromEnvironment(const std::function<const char*(const char*)>& getenv);
Result<Assignment> AssignmentFromEnvironment();

// CheckpointOptions whose interval_s/keep_last say "not set" (-1 / 0), so the
// Runtime fills them from the assignment.
inline CheckpointOptions UnsetCheckpointOptions() {
  CheckpointOptions c;
  c.interval_s = -1;
  c.keep_last = 0;
  return c;
}

struct RuntimeOptions {
  std::chrono::milliseconds heartbeat_period{1000};
  // Install SIGTERM/SIGINT/SIGUSR2 handlers (one Runtime per process may).
  bool install_signal_handlers = true;
  TelemetrySenderOptions telemetry;
  // Checkpointer settings; interval_s/keep_last default to the assignment's
  // (from agents.yaml) and else to 1800 s / 3. dir, agent, rank, world_size and
  // on_commit are filled in by the Runtime.
  CheckpointOptions checkpoint = UnsetCheckpointOptions();
  const Clock* clock = SteadyClock();
};

class Runtime {
 public:
  // Inside `agentctl run`: the assignment comes from the environment.
  static Result<std::unique_ptr<Runtime>> FromEnvironment(RuntimeOptions options = {});
  // With an explicit assignment (tests, embedding).
  static Result<std::unique_ptr<Runtime>> Create(Assignment assignment,
                                                 RuntimeOptions options = {});
  // Sends "bye", stops the heartbeat, waits for a checkpoint in progress and
  // restores the previous signal handlers.
  ~Runtime();
  Runtime(const Runtime&) = delete;
  Runtime& operator=(const Runtime&) = delete;

  const Assignment& assignment() const { return assignment_; }
  Checkpointer& checkpointer() { return *checkpointer_; }

  // Sends a "metrics" message with `step` and `metrics` (a JSON object of
  // numbers/strings) and makes `step` the one heartbeats carry. Never blocks:
  // when the controller is slow the message is dropped and counted.
  void Report(int64_t step, const nlohmann::json& metrics);
  // Updates the step heartbeats carry without sending metrics.
  void SetStep(int64_t step) { step_.store(step); }

  // True once a stop was requested (SIGTERM/SIGINT or RequestStop).
  bool ShouldStop() const { return stop_.load(); }
  // Runs `callback(reason)` once when a stop is requested (on the signal watcher
  // thread or the RequestStop caller's); at once if a stop was already requested.
  void OnStop(std::function<void(std::string_view reason)> callback);
  void RequestStop(std::string reason);
  // Why the stop was requested ("SIGTERM", ...); empty while running.
  std::string stop_reason() const;

  // Telemetry counters.
  uint64_t telemetry_sent() const { return sender_ ? sender_->sent() : 0; }
  uint64_t telemetry_dropped() const { return sender_ ? sender_->dropped() : 0; }
  uint64_t heartbeats_sent() const { return heartbeats_.load(); }

 private:
  Runtime(Assignment assignment, RuntimeOptions options);
  TelemetryMessage Message(TelemetryType type) const;
  void HeartbeatLoop();
  void OnSignal(int signo);

  Assignment assignment_;
  RuntimeOptions options_;
  std::unique_ptr<TelemetrySender> sender_;
  std::unique_ptr<Checkpointer> checkpointer_;
  std::unique_ptr<SignalWatcher> signals_;

  std::atomic<int64_t> step_{-1};
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> heartbeats_{0};
  mutable std::mutex mu_;
  std::string stop_reason_;
  std::vector<std::function<void(std::string_view)>> stop_callbacks_;

  std::mutex hb_mu_;
  std::condition_variable hb_cv_;
  bool hb_quit_ = false;
  std::thread heartbeat_;
};

}  // namespace agentrt
