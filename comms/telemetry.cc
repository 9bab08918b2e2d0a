#include "comms/telemetry.h"

#include <unistd.h>
#include <zmq.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "common/enum_names.h"
#include "comms/auth.h"

namespace agentrt {
namespace {

// The one place ZeroMQ errors become Status: "<what> (<endpoint>): <zmq_strerror>".
Status ZmqError(std::string_view what, std::string_view endpoint) {
  int err = zmq_errno();
  return Unavailable(std::string(what) + " (" + std::string(endpoint) + "): " + zmq_strerror(err));
}

constexpr EnumName<TelemetryType> kTelemetryTypeNames[] = {
    {TelemetryType::kHello, "hello"},     {TelemetryType::kHeartbeat, "heartbeat"},
    {TelemetryType::kMetrics, "metrics"}, {TelemetryType::kCheckpoint, "checkpoint"},
    {TelemetryType::kBye, "bye"},         {TelemetryType::kRestore, "restore"}};

// A context of its own and one socket of `type` in it; on failure neither is
// left. The messages are literals, so nothing runs between the failing call
// and ZmqError's reading of errno.
Status OpenSocket(int type, const char* ctx_what, const char* socket_what,
                  std::string_view endpoint, void** context, void** socket) {
  *context = zmq_ctx_new();
  if (*context == nullptr) return ZmqError(ctx_what, endpoint);
  *socket = zmq_socket(*context, type);
  if (*socket == nullptr) {
    Status s = ZmqError(socket_what, endpoint);
    zmq_ctx_term(*context);
    return s;
  }
  return Status::Ok();
}

Result<TelemetryType> ParseType(std::string_view name) {
  if (auto type = ValueIn(kTelemetryTypeNames, name)) return *type;
  return InvalidArgument("telemetry: unknown message type \"" + std::string(name) + "\"");
}

}  // namespace

std::string_view TelemetryTypeName(TelemetryType type) { return NameIn(kTelemetryTypeNames, type); }

double UnixTimeSeconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string EncodeTelemetry(const TelemetryMessage& m, uint64_t seq) {
  nlohmann::json j;
  j["type"] = TelemetryTypeName(m.type);
  j["agent"] = m.agent;
  j["rank"] = m.rank;
  j["pid"] = m.pid;
  j["time"] = m.time;
  j["restart_count"] = m.restart_count;
  j["step"] = m.step;
  if (m.type == TelemetryType::kMetrics) {
    j["metrics"] = m.metrics.is_object() ? m.metrics : nlohmann::json::object();
  }
  if (m.type == TelemetryType::kCheckpoint) j["checkpoint_step"] = m.checkpoint_step;
  if (m.type == TelemetryType::kBye && !m.reason.empty()) j["reason"] = m.reason;
  if (m.type == TelemetryType::kRestore) {
    j["restored_step"] = m.checkpoint_step;
    j["skipped_steps"] = m.skipped_steps;
  }
  if (m.type == TelemetryType::kHeartbeat && m.collective) j["collective"] = m.collective->ToJson();
  if (m.flops_per_sample > 0) j["flops_per_sample"] = m.flops_per_sample;
  if (seq == 0) seq = m.seq;
  if (seq > 0) j["seq"] = seq;
  // Replace invalid UTF-8 rather than throw: a metric name is user data.
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

Result<TelemetryMessage> DecodeTelemetry(std::string_view text) {
  nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return InvalidArgument("telemetry: message is not a JSON object");
  }
  auto type_it = j.find("type");
  if (type_it == j.end() || !type_it->is_string()) {
    return InvalidArgument("telemetry: message has no string \"type\"");
  }
  TelemetryMessage m;
  AGENTRT_ASSIGN_OR_RETURN(m.type, ParseType(type_it->get<std::string>()));
  auto agent_it = j.find("agent");
  if (agent_it == j.end() || !agent_it->is_string()) {
    return InvalidArgument("telemetry: " + std::string(TelemetryTypeName(m.type)) +
                           " message has no string \"agent\"");
  }
  m.agent = agent_it->get<std::string>();
  auto rank_it = j.find("rank");
  if (rank_it == j.end() || !rank_it->is_number_integer()) {
    return InvalidArgument("telemetry: " + std::string(TelemetryTypeName(m.type)) +
                           " message from agent " + m.agent + " has no integer \"rank\"");
  }
  m.rank = rank_it->get<int>();
  auto get_int = [&j](const char* key, int64_t fallback) {
    auto it = j.find(key);
    return (it != j.end() && it->is_number_integer()) ? it->get<int64_t>() : fallback;
  };
  m.pid = get_int("pid", 0);
  m.restart_count = static_cast<int>(get_int("restart_count", 0));
  m.step = get_int("step", -1);
  m.checkpoint_step = get_int("checkpoint_step", -1);
  auto time_it = j.find("time");
  if (time_it != j.end() && time_it->is_number()) m.time = time_it->get<double>();
  if (m.type == TelemetryType::kMetrics) {
    auto metrics_it = j.find("metrics");
    if (metrics_it == j.end() || !metrics_it->is_object()) {
      return InvalidArgument("telemetry: metrics message from agent " + m.agent + " rank " +
                             std::to_string(m.rank) + " has no \"metrics\" object");
    }
    m.metrics = std::move(*metrics_it);
  }
  if (m.type == TelemetryType::kCheckpoint && m.checkpoint_step < 0) {
    return InvalidArgument("telemetry: checkpoint message from agent " + m.agent + " rank " +
                           std::to_string(m.rank) + " has no \"checkpoint_step\"");
  }
  if (m.type == TelemetryType::kRestore) {
    m.checkpoint_step = get_int("restored_step", -1);
    if (auto it = j.find("skipped_steps"); it != j.end() && it->is_array()) {
      for (const auto& step : *it) {
        if (step.is_number_integer()) m.skipped_steps.push_back(step.get<int64_t>());
      }
    }
  }
  auto reason_it = j.find("reason");
  if (reason_it != j.end() && reason_it->is_string()) m.reason = reason_it->get<std::string>();
  if (auto it = j.find("flops_per_sample"); it != j.end() && it->is_number()) {
    m.flops_per_sample = it->get<double>();
  }
  if (auto it = j.find("collective"); it != j.end() && !it->is_null()) {
    // A block that is not a snapshot is left out; the heartbeat still counts.
    if (auto collective = CollectiveSnapshot::FromJson(*it); collective.ok())
      m.collective = std::move(collective).value();
  }
  if (auto it = j.find("seq"); it != j.end() && it->is_number_unsigned()) {
    m.seq = it->get<uint64_t>();
  }
  return m;
}

// ---------------------------------------------------------------- sender

Result<std::unique_ptr<TelemetrySender>> TelemetrySender::Connect(const std::string& endpoint,
                                                                  TelemetrySenderOptions options) {
  if (endpoint.empty()) return InvalidArgument("telemetry sender: empty endpoint");
  void* context = nullptr;
  void* socket = nullptr;
  AGENTRT_RETURN_IF_ERROR(OpenSocket(ZMQ_PUSH, "telemetry sender: zmq_ctx_new",
                                     "telemetry sender: zmq_socket(PUSH)", endpoint, &context,
                                     &socket));
  int hwm = options.send_high_water_mark;
  int linger = static_cast<int>(options.linger.count());
  if (zmq_setsockopt(socket, ZMQ_SNDHWM, &hwm, sizeof hwm) != 0 ||
      zmq_setsockopt(socket, ZMQ_LINGER, &linger, sizeof linger) != 0 ||
      zmq_connect(socket, endpoint.c_str()) != 0) {
    Status s = ZmqError("telemetry sender: connect", endpoint);
    zmq_close(socket);
    zmq_ctx_term(context);
    return s;
  }
  return std::unique_ptr<TelemetrySender>(
      new TelemetrySender(context, socket, endpoint, std::move(options.token)));
}

TelemetrySender::TelemetrySender(void* context, void* socket, std::string endpoint,
                                 std::string token)
    : context_(context),
      socket_(socket),
      endpoint_(std::move(endpoint)),
      token_(std::move(token)) {}

TelemetrySender::~TelemetrySender() {
  zmq_close(socket_);
  zmq_ctx_term(context_);  // waits at most `linger` for queued messages
}

bool TelemetrySender::Send(const TelemetryMessage& message) {
  if (token_.empty()) return SendRaw(EncodeTelemetry(message));
  std::lock_guard<std::mutex> lock(mu_);
  // Microseconds of wall time, so a second sender of the same rank and
  // restart (a Runtime made again in one process) still counts upwards.
  const auto now_us = static_cast<uint64_t>(UnixTimeSeconds() * 1e6);
  last_seq_ = std::max(last_seq_ + 1, now_us);
  const std::string text = EncodeTelemetry(message, last_seq_);
  return SendFramesLocked(text, HmacSha256Hex(token_, text));
}

bool TelemetrySender::SendRaw(std::string_view text, std::string_view mac) {
  std::lock_guard<std::mutex> lock(mu_);
  return SendFramesLocked(text, mac);
}

bool TelemetrySender::SendFramesLocked(std::string_view text, std::string_view mac) {
  // A multipart message is queued whole or not at all: once the first frame
  // is accepted, the second is too.
  int rc =
      zmq_send(socket_, text.data(), text.size(), ZMQ_DONTWAIT | (mac.empty() ? 0 : ZMQ_SNDMORE));
  if (rc >= 0 && !mac.empty()) rc = zmq_send(socket_, mac.data(), mac.size(), ZMQ_DONTWAIT);
  if (rc < 0) {
    dropped_.fetch_add(1, std::memory_order_relaxed);
    return false;
  }
  sent_.fetch_add(1, std::memory_order_relaxed);
  return true;
}

// ---------------------------------------------------------------- receiver

Result<std::unique_ptr<TelemetryReceiver>> TelemetryReceiver::Bind(
    const std::string& endpoint, TelemetryReceiverOptions options) {
  if (endpoint.empty()) return InvalidArgument("telemetry receiver: empty endpoint");
  std::string ipc_path;
  if (endpoint.rfind("ipc://", 0) == 0) {
    ipc_path = endpoint.substr(6);
    // A socket file left by a crashed controller would make bind fail; nobody
    // else can own a path inside this run's directory.
    ::unlink(ipc_path.c_str());
  }
  void* context = nullptr;
  void* socket = nullptr;
  AGENTRT_RETURN_IF_ERROR(OpenSocket(ZMQ_PULL, "telemetry receiver: zmq_ctx_new",
                                     "telemetry receiver: zmq_socket(PULL)", endpoint, &context,
                                     &socket));
  int linger = 0;
  // Per sender: what the controller holds for a rank it has not read yet. A
  // controller that falls behind bounds its memory here (16 messages a rank),
  // and the rank's sender queues (send_high_water_mark), then drops and
  // counts, instead. (1,000 test agents: 165 MiB of controller RSS at 16, 215 at 256.)
  int rcvhwm = 16;
  zmq_setsockopt(socket, ZMQ_LINGER, &linger, sizeof linger);
  zmq_setsockopt(socket, ZMQ_RCVHWM, &rcvhwm, sizeof rcvhwm);
  if (zmq_bind(socket, endpoint.c_str()) != 0) {
    Status s = ZmqError("telemetry receiver: bind", endpoint);
    zmq_close(socket);
    zmq_ctx_term(context);
    return s;
  }
  char resolved[512];
  size_t resolved_len = sizeof resolved;
  std::string actual = endpoint;
  if (zmq_getsockopt(socket, ZMQ_LAST_ENDPOINT, resolved, &resolved_len) == 0 && resolved_len > 1) {
    actual.assign(resolved, strnlen(resolved, resolved_len));
  }
  return std::unique_ptr<TelemetryReceiver>(new TelemetryReceiver(
      context, socket, std::move(actual), std::move(ipc_path), std::move(options)));
}

TelemetryReceiver::TelemetryReceiver(void* context, void* socket, std::string endpoint,
                                     std::string ipc_path, TelemetryReceiverOptions options)
    : context_(context),
      socket_(socket),
      endpoint_(std::move(endpoint)),
      ipc_path_(std::move(ipc_path)),
      options_(std::move(options)) {}

bool TelemetryReceiver::Authentic(const TelemetryMessage& m, std::string_view text,
                                  std::string_view mac) {
  auto token = options_.tokens.find(m.agent);
  if (token == options_.tokens.end() || mac.empty() || m.seq == 0) return false;
  if (!TokenMatches(mac, HmacSha256Hex(token->second, text))) return false;
  uint64_t& last = last_seq_[{m.agent, m.rank, m.restart_count}];
  if (m.seq <= last) return false;  // a replay
  last = m.seq;
  return true;
}

TelemetryReceiver::~TelemetryReceiver() {
  zmq_close(socket_);
  zmq_ctx_term(context_);
  if (!ipc_path_.empty()) ::unlink(ipc_path_.c_str());
}

Result<std::vector<TelemetryMessage>> TelemetryReceiver::Poll(std::chrono::milliseconds timeout,
                                                              size_t max_messages) {
  std::vector<TelemetryMessage> out;
  zmq_pollitem_t item{socket_, 0, ZMQ_POLLIN, 0};
  int rc = zmq_poll(&item, 1, static_cast<long>(timeout.count()));
  if (rc < 0) {
    if (zmq_errno() == EINTR) return out;
    return ZmqError("telemetry receiver: poll", endpoint_);
  }
  if (rc == 0) return out;
  zmq_msg_t text;
  zmq_msg_t mac;
  while (out.size() < max_messages) {
    zmq_msg_init(&text);
    if (zmq_msg_recv(&text, socket_, ZMQ_DONTWAIT) < 0) {
      int err = zmq_errno();
      zmq_msg_close(&text);
      if (err == EAGAIN || err == EINTR) break;
      return ZmqError("telemetry receiver: recv", endpoint_);
    }
    // Frame 2 (the signature) and any frames after it come with frame 1.
    zmq_msg_init(&mac);
    int frames = 1;
    for (bool more = zmq_msg_more(&text) != 0; more; ++frames) {
      zmq_msg_close(&mac);
      zmq_msg_init(&mac);
      if (zmq_msg_recv(&mac, socket_, 0) < 0) break;
      more = zmq_msg_more(&mac) != 0;
    }
    const std::string_view body(static_cast<const char*>(zmq_msg_data(&text)), zmq_msg_size(&text));
    const std::string_view signature =
        frames == 2
            ? std::string_view(static_cast<const char*>(zmq_msg_data(&mac)), zmq_msg_size(&mac))
            : std::string_view();
    auto decoded = frames <= 2 ? DecodeTelemetry(body)
                               : Result<TelemetryMessage>(InvalidArgument("telemetry: frames"));
    if (!decoded.ok()) {
      ++malformed_;
    } else if (!options_.tokens.empty() && !Authentic(*decoded, body, signature)) {
      ++rejected_;
    } else {
      out.push_back(std::move(decoded).value());
    }
    zmq_msg_close(&mac);
    zmq_msg_close(&text);
  }
  return out;
}

// ---------------------------------------------------------------- metrics.jsonl

MetricsRecord MetricsRecordOf(const TelemetryMessage& m, double run_start_unix_s) {
  MetricsRecord r;
  r.run_time = std::max(0.0, m.time - run_start_unix_s);
  r.time = m.time;
  r.agent = m.agent;
  r.rank = m.rank;
  r.step = m.step;
  if (m.metrics.is_object()) r.metrics = m.metrics;
  return r;
}

Result<std::unique_ptr<MetricsWriter>> MetricsWriter::Open(const std::string& path,
                                                           double run_start_unix_s) {
  std::FILE* file = std::fopen(path.c_str(), "ae");
  if (file == nullptr) return ErrnoStatus(errno, "metrics writer: open " + path);
  return std::unique_ptr<MetricsWriter>(new MetricsWriter(file, path, run_start_unix_s));
}

MetricsWriter::MetricsWriter(std::FILE* file, std::string path, double run_start_unix_s)
    : file_(file), path_(std::move(path)), run_start_unix_s_(run_start_unix_s) {}

MetricsWriter::~MetricsWriter() { std::fclose(file_); }

Status MetricsWriter::Write(const TelemetryMessage& message) {
  if (message.type != TelemetryType::kMetrics) return Status::Ok();
  std::string line = MetricsRecordOf(message, run_start_unix_s_).ToLine();
  line.push_back('\n');
  if (std::fwrite(line.data(), 1, line.size(), file_) != line.size()) {
    return ErrnoStatus(errno, "metrics writer: write " + path_);
  }
  return Status::Ok();
}

Status MetricsWriter::Flush() {
  if (std::fflush(file_) != 0) return ErrnoStatus(errno, "metrics writer: flush " + path_);
  return Status::Ok();
}

}  // namespace agentrt
