#include "agent_runtime/runtime.h"

#include <unistd.h>

#include <charconv>
#include <csignal>
#include <cstdlib>
#include <utility>

namespace agentrt {
namespace {

constexpr char kOutsideHint[] =
    " (agent processes are started by `agentctl run`, which sets it; to run one by hand, set the "
    "DESIGN §4 variables yourself)";

Result<int64_t> ParseInt(std::string_view name, std::string_view text) {
  int64_t v = 0;
  auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || ptr != text.data() + text.size()) {
    return InvalidArgument("environment variable " + std::string(name) + "=\"" + std::string(text) +
                           "\" is not an integer");
  }
  return v;
}

}  // namespace

Result<Assignment> AssignmentFromEnvironment() {
  return AssignmentFromEnvironment([](const char* name) { return std::getenv(name); });
}

Result<Assignment> AssignmentFromEnvironment(
    const std::function<const char*(const char*)>& getenv) {
  auto get = [&getenv](const char* name) -> const char* {
    const char* v = getenv(name);
    return (v != nullptr && *v != '\0') ? v : nullptr;
  };
  auto required = [&get](const char* name) -> Result<std::string> {
    const char* v = get(name);
    if (v == nullptr)
      return NotFound(std::string("environment variable ") + name + " is not set" + kOutsideHint);
    return std::string(v);
  };
  // The first of `names` that is set, parsed as an integer; `fallback` if none is.
  auto integer = [&get](std::initializer_list<const char*> names, int64_t fallback,
                        bool is_required) -> Result<int64_t> {
    for (const char* n : names) {
      if (const char* v = get(n)) return ParseInt(n, v);
    }
    if (is_required) {
      return NotFound(std::string("environment variable ") + *names.begin() + " is not set" +
                      kOutsideHint);
    }
    return fallback;
  };

  Assignment a;
  AGENTRT_ASSIGN_OR_RETURN(a.run_dir, required("AGENTRT_RUN_DIR"));
  AGENTRT_ASSIGN_OR_RETURN(a.agent, required("AGENTRT_AGENT"));
  AGENTRT_ASSIGN_OR_RETURN(a.ckpt_dir, required("AGENTRT_CKPT_DIR"));
  AGENTRT_ASSIGN_OR_RETURN(int64_t index, integer({"AGENTRT_AGENT_INDEX"}, 0, true));
  // Under mpirun or srun the per-rank variables come from the launcher.
  AGENTRT_ASSIGN_OR_RETURN(
      int64_t rank,
      integer({"RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "SLURM_PROCID"}, 0, true));
  AGENTRT_ASSIGN_OR_RETURN(
      int64_t world, integer({"WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "SLURM_NTASKS"}, 1, true));
  AGENTRT_ASSIGN_OR_RETURN(
      int64_t local_rank,
      integer({"LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID"}, rank, false));
  AGENTRT_ASSIGN_OR_RETURN(
      int64_t local_world,
      integer({"LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE"}, world, false));
  AGENTRT_ASSIGN_OR_RETURN(int64_t master_port, integer({"MASTER_PORT"}, 0, false));
  AGENTRT_ASSIGN_OR_RETURN(int64_t restarts, integer({"AGENTRT_RESTART_COUNT"}, 0, false));
  AGENTRT_ASSIGN_OR_RETURN(int64_t keep_last, integer({"AGENTRT_CKPT_KEEP_LAST"}, 0, false));
  if (world < 1 || rank < 0 || rank >= world) {
    return InvalidArgument("RANK=" + std::to_string(rank) + " is outside WORLD_SIZE=" +
                           std::to_string(world) + " for agent " + a.agent);
  }
  a.agent_index = static_cast<int>(index);
  a.rank = static_cast<int>(rank);
  a.world_size = static_cast<int>(world);
  a.local_rank = static_cast<int>(local_rank);
  a.local_world_size = static_cast<int>(local_world);
  a.master_port = static_cast<int>(master_port);
  a.restart_count = static_cast<int>(restarts);
  a.ckpt_keep_last = static_cast<int>(keep_last);
  if (const char* v = get("MASTER_ADDR")) a.master_addr = v;
  if (const char* v = get("AGENTRT_BUS")) a.bus = v;
  if (const char* v = get("AGENTRT_TOKEN_FILE")) a.token_file = v;
  if (const char* v = get("AGENTRT_TELEMETRY")) a.telemetry = v;
  if (const char* v = get("AGENTRT_CKPT_INTERVAL_S")) {
    char* end = nullptr;
    a.ckpt_interval_s = std::strtod(v, &end);
    if (end == v || *end != '\0' || a.ckpt_interval_s < 0) {
      return InvalidArgument(std::string("environment variable AGENTRT_CKPT_INTERVAL_S=\"") + v +
                             "\" is not a non-negative number of seconds");
    }
  }
  if (const char* v = get("AGENTRT_PORTS")) {
    std::string_view s = v;
    auto dash = s.find('-');
    if (dash == std::string_view::npos) {
      return InvalidArgument(std::string("environment variable AGENTRT_PORTS=\"") + v +
                             "\" is not of the form first-last");
    }
    AGENTRT_ASSIGN_OR_RETURN(int64_t first, ParseInt("AGENTRT_PORTS", s.substr(0, dash)));
    AGENTRT_ASSIGN_OR_RETURN(int64_t last, ParseInt("AGENTRT_PORTS", s.substr(dash + 1)));
    if (first < 1 || last > 65535 || first > last) {
      return InvalidArgument(std::string("environment variable AGENTRT_PORTS=\"") + v +
                             "\" is not a port range within 1-65535");
    }
    a.ports_first = static_cast<int>(first);
    a.ports_last = static_cast<int>(last);
  }
  if (const char* v = getenv("CUDA_VISIBLE_DEVICES")) {
    a.cuda_visible_devices = v;
    std::string_view s = v;
    while (!s.empty()) {
      auto comma = s.find(',');
      std::string_view item = s.substr(0, comma);
      int gpu = 0;
      auto [ptr, ec] = std::from_chars(item.data(), item.data() + item.size(), gpu);
      // UUIDs (GPU-...) and MIG names are kept only in cuda_visible_devices.
      if (ec == std::errc() && ptr == item.data() + item.size()) a.visible_gpus.push_back(gpu);
      if (comma == std::string_view::npos) break;
      s.remove_prefix(comma + 1);
    }
  }
  return a;
}

Result<std::unique_ptr<Runtime>> Runtime::FromEnvironment(RuntimeOptions options) {
  AGENTRT_ASSIGN_OR_RETURN(Assignment a, AssignmentFromEnvironment());
  return Create(std::move(a), std::move(options));
}

Result<std::unique_ptr<Runtime>> Runtime::Create(Assignment assignment, RuntimeOptions options) {
  std::string where =
      "runtime (agent " + assignment.agent + " rank " + std::to_string(assignment.rank) + "): ";
  std::unique_ptr<Runtime> rt(new Runtime(std::move(assignment), std::move(options)));
  const Assignment& a = rt->assignment_;

  if (!a.telemetry.empty()) {
    auto sender = TelemetrySender::Connect(a.telemetry, rt->options_.telemetry);
    if (!sender.ok()) return sender.status().WithContext(where + "telemetry");
    rt->sender_ = std::move(sender).value();
  }

  CheckpointOptions c = rt->options_.checkpoint;
  c.dir = a.ckpt_dir;
  c.agent = a.agent;
  c.rank = a.rank;
  c.world_size = a.world_size;
  if (c.interval_s < 0) c.interval_s = a.ckpt_interval_s >= 0 ? a.ckpt_interval_s : 1800;
  if (c.keep_last <= 0) c.keep_last = a.ckpt_keep_last > 0 ? a.ckpt_keep_last : 3;
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

Runtime::Runtime(Assignment assignment, RuntimeOptions options)
    : assignment_(std::move(assignment)), options_(std::move(options)) {}

Runtime::~Runtime() {
  {
    std::lock_guard<std::mutex> lock(hb_mu_);
    hb_quit_ = true;
  }
  hb_cv_.notify_all();
  if (heartbeat_.joinable()) heartbeat_.join();
  signals_.reset();  // no callback into this object after this point
  if (checkpointer_) {
    (void)checkpointer_->Wait();  // a failed last save was already reported by Save()/Wait()
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
  m.agent = assignment_.agent;
  m.rank = assignment_.rank;
  m.pid = ::getpid();
  m.time = UnixTimeSeconds();
  m.restart_count = assignment_.restart_count;
  m.step = step_.load();
  return m;
}

void Runtime::Report(int64_t step, const nlohmann::json& metrics) {
  step_.store(step);
  if (!sender_) return;
  TelemetryMessage m = Message(TelemetryType::kMetrics);
  m.metrics = metrics.is_object() ? metrics : nlohmann::json::object();
  sender_->Send(m);
}

void Runtime::HeartbeatLoop() {
  std::unique_lock<std::mutex> lock(hb_mu_);
  while (!hb_quit_) {
    if (sender_) {
      sender_->Send(Message(TelemetryType::kHeartbeat));
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
