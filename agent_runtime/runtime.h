// agentrt::Runtime — what an agent process gets from agentrt: its assignment
// (the agent environment, plan/agent_env.h), its own entry of the
// run's plan (args, checkpoint policy, group backend, ports, GPUs), its Group,
// its BusClient, a heartbeat to the run controller, metrics reporting, stop and
// checkpoint signals, and its Checkpointer.
//
//   auto rt = agentrt::Runtime::FromEnvironment();      // inside `agentctl run`
//   if (!rt.ok()) { std::cerr << rt.status().ToString() << "\n"; return 2; }
//   const nlohmann::json& args = (*rt)->args();          // this agent's `args:`
//   auto& ckpt = (*rt)->checkpointer();                  // policy from the plan
//   auto restored = ckpt.Restore();  ...
//   for (int64_t step = start; !(*rt)->ShouldStop(); ++step) {
//     ... train ...
//     (*rt)->Report(step, {{"loss", loss}});
//     if (ckpt.SaveDue()) ckpt.SaveAsync(step, state);
//   }
//   ckpt.Save(step, state);   // the stop path: a final checkpoint before exit
//
// The plan is read once, from RUN_DIR/plan.json, when the Runtime is made.
// group() and bus() are made on first use: group() is collective (every rank of
// the agent must call it), bus() connects lazily.
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
// heartbeat_period carrying the latest step (skipped when a Report() went out
// within the period and there is no collective to describe: any message tells
// the controller the rank is alive, and at one report a second this halves
// what thousands of agents send; the longest silence of a running rank is
// then just under two periods), "metrics" on Report(), "checkpoint"
// with checkpoint_step after every commit (rank 0), "bye" on destruction.
//
// Thread-safety: all methods may be called from any thread, except group(),
// which belongs to the training thread (a Group is used by one thread).
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
#include "agent_runtime/flight_recorder.h"
#include "agent_runtime/group.h"
#include "agent_runtime/signals.h"
#include "common/status.h"
#include "comms/bus_client.h"
#include "comms/telemetry.h"
#include "plan/agent_env.h"
#include "plan/plan.h"

namespace agentrt {

// CheckpointOptions whose interval_s/keep_last say "not set" (-1 / 0), so the
// Runtime fills them from the agent's checkpoint policy in the plan.
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
  // Checkpointer settings; interval_s/keep_last default to the agent's
  // `checkpoint:` policy in the plan. dir, agent, rank, world_size and
  // on_commit are filled in by the Runtime.
  CheckpointOptions checkpoint = UnsetCheckpointOptions();
  const Clock* clock = SteadyClock();
  // group(): how long every rank waits for the others to join.
  std::chrono::milliseconds group_init_timeout{std::chrono::minutes(2)};
  BusClientOptions bus;
};

class Runtime {
 public:
  // Inside `agentctl run`: the assignment comes from the environment and the
  // plan from RUN_DIR/plan.json. Errors name the variable or the file.
  static Result<std::unique_ptr<Runtime>> FromEnvironment(RuntimeOptions options = {});
  // With an explicit assignment and plan (tests, embedding); `plan` must hold
  // an agent named env.agent.
  static Result<std::unique_ptr<Runtime>> Create(AgentEnv env, Plan plan,
                                                 RuntimeOptions options = {});
  // Sends "bye", stops the heartbeat, waits for a checkpoint in progress and
  // restores the previous signal handlers.
  ~Runtime();
  Runtime(const Runtime&) = delete;
  Runtime& operator=(const Runtime&) = delete;

  // The agent environment this rank was started with.
  const AgentEnv& env() const { return env_; }
  // This agent's view of the run's plan (PlanViews, plan/plan.h: itself, its
  // league opponents and env peers, its channels), and its entry of it.
  const Plan& plan() const { return plan_; }
  const AgentPlan& agent_plan() const { return *agent_plan_; }
  // This agent's `args:` from agents.yaml (a JSON object).
  const nlohmann::json& args() const { return agent_plan_->args; }
  Checkpointer& checkpointer() { return *checkpointer_; }

  // The agent's own group (backend from the plan, rendezvous on its
  // MASTER_ADDR:MASTER_PORT, this rank's GPU from LOCAL_RANK). Made on the first
  // call, which is collective: every rank must call it. Later calls return the
  // same group (or the same error).
  Result<Group*> group();
  // The agent's bus connection (AGENTRT_BUS + its token file), made on the
  // first call. FailedPrecondition when the run has no bus.
  Result<BusClient*> bus();

  // Sends a "metrics" message with `step` and `metrics` (a JSON object of
  // numbers/strings) and makes `step` the one heartbeats carry. Never blocks:
  // when the controller is slow the message is dropped and counted.
  void Report(int64_t step, const nlohmann::json& metrics);
  // Updates the step heartbeats carry without sending metrics.
  void SetStep(int64_t step) { step_.store(step); }
  // The work of one sample, in floating-point operations (forward + backward;
  // a sample is what one step of Report/SetStep counts: agent-worker's are env
  // steps). Heartbeats carry it; the controller reports achieved FLOP/s =
  // samples/s x this against the partition's peak (plan: peak_flops) in
  // status. 0: not declared.
  void SetFlopsPerSample(double flops) { flops_per_sample_.store(flops); }

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
  Runtime(AgentEnv env, Plan plan, RuntimeOptions options);
  TelemetryMessage Message(TelemetryType type) const;
  void HeartbeatLoop();
  void OnSignal(int signo);

  AgentEnv env_;
  Plan plan_;
  const AgentPlan* agent_plan_ = nullptr;  // into plan_
  RuntimeOptions options_;
  std::mutex lazy_mu_;  // guards group_/bus_ creation
  std::unique_ptr<Group> group_;
  Status group_status_;
  FlightRecorder recorder_;             // every collective of group_
  std::atomic<bool> recording_{false};  // group_ exists: heartbeats carry recorder_
  std::unique_ptr<BusClient> bus_;
  std::unique_ptr<TelemetrySender> sender_;
  std::unique_ptr<Checkpointer> checkpointer_;
  std::unique_ptr<SignalWatcher> signals_;

  std::atomic<int64_t> step_{-1};
  std::atomic<int64_t> reported_at_{0};  // steady_clock ticks of the last Report()
  std::atomic<double> flops_per_sample_{0};
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
