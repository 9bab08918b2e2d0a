// Telemetry: heartbeats, metrics and checkpoint notices from every agent rank to
// the run controller, over ZeroMQ PUSH (rank) -> PULL (controller).
//
// Wire format: one ZeroMQ message per event, holding one UTF-8 JSON object:
//
//   {"type": "hello" | "heartbeat" | "metrics" | "checkpoint" | "restore" | "bye",
//    "agent": "predator-0",      // AGENTRT_AGENT
//    "rank": 1,                   // rank inside the agent's group
//    "pid": 12345,                // OS process id of the rank
//    "time": 1764460000.25,       // sender's wall clock, Unix seconds
//    "restart_count": 0,          // AGENTRT_RESTART_COUNT
//    "step": 420,                 // latest training step the rank reported (-1: none yet)
//    "metrics": {"loss": 0.12},   // "metrics" only: metric name -> number (or string)
//    "checkpoint_step": 400,      // "checkpoint" only: the step just committed
//    "restored_step": 400,        // "restore" only: the step resumed from (-1: a fresh start)
//    "skipped_steps": [600],      // "restore" only: corrupt checkpoints passed over
//    "reason": "...",             // "bye" only, optional: why the rank is leaving
//    "collective": {"seq": 4182, "in": true, "op": "all_reduce", "since": 1764460000.1,
//                   "recent": [...]},  // heartbeats of a rank with a Group: its flight
//                                      // recorder (CollectiveSnapshot, plan/records.h)
//    "flops_per_sample": 3.2e12,    // when the agent declared it
//    "seq": 1764460000250000}     // signed messages: strictly increasing per process
//
// A signed message (the sender has its agent's token, AGENTRT_TOKEN_FILE) is
// two ZeroMQ frames: the JSON text, then the lower-case hex
// HMAC-SHA256(agent token, JSON text). A receiver given the run's tokens
// accepts only messages signed with the token of the agent they name and
// whose "seq" is above the last one it accepted from that agent, rank and
// restart: a process without the token can neither forge nor replay a
// heartbeat, which matters once telemetry is TCP across nodes. A process
// numbers every signed message it sends, from any sender, above the last and
// no lower than the wall time in microseconds, so a sender made again in one
// process (a second Runtime) is not taken for a replay after a step back of
// the wall clock, and one in a new process starts above an old one's.
//
// Order per rank: "hello" first, then heartbeats (period 1 s by default; a
// tick is skipped when a "metrics" message went out within the period and
// the rank records no collective) mixed with "metrics" and "checkpoint" messages, and "bye" when
// the rank exits cleanly. Nothing is acknowledged: a slow controller makes the sender drop (and
// count) messages rather than block the training loop. Unknown fields are ignored by the decoder so
// the format can grow.
//
// The controller binds a TelemetryReceiver at AGENTRT_TELEMETRY, e.g.
// ipc://RUN_DIR/telemetry.sock (path at most ~100 bytes, a limit of Unix
// sockets) or tcp://ADDR:* (any free port; endpoint() tells which): the
// controller's node address when ranks run on other nodes.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include "common/status.h"
#include "comms/auth.h"
#include "plan/records.h"

