#include "comms/telemetry.h"

#include <simdjson.h>
#include <unistd.h>
#include <zmq.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "common/enum_names.h"
#include "comms/auth.h"
#include "plan/json_object.h"

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

namespace {

using simdjson::dom::element_type;

bool IsInteger(const simdjson::dom::element& e) {
  return e.type() == element_type::INT64 || e.type() == element_type::UINT64;
}

// `e` into the JSON value `to`, reusing a string's memory when `to` holds one.
void AssignValue(const simdjson::dom::element& e, nlohmann::json& to) {
  switch (e.type()) {
    case element_type::INT64:
      to = e.get_int64().value_unsafe();
      break;
    case element_type::UINT64:
      to = e.get_uint64().value_unsafe();
      break;
    case element_type::DOUBLE:
      to = e.get_double().value_unsafe();
      break;
    case element_type::BOOL:
      to = e.get_bool().value_unsafe();
      break;
    case element_type::NULL_VALUE:
      to = nullptr;
      break;
    case element_type::STRING:
      if (to.is_string()) {
        to.get_ref<std::string&>().assign(e.get_string().value_unsafe());
      } else {
        to = std::string(e.get_string().value_unsafe());
      }
      break;
    default:
      to = nlohmann::json::parse(simdjson::minify(e));
      break;  // an object or array
  }
}

}  // namespace

struct TelemetryDecoder::Impl {
  simdjson::dom::parser parser;
  std::string padded;  // the message, with SIMDJSON_PADDING bytes of room after it

  // The "metrics" object into `to`, updating the values of names it already
  // holds in place; a name it lacks (or one it holds that `from` lacks) is
  // the only case that allocates.
  static void Metrics(const simdjson::dom::object& from, nlohmann::json& to) {
    if (!to.is_object()) to = nlohmann::json::object();
    auto& object = to.get_ref<nlohmann::json::object_t&>();
    size_t fields = 0;
    for (const simdjson::dom::key_value_pair field : from) {
      ++fields;
      auto it = object.find(field.key);
      if (it == object.end()) it = object.emplace(std::string(field.key), nullptr).first;
      AssignValue(field.value, it->second);
    }
    if (object.size() == fields) return;
    object.clear();  // names the message did not carry (or a name twice): start over
    for (const simdjson::dom::key_value_pair field : from)
      AssignValue(field.value, object[std::string(field.key)]);
  }
};

TelemetryDecoder::TelemetryDecoder() : impl_(std::make_unique<Impl>()) {}
TelemetryDecoder::~TelemetryDecoder() = default;

