// BusClient: an agent's connection to the message bus (comms/proto/bus.proto).
//
//   AGENTRT_ASSIGN_OR_RETURN(auto bus, BusClient::FromEnvironment());  // AGENTRT_BUS + token
//   bus->Publish("sightings", payload);                  // sync: stored when it returns
//   bus->PublishAsync("sightings", payload, {}, on_ack);  // batched in the background
//   auto id = bus->Subscribe("sightings", StartAt::Earliest(),
//                            [](const BusMessage& m) { ... });  // on a background thread
//   checkpoint["bus_offsets"] = bus->SubscriptionOffsets();      // resume exactly here,
//   checkpoint["bus_incarnation"] = bus->SubscriptionIncarnation();  // on this broker
//   later: bus->Subscribe("sightings", StartAt::Offset(offsets["sightings"], incarnation), cb);
//
// Payloads of more than 4 MiB (kMaxInlineBytes) are published in 2 MiB chunks
// (PublishLarge) up to the broker's bus.max_message_bytes (at most 1 GiB),
// and a subscriber gets them whole or not at all; direct messages (Send,
// Request, Reply) carry at most 4 MiB.
//
// Every call has a deadline (BusClientOptions::call_timeout unless given).
// Publish and Send retry on UNAVAILABLE / DEADLINE_EXCEEDED until their
// deadline with the same (publisher_id, sequence), so the broker stores a
// retried message once. Subscriptions reconnect by themselves (after a broker
// restart too) and resume at their next offset; a gap is never silent: it is
// reported through SubscribeOptions::on_event.
//
// Thread-safety: all methods may be called from any thread concurrently.
// Callbacks run on the client's background threads: one thread per
// subscription (messages of one subscription arrive in offset order, one at a
// time) and one for async publish acks. A callback must not call Unsubscribe
// on its own subscription or destroy the client.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "comms/auth.h"
#include "comms/bus_types.h"
#include "comms/proto/bus.pb.h"
#include "plan/agent_env.h"