namespace agentrt {

enum class TelemetryType { kHello, kHeartbeat, kMetrics, kCheckpoint, kBye, kRestore };

std::string_view TelemetryTypeName(TelemetryType type);

struct TelemetryMessage {
  TelemetryType type = TelemetryType::kHeartbeat;
  std::string agent;
  int rank = 0;
  int64_t pid = 0;
  double time = 0;  // Unix seconds (sender's clock)
  int restart_count = 0;
  int64_t step = -1;  // -1: no step reported yet
  // An object for kMetrics. Otherwise null, except in a receiver's reused
  // slot (TelemetryBatch), which may keep an earlier message's: read it only
  // for kMetrics.
  nlohmann::json metrics;
  int64_t checkpoint_step = -1;  // kCheckpoint: the step committed; kRestore: restored (-1: fresh)
  std::vector<int64_t> skipped_steps;  // kRestore: committed checkpoints passed over as corrupt
  std::string reason;                  // kBye only (may be empty)
  uint64_t seq = 0;                    // set by a signing sender; 0: unsigned
  std::optional<CollectiveSnapshot> collective;  // kHeartbeat of a rank with a Group
  double flops_per_sample = 0;  // declared by the agent (Runtime::SetFlopsPerSample); 0: not
};

// Current wall-clock time in Unix seconds.
double UnixTimeSeconds();

// The JSON text of `message` (the wire format above); with `seq` > 0, that
// number instead of message.seq (a signing sender numbers as it sends).
std::string EncodeTelemetry(const TelemetryMessage& message, uint64_t seq = 0);
// Parses one wire message; the error names what is missing or malformed.
Result<TelemetryMessage> DecodeTelemetry(std::string_view text);

// Parses wire messages into messages it is given, keeping their memory: the
// agent name's and reason's strings, the skipped steps, and the metrics
// object, whose values are updated in place when it already holds the same
// names. A receiver that decodes into the same few slots allocates nothing for
// a heartbeat, nor for a metrics report with the names that slot saw before.
// simdjson's parser keeps its buffers between messages.
class TelemetryDecoder {
 public:
  TelemetryDecoder();
  ~TelemetryDecoder();
  TelemetryDecoder(const TelemetryDecoder&) = delete;
  TelemetryDecoder& operator=(const TelemetryDecoder&) = delete;

  // Every field of `out` is set (or reset) from `text`; on an error `out`
  // holds a partial message.
  Status Decode(std::string_view text, TelemetryMessage* out);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// What one poll of a receiver took: its first size() slots. The slots stay
// between polls, so their memory is reused.
class TelemetryBatch {
 public:
  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  const TelemetryMessage* begin() const { return slots_.data(); }
  const TelemetryMessage* end() const { return slots_.data() + size_; }

 private:
  friend class TelemetryReceiver;
  std::vector<TelemetryMessage> slots_;
  size_t size_ = 0;
};

struct TelemetrySenderOptions {
  // Messages queued for a slow or absent controller before new ones are dropped.
  int send_high_water_mark = 1000;
  // How long the destructor may wait to flush queued messages (e.g. "bye").
  std::chrono::milliseconds linger{500};
  // The agent's token (comms/auth.h): every message is signed with it. Empty:
  // unsigned, which only a receiver without tokens accepts.
  std::string token;
};

// The rank side: PUSH, connected to the controller's endpoint.
//
// Thread-safe (an internal mutex serialises the socket). Send() never blocks:
// when the queue is full the message is dropped and counted.
class TelemetrySender {
 public:
  static Result<std::unique_ptr<TelemetrySender>> Connect(const std::string& endpoint,
                                                          TelemetrySenderOptions options = {});
  ~TelemetrySender();
  TelemetrySender(const TelemetrySender&) = delete;
  TelemetrySender& operator=(const TelemetrySender&) = delete;

  // True when queued; false when dropped (queue full or socket error). Send
  // numbers and signs the message when the sender has a token; SendRaw sends
  // `text` as it is, with `mac` as the second frame when not empty.
  bool Send(const TelemetryMessage& message);
  bool SendRaw(std::string_view text, std::string_view mac = {});

  uint64_t sent() const { return sent_.load(std::memory_order_relaxed); }
  uint64_t dropped() const { return dropped_.load(std::memory_order_relaxed); }
  const std::string& endpoint() const { return endpoint_; }

 private:
  TelemetrySender(void* context, void* socket, std::string endpoint, std::string token);
  bool SendFramesLocked(std::string_view text, std::string_view mac);  // mu_ held