Status TelemetryDecoder::Decode(std::string_view text, TelemetryMessage* out) {
  Impl& d = *impl_;
  simdjson::dom::object j;
  if (!ParseJsonObject(d.parser, d.padded, text, &j)) {
    return InvalidArgument("telemetry: message is not a JSON object");
  }
  TelemetryMessage& m = *out;
  std::string_view type;
  if (j["type"].get_string().get(type) != simdjson::SUCCESS) {
    return InvalidArgument("telemetry: message has no string \"type\"");
  }
  AGENTRT_ASSIGN_OR_RETURN(m.type, ParseType(type));
  std::string_view agent;
  if (j["agent"].get_string().get(agent) != simdjson::SUCCESS) {
    return InvalidArgument("telemetry: " + std::string(TelemetryTypeName(m.type)) +
                           " message has no string \"agent\"");
  }
  m.agent.assign(agent);
  simdjson::dom::element rank;
  if (j["rank"].get(rank) != simdjson::SUCCESS || !IsInteger(rank)) {
    return InvalidArgument("telemetry: " + std::string(TelemetryTypeName(m.type)) +
                           " message from agent " + m.agent + " has no integer \"rank\"");
  }
  m.rank = static_cast<int>(rank.get_int64().value_unsafe());
  auto get_int = [&j](const char* key, int64_t fallback) {
    simdjson::dom::element e;
    int64_t v = 0;
    if (j[key].get(e) != simdjson::SUCCESS || !IsInteger(e) ||
        e.get_int64().get(v) != simdjson::SUCCESS)
      return fallback;
    return v;
  };
  m.pid = get_int("pid", 0);
  m.restart_count = static_cast<int>(get_int("restart_count", 0));
  m.step = get_int("step", -1);
  m.checkpoint_step = get_int("checkpoint_step", -1);
  m.time = 0;
  if (double t = 0; j["time"].get_double().get(t) == simdjson::SUCCESS) m.time = t;
  if (m.type == TelemetryType::kMetrics) {
    simdjson::dom::object metrics;
    if (j["metrics"].get_object().get(metrics) != simdjson::SUCCESS) {
      return InvalidArgument("telemetry: metrics message from agent " + m.agent + " rank " +
                             std::to_string(m.rank) + " has no \"metrics\" object");
    }
    Impl::Metrics(metrics, m.metrics);
  }
  if (m.type == TelemetryType::kCheckpoint && m.checkpoint_step < 0) {
    return InvalidArgument("telemetry: checkpoint message from agent " + m.agent + " rank " +
                           std::to_string(m.rank) + " has no \"checkpoint_step\"");
  }
  m.skipped_steps.clear();
  if (m.type == TelemetryType::kRestore) {
    m.checkpoint_step = get_int("restored_step", -1);
    if (simdjson::dom::array skipped;
        j["skipped_steps"].get_array().get(skipped) == simdjson::SUCCESS) {
      for (const simdjson::dom::element step : skipped) {
        int64_t v = 0;
        if (IsInteger(step) && step.get_int64().get(v) == simdjson::SUCCESS)
          m.skipped_steps.push_back(v);
      }
    }
  }
  m.reason.clear();
  if (std::string_view reason; j["reason"].get_string().get(reason) == simdjson::SUCCESS)
    m.reason.assign(reason);
  m.flops_per_sample = 0;
  if (double f = 0; j["flops_per_sample"].get_double().get(f) == simdjson::SUCCESS)
    m.flops_per_sample = f;
  m.collective.reset();
  if (simdjson::dom::element c; j["collective"].get(c) == simdjson::SUCCESS && !c.is_null()) {
    // A block that is not a snapshot is left out; the heartbeat still counts.
    auto collective = CollectiveSnapshot::FromJson(
        nlohmann::json::parse(simdjson::minify(c), nullptr, /*allow_exceptions=*/false));
    if (collective.ok()) m.collective = std::move(collective).value();
  }
  m.seq = 0;
  if (simdjson::dom::element seq; j["seq"].get(seq) == simdjson::SUCCESS && IsInteger(seq)) {
    if (seq.type() == element_type::UINT64) {
      m.seq = seq.get_uint64().value_unsafe();
    } else if (seq.get_int64().value_unsafe() >= 0) {
      m.seq = static_cast<uint64_t>(seq.get_int64().value_unsafe());
    }
  }
  return Status::Ok();
}