namespace agentrt {

// A delivered message (topic, offset, payload, content_type, publisher,
// publisher_id, sequence, publish_time_ns, request_id); see bus.proto.
using BusMessage = bus::v1::Message;
using BusTopicInfo = bus::v1::TopicInfo;

struct BusClientOptions {
  std::chrono::milliseconds call_timeout{10000};      // default deadline of a call
  std::chrono::milliseconds retry_backoff{20};        // first wait before a retry / reconnect
  std::chrono::milliseconds max_retry_backoff{1000};  // cap of the doubling backoff
  // Streams are re-opened (and resumed) after this long, so even they carry a deadline.
  std::chrono::milliseconds stream_deadline{std::chrono::minutes(10)};
  int keepalive_time_ms = 10000;
  int keepalive_timeout_ms = 5000;
  // TLS: set tls_ca_file to verify the broker; add cert+key for mutual TLS.
  std::string tls_ca_file;
  std::string tls_cert_file;
  std::string tls_key_file;
  std::string tls_server_name;  // expected name in the broker certificate (default: the host)
  // This client's publisher incarnation (see bus.proto); 0 = random.
  uint64_t publisher_id = 0;
  // The agent launch this process belongs to (plan/fence.h), sent with every
  // call: the broker refuses a launch the controller has replaced
  // (Broker::Authenticate). ForAgent fills it in when empty.
  std::string incarnation;
  // true: subscriptions read a large message's payload from the broker's
  // file when they can (on the broker's node, or a file system shared with
  // it), falling back to having it streamed. false (the default): they do so
  // when this process is on the broker's node (the check of
  // write_local_files below), and have it streamed elsewhere.
  // AGENTRT_BUS_LOCAL_FILES=1 in the environment sets it true for every
  // client of the process; =0 has every byte streamed.
  bool read_local_files = false;
  // true (the default): a large publish from a process on the broker's node
  // (bus.proto Spool: the same kernel, and the spool folder holds the id the
  // broker gave) writes the payload into a file in the broker's spool that
  // the broker takes over (AdoptLarge), so no payload byte crosses the
  // socket; elsewhere, or false, it is sent in chunks. So does PublishAsync
  // with payloads from 256 KiB (kSpoolAsyncMinBytes) to 4 MiB, the file
  // written in the call and named in its batch (PublishRequest.spooled_name). A large publish
  // is checked (ACL, size) before a byte is written; an async one when its batch reaches the
  // broker (a refused one's file is removed). AGENTRT_BUS_LOCAL_FILES=0 sets it false, and has
  // Fetch (and so a weight stream) read none of the broker's files either: every byte is streamed,
  // as on another node.
  bool write_local_files = true;
  // After the broker refused a file of its spool (FAILED_PRECONDITION: a
  // descriptor it could not have, a file it could not move), large payloads
  // go through the socket for this long; then the spool is asked for again.
  std::chrono::milliseconds spool_retry_after{30000};
  // Async publish batching and backpressure.
  int async_batch_messages = 1024;
  int64_t async_batch_bytes = 4 << 20;  // at most kMaxBatchBytes (bus_server.h)
  size_t async_max_pending = 65536;     // PublishAsync blocks while this many are unacknowledged
};

struct PublishOptions {
  std::string content_type;
  uint64_t sequence = 0;                             // 0 = the next automatic sequence number
  std::optional<std::chrono::milliseconds> timeout;  // default BusClientOptions::call_timeout
};

struct PublishAck {
  int64_t offset =
      -1;  // offset in the topic/inbox (-1: duplicate whose first copy is no longer known)
  bool duplicate = false;  // already stored by an earlier attempt; nothing appended
  uint64_t sequence = 0;   // the sequence number the message carried
};

// Where a subscription starts. An offset saved in a checkpoint belongs to one
// broker incarnation (its logs live in memory): pass the incarnation it was
// read from too, so that a broker which has since restarted says so
// (SubscriptionEvent::kBrokerRestarted) and the subscription reads its new log
// from the start, instead of waiting at an offset of a log that is gone.
struct StartAt {
  enum class Kind { kEarliest, kLatest, kOffset };
  Kind kind = Kind::kLatest;
  int64_t offset = 0;
  uint64_t incarnation = 0;  // kOffset: the broker incarnation of `offset` (0: unknown)
  static StartAt Earliest() { return {Kind::kEarliest, 0, 0}; }
  static StartAt Latest() { return {Kind::kLatest, 0, 0}; }
  static StartAt Offset(int64_t n, uint64_t incarnation = 0) {
    return {Kind::kOffset, n, incarnation};
  }
};

struct SubscriptionEvent {
  enum class Kind {
    kConnected,  // the stream is open (first time or after a reconnect); offset = where it starts
    kReconnecting,     // the stream broke; status says why; it resumes at `offset`
    kBrokerRestarted,  // the broker lost its logs; reading restarts at its earliest offset
                       // (`offset`)
    kOffsetExpired,    // `offset` fell out of retention; `earliest` is the first still held
    kFailed,           // the subscription ended for good (status says why)
  };
  Kind kind;
  std::string topic;
  Status status;
  int64_t offset = 0;
  int64_t earliest = 0;
};

struct SubscribeOptions {
  // On OFFSET_EXPIRED: false = end the subscription (kFailed, OUT_OF_RANGE);
  // true = report kOffsetExpired and go on from the earliest held offset.
  bool skip_expired = false;
  int max_batch_messages = 0;                              // 0 = broker default
  std::function<void(const SubscriptionEvent&)> on_event;  // optional; on the subscription's thread
};

struct FetchOptions {
  // true: a large message comes with chunked_path (the broker's file) set
  // and no payload; the caller maps or reads the file itself and checks it
  // against chunked_size and chunked_crc32c. Where the broker's files cannot
  // be read (their folder is not here: another node without its file
  // system; or another user's), Fetch finds that out once, fetches again
  // with the payloads streamed, and streams from then on. A file missing
  // from a folder that is here (retention, or a folder of the same name on
  // another node) or a passing error has this fetch's bytes streamed, and is
  // not remembered.
  bool local_paths = false;
  // With local_paths: a large message comes back as the broker's file name,
  // size and CRC32C only, whether or not the file can be read here (a weight
  // stream checks a version it rebuilt from a delta against them).
  bool metadata_only = false;
};

// Writes a large payload in order (BusClient::PublishLargeFrom).
class LargePayloadWriter {
 public:
  virtual ~LargePayloadWriter() = default;
  virtual Status Append(const void* data, size_t size) = 0;
};

// Memory one large publish is laid out in, made ready ahead of it
// (BusClient::ReserveLarge) with every page already faulted in, so that
// filling it costs one memcpy: on the broker's node a file of the broker's
// spool, mapped (the broker takes the file over), elsewhere a buffer of the
// client's (sent in chunks). Destroyed unpublished, it leaves nothing.
class LargePayloadSlot {
 public:
  ~LargePayloadSlot();
  LargePayloadSlot(const LargePayloadSlot&) = delete;
  LargePayloadSlot& operator=(const LargePayloadSlot&) = delete;