  void* context_;
  void* socket_;
  std::string endpoint_;
  std::string token_;
  HmacSha256Key key_;  // token_'s, ready to sign
  std::mutex mu_;
  std::atomic<uint64_t> sent_{0};
  std::atomic<uint64_t> dropped_{0};
};

struct TelemetryReceiverOptions {
  // Agent name -> its token. Not empty: only messages signed with the token of
  // the agent they name, with a fresh "seq", are accepted; the rest are
  // counted in rejected(). Empty: every well-formed message is accepted.
  std::map<std::string, std::string> tokens;
};

// The controller side: PULL, bound at an endpoint.
//
// Not thread-safe: one thread polls it.
class TelemetryReceiver {
 public:
  // `endpoint` e.g. "ipc:///run/dir/telemetry.sock" or "tcp://10.0.0.1:*".
  // A stale ipc socket file left by a crashed controller is replaced.
  static Result<std::unique_ptr<TelemetryReceiver>> Bind(const std::string& endpoint,
                                                         TelemetryReceiverOptions options = {});
  ~TelemetryReceiver();
  TelemetryReceiver(const TelemetryReceiver&) = delete;
  TelemetryReceiver& operator=(const TelemetryReceiver&) = delete;

  // The endpoint senders connect to (a wildcard tcp port resolved to the real one).
  const std::string& endpoint() const { return endpoint_; }

  // Waits up to `timeout` for the first message, then returns it together with
  // every message already queued (at most `max_messages`). An empty vector means
  // the timeout passed. Malformed messages are skipped and counted.
  Result<std::vector<TelemetryMessage>> Poll(std::chrono::milliseconds timeout,
                                             size_t max_messages = 4096);
  // The same into `batch`, whose slots are reused: the run controller's
  // intake, which allocates nothing per message once its slots have seen the
  // run's message shapes.
  Status PollInto(TelemetryBatch* batch, std::chrono::milliseconds timeout,
                  size_t max_messages = 4096);

  uint64_t malformed() const { return malformed_; }
  // Messages refused by the token check: unsigned, badly signed, naming an
  // agent without a token, or replayed (a "seq" not above the last accepted).
  uint64_t rejected() const { return rejected_; }

 private:
  TelemetryReceiver(void* context, void* socket, std::string endpoint, std::string ipc_path,
                    TelemetryReceiverOptions options);
  // True when `m` (decoded from `text`) carries a valid signature `mac`.
  bool Authentic(const TelemetryMessage& m, std::string_view text, std::string_view mac);

  void* context_;
  void* socket_;
  std::string endpoint_;
  std::string ipc_path_;  // removed on destruction
  TelemetryReceiverOptions options_;
  std::map<std::string, HmacSha256Key, std::less<>> keys_;  // options_.tokens, ready to MAC
  TelemetryDecoder decoder_;
  // (agent, rank, restart_count) -> the last accepted seq (looked up without a copy of the name).
  std::map<std::tuple<std::string, int, int>, uint64_t, std::less<>> last_seq_;
  uint64_t malformed_ = 0;
  uint64_t rejected_ = 0;
};

// The RUN_DIR/metrics.jsonl record of a "metrics" message (plan/records.h);
// its run_time counts from run_start_unix_s.
MetricsRecord MetricsRecordOf(const TelemetryMessage& message, double run_start_unix_s);

// Appends metrics lines to a file (RUN_DIR/metrics.jsonl). Not thread-safe.
class MetricsWriter {
 public:
  static Result<std::unique_ptr<MetricsWriter>> Open(const std::string& path,
                                                     double run_start_unix_s);
  ~MetricsWriter();
  MetricsWriter(const MetricsWriter&) = delete;
  MetricsWriter& operator=(const MetricsWriter&) = delete;

  // Writes the line of a kMetrics message (MetricsRecordOf(message).ToLine(),
  // byte for byte); other types are ignored (OK). The line is built in a
  // record and a buffer kept from the last one: no allocation when the
  // message carries the metric names the last one did.
  Status Write(const TelemetryMessage& message);
  // Flushes to the OS so `tail -f` and readers see complete lines.
  Status Flush();

 private:
  MetricsWriter(std::FILE* file, std::string path, double run_start_unix_s);

  struct Line;  // the record and serializer of the line being written

  std::FILE* file_;
  std::string path_;
  double run_start_unix_s_;
  std::unique_ptr<Line> line_;
};

}  // namespace agentrt
