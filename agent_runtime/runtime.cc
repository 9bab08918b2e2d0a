#include "agent_runtime/runtime.h"

#include <unistd.h>

#include <csignal>
#include <utility>

#include "comms/auth.h"
#include "plan/fence.h"
#include "plan/run_dir.h"

namespace agentrt {

Result<std::unique_ptr<Runtime>> Runtime::FromEnvironment(RuntimeOptions options) {
  AGENTRT_ASSIGN_OR_RETURN(AgentEnv env, AgentEnv::FromProcess());
  // The agent's view of the plan, not plan.json: its size does not grow with the run.
  Result<Plan> plan = ReadAgentPlanView(env.run_dir, env.agent);
  if (!plan.ok()) {
    return plan.status().WithContext("runtime (agent " + env.agent + " rank " +
                                     std::to_string(env.rank) +
                                     "): its view of the run's plan (written by agentctl run)");
  }
  return Create(std::move(env), std::move(plan).value(), std::move(options));
}

Result<std::unique_ptr<Runtime>> Runtime::Create(AgentEnv env, Plan plan, RuntimeOptions options) {
  std::string where = "runtime (agent " + env.agent + " rank " + std::to_string(env.rank) + "): ";
  if (plan.FindAgent(env.agent) == nullptr) {
    return NotFound(where + "the plan of run " + plan.run + " has no agent named '" + env.agent +
                    "'");
  }
  std::unique_ptr<Runtime> rt(new Runtime(std::move(env), std::move(plan), std::move(options)));
  const AgentEnv& a = rt->env_;
  const AgentPlan& me = *rt->agent_plan_;
  if (me.ranks != a.world_size) {
    return FailedPrecondition(where + "the plan gives agent " + a.agent + " " +
                              std::to_string(me.ranks) + " ranks but WORLD_SIZE is " +
                              std::to_string(a.world_size));
  }

  if (!a.telemetry.empty()) {
    // Every message is signed with the agent's token: the controller counts
    // no heartbeat it cannot attribute (comms/telemetry.h).
    TelemetrySenderOptions telemetry = rt->options_.telemetry;
    if (telemetry.token.empty() && !a.token_file.empty()) {
      auto credential = ReadTokenFile(a.token_file);
      if (!credential.ok()) return credential.status().WithContext(where + "telemetry");
      telemetry.token = credential->token;
    }
    auto sender = TelemetrySender::Connect(a.telemetry, std::move(telemetry));
    if (!sender.ok()) return sender.status().WithContext(where + "telemetry");
    rt->sender_ = std::move(sender).value();
  }

  CheckpointOptions c = rt->options_.checkpoint;
  c.dir = a.ckpt_dir;
  c.agent = a.agent;
  c.rank = a.rank;
  c.world_size = a.world_size;
  // This launch's id, for the checkpoints it commits and its bus calls.
  if (c.incarnation.empty()) {
    auto launch = LaunchIncarnation(a);
    if (!launch.ok()) return launch.status().WithContext(where + "launch");
    c.incarnation = std::move(launch).value();
  }
  if (rt->options_.bus.incarnation.empty()) rt->options_.bus.incarnation = c.incarnation;
  if (c.interval_s < 0) c.interval_s = me.checkpoint.interval_s;
  if (c.keep_last <= 0) c.keep_last = me.checkpoint.keep_last;
  if (me.checkpoint.snapshot == "fork") c.snapshot = CheckpointOptions::Snapshot::kFork;
  Runtime* self = rt.get();
  auto user_on_commit = c.on_commit;
  c.on_commit = [self, user_on_commit](int64_t step) {
    if (self->sender_) {
      TelemetryMessage m = self->Message(TelemetryType::kCheckpoint);
      m.checkpoint_step = step;
      self->sender_->Send(m);
    }
    if (user_on_commit) user_on_commit(step);
  };
  auto user_on_restore = c.on_restore;
  c.on_restore = [self, user_on_restore](const RestoreResult& r) {
    if (self->sender_) {
      TelemetryMessage m = self->Message(TelemetryType::kRestore);
      m.checkpoint_step = r.restored() ? r.step : -1;
      for (const auto& skipped : r.skipped) m.skipped_steps.push_back(skipped.step);
      self->sender_->Send(m);
    }
    if (user_on_restore) user_on_restore(r);
  };
  auto ckpt = Checkpointer::Create(std::move(c), rt->options_.clock);
  if (!ckpt.ok()) return ckpt.status().WithContext(where.substr(0, where.size() - 2));
  rt->checkpointer_ = std::move(ckpt).value();

  if (rt->options_.install_signal_handlers) {
    auto signals = SignalWatcher::Install();
    if (!signals.ok()) return signals.status().WithContext(where.substr(0, where.size() - 2));
    rt->signals_ = std::move(signals).value();
    rt->signals_->AddCallback([self](int signo) { self->OnSignal(signo); });
  }

  if (rt->sender_) rt->sender_->Send(rt->Message(TelemetryType::kHello));
  rt->heartbeat_ = std::thread([self] { self->HeartbeatLoop(); });
  return rt;
}

Runtime::Runtime(AgentEnv env, Plan plan, RuntimeOptions options)
    : env_(std::move(env)), plan_(std::move(plan)), options_(std::move(options)) {
  agent_plan_ = plan_.FindAgent(env_.agent);
}

Result<Group*> Runtime::group() {
  std::lock_guard<std::mutex> lock(lazy_mu_);
  if (group_) return group_.get();
  if (!group_status_.ok()) return group_status_;
  GroupOptions g;
  g.backend = agent_plan_->backend;
  g.agent = env_.agent;
  g.rank = env_.rank;
  g.world_size = env_.world_size;
  g.local_rank = env_.local_rank;
  g.visible_gpus = env_.VisibleGpuCount();
  g.restart_count = env_.restart_count;
  g.master_addr = env_.master_addr;
  g.master_port = env_.master_port;
  g.init_timeout = options_.group_init_timeout;
  Result<std::unique_ptr<Group>> made = MakeGroup(g);
  if (!made.ok()) {
    group_status_ = made.status();
    return group_status_;
  }
  group_ = RecordCollectives(std::move(made).value(), &recorder_);
  recording_.store(true);
  return group_.get();
}

Result<BusClient*> Runtime::bus() {
  std::lock_guard<std::mutex> lock(lazy_mu_);
  if (bus_) return bus_.get();
  AGENTRT_ASSIGN_OR_RETURN(bus_, BusClient::ForAgent(env_, options_.bus));
  return bus_.get();
}

Runtime::~Runtime() {
  {
    std::lock_guard<std::mutex> lock(hb_mu_);
    hb_quit_ = true;
  }
  hb_cv_.notify_all();
  if (heartbeat_.joinable()) heartbeat_.join();
  signals_.reset();  // no callback into this object after this point
  if (checkpointer_) {
    checkpointer_->Wait()
        .IgnoreError();  // a failed last save was already reported by Save()/Wait()
  }
  if (sender_) {
    TelemetryMessage bye = Message(TelemetryType::kBye);
    bye.reason = stop_reason();
    sender_->Send(bye);
  }
}

TelemetryMessage Runtime::Message(TelemetryType type) const {
  TelemetryMessage m;
  m.type = type;
  m.agent = env_.agent;
  m.rank = env_.rank;
  m.pid = ::getpid();
  m.time = UnixTimeSeconds();
  m.restart_count = env_.restart_count;
  m.step = step_.load();
  m.flops_per_sample = flops_per_sample_.load();
  return m;
}

void Runtime::Report(int64_t step, const nlohmann::json& metrics) {
  step_.store(step);
  if (!sender_) return;
  TelemetryMessage m = Message(TelemetryType::kMetrics);
  m.metrics = metrics.is_object() ? metrics : nlohmann::json::object();
  // Only a report that went out stands for a heartbeat (a dropped one does not).
  if (sender_->Send(m))
    reported_at_.store(std::chrono::steady_clock::now().time_since_epoch().count());
}

void Runtime::HeartbeatLoop() {
  std::unique_lock<std::mutex> lock(hb_mu_);
  while (!hb_quit_) {
    const auto since_report = std::chrono::steady_clock::now() -
                              std::chrono::steady_clock::time_point(
                                  std::chrono::steady_clock::duration(reported_at_.load()));
    // A report within the period said all a heartbeat would (but a collective's state).
    const bool heard = !recording_.load() && since_report < options_.heartbeat_period;
    if (sender_ && !heard) {
      TelemetryMessage m = Message(TelemetryType::kHeartbeat);
      if (recording_.load()) m.collective = recorder_.Snapshot();
      sender_->Send(m);
      heartbeats_.fetch_add(1);
    }
    hb_cv_.wait_for(lock, options_.heartbeat_period, [this] { return hb_quit_; });
  }
}

void Runtime::OnSignal(int signo) {
  if (signo == SIGUSR2) {
    checkpointer_->RequestSave();
    return;
  }
  if (signo == SIGTERM || signo == SIGINT) {
    checkpointer_->RequestSave();
    RequestStop(signo == SIGTERM ? "SIGTERM" : "SIGINT");
  }
}

void Runtime::RequestStop(std::string reason) {
  std::vector<std::function<void(std::string_view)>> callbacks;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stop_.load()) return;
    stop_reason_ = std::move(reason);
    stop_.store(true);
    callbacks.swap(stop_callbacks_);
  }
  checkpointer_->RequestSave();
  for (auto& cb : callbacks) cb(stop_reason_);
}

void Runtime::OnStop(std::function<void(std::string_view reason)> callback) {
  std::unique_lock<std::mutex> lock(mu_);
  if (stop_.load()) {
    std::string reason = stop_reason_;
    lock.unlock();
    callback(reason);
    return;
  }
  stop_callbacks_.push_back(std::move(callback));
}

std::string Runtime::stop_reason() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stop_reason_;
}

}  // namespace agentrt