  char* data() const { return data_; }
  size_t size() const { return size_; }
  // A file of the broker's spool (false: the client's own memory).
  bool spooled() const { return fd_ >= 0; }

 private:
  friend class BusClient;
  LargePayloadSlot() = default;
  void Unmap();

  char* data_ = nullptr;
  size_t size_ = 0;
  int fd_ = -1;
  std::string path_, name_;  // of the spool file
};

using SubscriptionId = uint64_t;
using MessageCallback = std::function<void(const BusMessage&)>;
using AckCallback = std::function<void(const Result<PublishAck>&)>;

struct BusReply {
  std::string payload;
  std::string content_type;
  std::string replier;
};

class BusClient {
 public:
  // Connects lazily: no call is made here. `address` is "host:port".
  static Result<std::unique_ptr<BusClient>> Connect(std::string address, Credential credential,
                                                    BusClientOptions options = {});
  // The agent's own connection: AGENTRT_BUS and AGENTRT_TOKEN_FILE of the
  // agent process contract (plan/agent_env.h).
  static Result<std::unique_ptr<BusClient>> ForAgent(const AgentEnv& env,
                                                     BusClientOptions options = {});
  // ForAgent(AgentEnv::FromProcess()).
  static Result<std::unique_ptr<BusClient>> FromEnvironment(BusClientOptions options = {});

  ~BusClient();  // ends subscriptions, flushes async publishes (up to call_timeout)
  BusClient(const BusClient&) = delete;
  BusClient& operator=(const BusClient&) = delete;

  const std::string& agent() const;
  const std::string& address() const;
  // Whether Fetch reads large payloads from the broker's files here: true
  // until a fetch finds them unreadable (another node), or
  // AGENTRT_BUS_LOCAL_FILES=0.
  bool reads_broker_files() const;
  // Whether the broker's file that `m` names (Fetch with local_paths) can be
  // read here now; one whose folder is not here makes reads_broker_files()
  // false from then on (one missing, trimmed meanwhile, does not).
  bool BrokerFileReadable(const BusMessage& m);
  // BusClientOptions::call_timeout.
  std::chrono::milliseconds call_timeout() const;
  // A folder on this node that the processes using this bus from it share,
  // for bytes one of them fetches for all (a weight stream's versions read
  // on another node than the broker's): /dev/shm/agentrt-bus.<uid>.<hash of
  // the address (CRC32C)> (plan/mpi_shm.h's SharedNodeDir). Joined on the first call
  // and held while this client lives; the last process to leave removes it,
  // one killed leaves it to the next joiner's sweep. "" where it cannot be
  // made, or with AGENTRT_WEIGHTS_NODE_CACHE=0 in the environment. A folder
  // removed under the client (a /dev/shm cleaner) is joined anew.
  std::string NodeCacheDir();
  // Stops using the node folder (a write to it failed: a full /dev/shm).
  void DropNodeCacheDir();

  // Blocks until the broker answers (up to `timeout`).
  Status WaitForReady(std::chrono::milliseconds timeout);