Result<TelemetryMessage> DecodeTelemetry(std::string_view text) {
  TelemetryDecoder decoder;
  TelemetryMessage m;
  AGENTRT_RETURN_IF_ERROR(decoder.Decode(text, &m));
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
      token_(std::move(token)),
      key_(token_) {}

TelemetrySender::~TelemetrySender() {
  zmq_close(socket_);
  zmq_ctx_term(context_);  // waits at most `linger` for queued messages
}

namespace {

// The last sequence number any sender of this process signed. A message is
// numbered after it, and no lower than the wall time in microseconds: a second
// sender of the same rank and restart counts upwards, in this process (a
// Runtime made again) whatever the wall clock did meanwhile (a step back would
// have numbered its messages below the first one's, and the receiver would
// have refused them as replays), in another process by the wall clock.
std::atomic<uint64_t> g_last_seq{0};

uint64_t NextSeq() {
  const auto now_us = static_cast<uint64_t>(UnixTimeSeconds() * 1e6);
  uint64_t last = g_last_seq.load(std::memory_order_relaxed);
  uint64_t next = 0;
  do {
    next = std::max(last + 1, now_us);
  } while (!g_last_seq.compare_exchange_weak(last, next, std::memory_order_relaxed));
  return next;
}

}  // namespace

bool TelemetrySender::Send(const TelemetryMessage& message) {
  if (token_.empty()) return SendRaw(EncodeTelemetry(message));
  std::lock_guard<std::mutex> lock(mu_);  // numbered and sent in one order
  const std::string text = EncodeTelemetry(message, NextSeq());
  char mac[kHmacSha256HexSize];
  key_.Hex(text, mac);
  return SendFramesLocked(text, std::string_view(mac, sizeof mac));
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
      options_(std::move(options)) {
  for (const auto& [agent, token] : options_.tokens) keys_.try_emplace(agent, token);
}

bool TelemetryReceiver::Authentic(const TelemetryMessage& m, std::string_view text,
                                  std::string_view mac) {
  auto agent_key = keys_.find(m.agent);
  if (agent_key == keys_.end() || mac.empty() || m.seq == 0) return false;
  char expected[kHmacSha256HexSize];
  agent_key->second.Hex(text, expected);
  if (!TokenMatches(mac, std::string_view(expected, sizeof expected))) return false;
  const std::tuple<std::string_view, int, int> key{m.agent, m.rank, m.restart_count};
  auto last = last_seq_.find(key);
  if (last == last_seq_.end()) {
    last_seq_.emplace(std::tuple<std::string, int, int>{m.agent, m.rank, m.restart_count}, m.seq);
    return true;
  }
  if (m.seq <= last->second) return false;  // a replay
  last->second = m.seq;
  return true;
}

TelemetryReceiver::~TelemetryReceiver() {
  zmq_close(socket_);
  zmq_ctx_term(context_);
  if (!ipc_path_.empty()) ::unlink(ipc_path_.c_str());
}

Result<std::vector<TelemetryMessage>> TelemetryReceiver::Poll(std::chrono::milliseconds timeout,
                                                              size_t max_messages) {
  TelemetryBatch batch;
  AGENTRT_RETURN_IF_ERROR(PollInto(&batch, timeout, max_messages));
  batch.slots_.resize(batch.size_);
  return std::move(batch.slots_);
}

Status TelemetryReceiver::PollInto(TelemetryBatch* batch, std::chrono::milliseconds timeout,
                                   size_t max_messages) {
  batch->size_ = 0;
  zmq_pollitem_t item{socket_, 0, ZMQ_POLLIN, 0};
  int rc = zmq_poll(&item, 1, static_cast<long>(timeout.count()));
  if (rc < 0) {
    if (zmq_errno() == EINTR) return Status::Ok();
    return ZmqError("telemetry receiver: poll", endpoint_);
  }
  if (rc == 0) return Status::Ok();
  zmq_msg_t text;
  zmq_msg_t mac;
  while (batch->size_ < max_messages) {
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
    if (batch->slots_.size() == batch->size_) batch->slots_.emplace_back();
    TelemetryMessage& slot = batch->slots_[batch->size_];
    if (frames > 2 || !decoder_.Decode(body, &slot).ok()) {
      ++malformed_;
    } else if (!options_.tokens.empty() && !Authentic(slot, body, signature)) {
      ++rejected_;
    } else {
      ++batch->size_;
    }
    zmq_msg_close(&mac);
    zmq_msg_close(&text);
  }
  return Status::Ok();
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

// MetricsRecord::ToLine's JSON, kept between lines: the record's values are
// replaced in place and nlohmann's serializer (the one dump() uses, with the
// same settings) writes into a buffer whose memory stays.
struct MetricsWriter::Line {
  nlohmann::json record = MetricsRecord{}.ToJson();
  std::string text;
  nlohmann::detail::serializer<nlohmann::json> serializer{
      nlohmann::detail::output_adapter<char>(text), ' ', nlohmann::json::error_handler_t::replace};

  // `to` = `from`, a string's memory reused.
  static void Assign(const nlohmann::json& from, nlohmann::json& to) {
    if (from.is_string() && to.is_string()) {
      to.get_ref<std::string&>() = from.get_ref<const std::string&>();
    } else {
      to = from;
    }
  }

  void Set(const TelemetryMessage& m, double run_start_unix_s) {
    record["agent"].get_ref<std::string&>() = m.agent;
    record["rank"] = m.rank;
    record["step"] = m.step;
    record["run_time"] = std::max(0.0, m.time - run_start_unix_s);
    record["time"] = m.time;
    nlohmann::json& metrics = record["metrics"];
    if (!m.metrics.is_object()) {
      metrics = nlohmann::json::object();
      return;
    }
    auto& to = metrics.get_ref<nlohmann::json::object_t&>();
    for (const auto& [name, value] : m.metrics.items()) {
      auto it = to.find(name);
      if (it == to.end()) it = to.emplace(name, nullptr).first;
      Assign(value, it->second);
    }
    if (to.size() != m.metrics.size()) metrics = m.metrics;  // names the message lacks
  }
};

MetricsWriter::MetricsWriter(std::FILE* file, std::string path, double run_start_unix_s)
    : file_(file),
      path_(std::move(path)),
      run_start_unix_s_(run_start_unix_s),
      line_(std::make_unique<Line>()) {}

MetricsWriter::~MetricsWriter() { std::fclose(file_); }

Status MetricsWriter::Write(const TelemetryMessage& message) {
  if (message.type != TelemetryType::kMetrics) return Status::Ok();
  line_->Set(message, run_start_unix_s_);
  line_->text.clear();
  line_->serializer.dump(line_->record, /*pretty_print=*/false, /*ensure_ascii=*/false,
                         /*indent_step=*/0);
  line_->text.push_back('\n');
  if (std::fwrite(line_->text.data(), 1, line_->text.size(), file_) != line_->text.size()) {
    return ErrnoStatus(errno, "metrics writer: write " + path_);
  }
  return Status::Ok();
}

Status MetricsWriter::Flush() {
  if (std::fflush(file_) != 0) return ErrnoStatus(errno, "metrics writer: flush " + path_);
  return Status::Ok();
}

}  // namespace agentrt