  // Stores one message; returns once stored. Retries keep the sequence.
  Result<PublishAck> Publish(std::string_view topic, std::string_view payload,
                             const PublishOptions& opts = {});
  // Publishes a payload of exactly `size` bytes that `fill` writes in order
  // (so a caller lays out tensors straight into it, with no buffer of its
  // own). Large ones from a process that sees the broker's spool go into a
  // file the broker takes over (write_local_files): one copy, no bytes over
  // the socket. Otherwise they are gathered in memory and sent as Publish
  // sends them. Returns once stored; `fill`'s error, or a size it did not
  // write, stores nothing. DEADLINE_EXCEEDED leaves it unknown whether the
  // broker stored it (it may still be taking the file over); a publish made
  // with PublishOptions::sequence set can be retried with that sequence and
  // is then stored once.
  Result<PublishAck> PublishLargeFrom(std::string_view topic, size_t size,
                                      const std::function<Status(LargePayloadWriter&)>& fill,
                                      const PublishOptions& opts = {});
  // A slot for a publish of `size` bytes to `topic` (PublishLargeSlot).
  // Where the broker's spool is asked, its refusal of the publish (ACL,
  // size) comes now. Costs what writing the bytes would: made ahead of time
  // (a background thread), it saves the publisher that much later.
  Result<std::unique_ptr<LargePayloadSlot>> ReserveLarge(std::string_view topic, size_t size);
  // Stores the bytes of `slot` (used up), as PublishLargeFrom does: a spool
  // file is taken over by the broker, anything else sent.
  Result<PublishAck> PublishLargeSlot(std::string_view topic,
                                      std::unique_ptr<LargePayloadSlot> slot,
                                      const PublishOptions& opts = {});
  // Queues a message; `on_ack` (optional) runs on the publish thread once it is
  // stored or failed. Messages of one client are stored in the order queued.
  // Blocks while async_max_pending messages are unacknowledged (backpressure),
  // and (up to opts.timeout, call_timeout by default, then it goes inline;
  // not from this client's ack callbacks) while 64 spooled payloads, or 128
  // MiB of them, wait for their answers. A payload of more than 4 MiB is not
  // queued: PublishAsync waits until everything queued before it is stored,
  // publishes it, and runs on_ack on the caller's thread (so not from an ack
  // callback: it would wait for itself).
  void PublishAsync(std::string_view topic, std::string_view payload,
                    const PublishOptions& opts = {}, AckCallback on_ack = nullptr);
  // Waits until every queued async publish is acknowledged. DEADLINE_EXCEEDED
  // if not within `timeout`; otherwise the first async failure since the last Flush, if any.
  Status Flush(std::chrono::milliseconds timeout);

  // Direct messages to another agent's inbox (any agent of the run).
  Result<PublishAck> Send(std::string_view to, std::string_view payload,
                          const PublishOptions& opts = {});
  // Reads this agent's own inbox, like Subscribe (messages with request_id != 0 are Requests).
  Result<SubscriptionId> Receive(StartAt from, MessageCallback on_message,
                                 SubscribeOptions opts = {});

  // Sends a request to `to` and waits for its Reply (DEADLINE_EXCEEDED after `timeout`).
  Result<BusReply> Request(std::string_view to, std::string_view payload,
                           std::chrono::milliseconds timeout, std::string_view content_type = {});
  Status Reply(uint64_t request_id, std::string_view payload, std::string_view content_type = {});

  // Starts a background subscription; returns once it is registered (it
  // connects in the background and keeps reconnecting until Unsubscribe).
  Result<SubscriptionId> Subscribe(std::string_view topic, StartAt from, MessageCallback on_message,
                                   SubscribeOptions opts = {});
  // Ends it and waits for its thread (no callback runs after this returns).
  Status Unsubscribe(SubscriptionId id);
  // The final status of a subscription that ended by itself (kFailed), or OK while it runs.
  Status SubscriptionStatus(SubscriptionId id) const;

  // Synchronous read: up to `max` messages of `topic` from `offset`, waiting
  // up to `timeout` for the first. Fewer (or none) on timeout. A broken
  // connection (UNAVAILABLE: a broker that restarted) is tried again within
  // `timeout`.
  Result<std::vector<BusMessage>> Fetch(std::string_view topic, int64_t offset, int max,
                                        std::chrono::milliseconds timeout,
                                        const FetchOptions& fetch = {});

  // The next offset to read, per topic this client subscribes to (inbox:
  // "@inbox/<agent>"), and the broker incarnation they belong to (0 before
  // any stream opened). Store both in a checkpoint; pass them back as
  // StartAt::Offset(offset, incarnation) on restore.
  // While subscriptions straddle a broker restart (some reconnected, some
  // not yet) the incarnation is kMixedIncarnation, which no broker has: a
  // restore from it reads every topic from the new log's start (duplicates,
  // never a gap).
  std::map<std::string, int64_t> SubscriptionOffsets() const;
  uint64_t SubscriptionIncarnation() const;

  // Publisher stream identity (see bus.proto): a restored agent normally keeps
  // the fresh random publisher_id; set both to continue one exact stream.
  uint64_t publisher_id() const;
  uint64_t NextSequence() const;
  void SetNextSequence(uint64_t next);

  // The topics this agent may read, with their offsets; only `topic` when given.
  Result<std::vector<BusTopicInfo>> ListTopics(std::string_view topic = {});
  Result<BusStats> Stats();

 private:
  struct Impl;
  friend struct BusClientStubAccess;  // MakeBusClientWithStub (comms/bus_client_stub.h)
  explicit BusClient(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace agentrt
