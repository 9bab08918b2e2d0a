// The bus client's insides, shared by its three files: bus_client.cc (the
// unary calls), bus_client_publisher.cc (PublishAsync and the loop that sends
// its batches) and bus_client_subscription.cc (subscriptions and the loop that
// reads each). Not installed.
#pragma once

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "common/crc32c.h"
#include "common/file_util.h"
#include "comms/bus_client.h"
#include "comms/bus_log.h"
#include "comms/bus_validate.h"
#include "comms/proto/bus.grpc.pb.h"
#include "plan/mpi_shm.h"

namespace agentrt {
namespace bus_client_internal {

namespace v1 = bus::v1;
// The clock of the client's deadlines, retries and give-ups: steady, so that a
// step of the wall clock (NTP) neither ends them at once nor stretches them.
// gRPC takes wall-clock deadlines: Prepare converts.
using DeadlineClock = std::chrono::steady_clock;

// The one place where a gRPC status becomes an agentrt::Status (the codes
// share gRPC's numbering; one from a newer peer outside it reads as INTERNAL).
inline Status FromGrpc(const grpc::Status& s, std::string_view what) {
  if (s.ok()) return Status::Ok();
  const int c = static_cast<int>(s.error_code());
  const auto code =
      c > 0 && c <= kLastStatusCode ? static_cast<StatusCode>(c) : StatusCode::kInternal;
  return Status(code, std::string(what) + ": " + s.error_message());
}

inline bool Retryable(grpc::StatusCode c) {
  return c == grpc::StatusCode::UNAVAILABLE || c == grpc::StatusCode::DEADLINE_EXCEEDED;
}
inline bool RetryableStatus(const grpc::Status& s) { return Retryable(s.error_code()); }

// Async payloads of at least this many bytes (and at most kMaxInlineBytes)
// go through the spool where there is one: below it, a file per message
// costs more than the bytes it keeps off the socket.
inline constexpr size_t kSpoolAsyncMinBytes = size_t{256} << 10;
// At most this many bytes of a client's async payloads wait in spool files
// (each an open descriptor) at a time, and at most kSpoolAsyncMaxFiles
// files (each counts at least kSpoolAsyncMaxBytes / kSpoolAsyncMaxFiles).
// A PublishAsync waits for room (answers free it) up to its timeout before
// it sends its payload inline: inline, each would cost the broker a receive,
// a parse and a write of its own, and the publisher's memory.
inline constexpr int64_t kSpoolAsyncMaxBytes = int64_t{128} << 20;
inline constexpr int64_t kSpoolAsyncMaxFiles = 64;

// The room a client's async payloads have in spool files (bytes, counted
// as kSpoolAsyncMaxBytes says): taken before a payload is written
// there, given back by its SpooledPayload when that goes (answered, failed,
// or sent inline after all).
class SpoolRoom {
 public:
  // Takes `bytes` once they fit, waiting until `until` for payloads to give
  // theirs back; false, nothing taken, if they did not fit by then.
  bool Take(int64_t bytes, DeadlineClock::time_point until) {
    std::unique_lock<std::mutex> lock(mu_);
    if (!cv_.wait_until(lock, until, [&] { return used_ + bytes <= kSpoolAsyncMaxBytes; }))
      return false;
    used_ += bytes;
    return true;
  }
  void Give(int64_t bytes) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      used_ -= bytes;
    }
    cv_.notify_all();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  int64_t used_ = 0;
};

// An async publish's payload in a spool file of the broker's (held, under
// flock, until the publish is answered): removed with its holder unless
// the broker took it over (renamed it away) meanwhile.
struct SpooledPayload {
  int fd = -1;
  std::string path, name;
  std::string spool_id;  // of the spool it was written to
  size_t size = 0;
  uint32_t crc = 0;
  SpoolRoom* room = nullptr;  // the client's, given back `charged` when this goes
  int64_t charged = 0;
  SpooledPayload() = default;
  SpooledPayload(const SpooledPayload&) = delete;
  SpooledPayload& operator=(const SpooledPayload&) = delete;
  ~SpooledPayload();
};

// Async publishes, queued as the batches they are sent in. A batch that was
// answered is cleared and reused, its requests' strings keeping their
// storage, so queueing a message does not allocate once batches circulate.
struct AsyncBatch {
  struct Pending {
    uint64_t sequence;
    AckCallback on_ack;
    std::unique_ptr<SpooledPayload> spooled;  // its entry's payload, when spooled
  };
  std::vector<Pending> entries;  // not yet answered, in order
  v1::PublishBatchRequest req;   // the same entries
  int64_t bytes = 0;             // their payload bytes
  DeadlineClock::time_point first_sent;
};

// A direct message (Send, Request, Reply) is one call: at most kMaxInlineBytes.
inline Status CheckInline(std::string_view payload, std::string_view what) {
  if (static_cast<int64_t>(payload.size()) <= kMaxInlineBytes) return Status::Ok();
  return ResourceExhausted(
      std::string(what) + ": a payload of " + std::to_string(payload.size()) +
      " bytes is more than a direct message carries (" + std::to_string(kMaxInlineBytes) +
      " bytes); publish it to a topic, which takes up to bus.max_message_bytes");
}

// A large message as delivered: its payload whole, no wire fields of chunking.
inline void ClearChunked(BusMessage* m) {
  m->clear_chunked_size();
  m->clear_chunked_crc32c();
  m->clear_chunked_file();
  m->clear_chunked_path();
}

// Puts large messages back together from a stream's responses (bus.proto:
// the message alone in a `messages` response, then `chunk` responses) and
// hands every whole message to `deliver`. A reader that starts a new stream
// resets it: a message is delivered whole or not at all.
class Reassembler {
 public:
  // pass_paths: a message the broker named a local file for is delivered as
  // it came (chunked_path set, no payload): the caller reads the file.
  explicit Reassembler(bool pass_paths = false) : pass_paths_(pass_paths) {}
  template <typename Deliver>
  Status Feed(const v1::SubscribeResponse& resp, Deliver&& deliver) {
    for (const auto& m : resp.messages()) {
      if (large_) return Internal("a message inside a large message's chunks");
      if (m.chunked_size() <= 0) {
        deliver(m);
        continue;
      }
      if (!m.chunked_path().empty() && pass_paths_) {
        deliver(m);
        continue;
      }
      if (!m.chunked_path().empty()) {
        AGENTRT_RETURN_IF_ERROR(ReadLocal(m, deliver));
        continue;
      }
      large_ = std::make_unique<BusMessage>(m);
      ClearChunked(large_.get());
      size_ = m.chunked_size();
      expected_crc_ = m.chunked_crc32c();
      crc_ = 0;
      large_->mutable_payload()->reserve(static_cast<size_t>(size_));
    }
    if (resp.chunk().empty()) return Status::Ok();
    if (!large_) return Internal("a chunk with no large message under way");
    std::string& payload = *large_->mutable_payload();
    if (static_cast<int64_t>(payload.size() + resp.chunk().size()) > size_)
      return Internal("more chunk bytes than the large message's size");
    payload.append(resp.chunk());
    crc_ = Crc32c(resp.chunk().data(), resp.chunk().size(), crc_);
    if (static_cast<int64_t>(payload.size()) < size_) return Status::Ok();
    std::unique_ptr<BusMessage> whole = std::move(large_);
    if (crc_ != expected_crc_) {
      return DataLoss("the " + std::to_string(size_) + " bytes of offset " +
                      std::to_string(whole->offset()) + " do not match their CRC32C");
    }
    deliver(std::move(*whole));  // a caller that keeps it moves it, not copies
    return Status::Ok();
  }
  void Reset() { large_.reset(); }
  // A local read failed (another node, or other bytes): read with chunks from here on.
  bool local_failed() const { return local_failed_; }
  // ... because the file is not there (another node, or retention removed it).
  bool local_missing() const { return local_missing_; }

 private:
  // A large message whose file the broker named: read here, CRC-checked.
  template <typename Deliver>
  Status ReadLocal(const BusMessage& m, Deliver&& deliver) {
    Result<std::string> bytes =
        ReadWholeFileMapped(m.chunked_path(), static_cast<size_t>(m.chunked_size()));
    Status bad;
    if (!bytes.ok()) {
      bad = bytes.status();
    } else if (static_cast<int64_t>(bytes->size()) != m.chunked_size() ||
               Crc32c(bytes->data(), bytes->size()) != m.chunked_crc32c()) {
      bad = DataLoss(m.chunked_path() + " does not hold the payload of offset " +
                     std::to_string(m.offset()) + " here");
    }
    if (!bad.ok()) {
      local_failed_ = true;
      local_missing_ = bad.code() == StatusCode::kNotFound;
      return Status(StatusCode::kFailedPrecondition,
                    "reading a large message's file on this node: " + bad.message());
    }
    BusMessage whole(m);
    ClearChunked(&whole);
    *whole.mutable_payload() = std::move(bytes).value();
    deliver(std::move(whole));
    return Status::Ok();
  }

  bool pass_paths_ = false;
  bool local_failed_ = false;
  bool local_missing_ = false;
  std::unique_ptr<BusMessage> large_;  // under way
  int64_t size_ = 0;
  uint32_t expected_crc_ = 0, crc_ = 0;
};

inline void ToProto(const StartAt& from, v1::StartAt* out) {
  switch (from.kind) {
    case StartAt::Kind::kEarliest:
      out->set_earliest(true);
      break;
    case StartAt::Kind::kLatest:
      out->set_latest(true);
      break;
    case StartAt::Kind::kOffset:
      out->set_offset(from.offset);
      break;
  }
}

}  // namespace bus_client_internal

struct BusClientSubscription {
  SubscriptionId id = 0;
  std::string topic;  // "" for the inbox
  bool inbox = false;
  StartAt from;
  MessageCallback on_message;
  SubscribeOptions opts;
  std::atomic<int64_t> next_offset{0};
  std::atomic<bool> has_position{false};
  std::atomic<uint64_t> incarnation{0};  // of the broker `next_offset` belongs to
  bool local_files = false;    // large payloads read from the broker's files (until that fails)
  bool local_decided = false;  // local_files set by the options or by OnBrokerNode
  std::mutex mu;               // guards ctx, stop, final_status
  std::condition_variable cv;
  grpc::ClientContext* ctx = nullptr;
  bool stop = false;
  Status final_status;
  std::thread thread;
};

// A publisher's file in the broker's spool (bus_client_spool.cc).
struct SpoolFile {
  int fd = -1;
  std::string path, name;
};

struct BusClient::Impl {
  using AsyncBatch = bus_client_internal::AsyncBatch;
  using DeadlineClock = bus_client_internal::DeadlineClock;
  std::string address;
  Credential cred;
  BusClientOptions options;
  std::shared_ptr<grpc::Channel> channel;  // null with an injected stub
  std::unique_ptr<bus::v1::Bus::StubInterface> stub;
  uint64_t publisher_id = 0;
  std::atomic<uint64_t> next_sequence{1};

  mutable std::mutex subs_mu;
  std::map<SubscriptionId, std::shared_ptr<BusClientSubscription>> subs;
  SubscriptionId next_sub_id = 1;

  // Async publishing.
  std::mutex async_mu;
  std::condition_variable async_cv;
  // Spooled async payloads not answered yet (before the queues: a
  // SpooledPayload gives its room back as it goes).
  bus_client_internal::SpoolRoom spool_room;
  std::deque<AsyncBatch> async_queue;   // the back one takes new messages
  std::vector<AsyncBatch> async_spare;  // answered batches, cleared, for reuse
  size_t async_unacked = 0;             // queued + in flight
  // The broker said it takes packed entries (PublishBatchResponse): new
  // batches are packed while uniform. Off again after a broken stream (the
  // broker may have been replaced), until the next answer says so.
  bool async_packs = false;
  bool async_stop = false;
  Status async_error;
  std::thread async_thread;

  // The sequence a publish carries: the caller's, or the next automatic one.
  uint64_t SequenceFor(const PublishOptions& opts) {
    return opts.sequence != 0 ? opts.sequence : next_sequence.fetch_add(1);
  }

  void Prepare(grpc::ClientContext* ctx, DeadlineClock::time_point deadline) const {
    ctx->set_deadline(std::chrono::system_clock::now() + (deadline - DeadlineClock::now()));
    ctx->AddMetadata("x-agentrt-agent", cred.agent);
    ctx->AddMetadata("x-agentrt-token", cred.token);
    if (!options.incarnation.empty())
      ctx->AddMetadata("x-agentrt-incarnation", options.incarnation);
  }

  // Waits `d` between two attempts while driving the channel's reconnection
  // (WaitForConnected polls it). A thread that only slept left gRPC to
  // advance a connection from its backup poller, every 5 s: a TLS handshake
  // takes several turns, and a client of a broker that restarted stood at an
  // established connection without sending its hello past its call deadline.
  void Pause(std::chrono::milliseconds d) const {
    const auto until = std::chrono::steady_clock::now() + d;
    if (channel) channel->WaitForConnected(std::chrono::system_clock::now() + d);
    std::this_thread::sleep_until(until);
  }

  std::chrono::milliseconds Backoff(int attempt) const {
    auto b = options.retry_backoff * (1 << std::min(attempt, 10));
    return std::min<std::chrono::milliseconds>(b, options.max_retry_backoff);
  }

  // The one retry loop of the client's calls: runs `attempt` (0, 1, ...) until
  // `again` of its result is false (it succeeded, or failed for good) or the
  // next backoff would pass `deadline` (it gives up then, rather than try once
  // more at the deadline), pausing (Pause) in between; returns the last
  // result.
  template <typename Attempt, typename Again>
  auto Retrying(DeadlineClock::time_point deadline, Attempt attempt, Again again) {
    for (int n = 0;; ++n) {
      auto got = attempt(n);
      const auto wait = Backoff(n);
      if (!again(got) || DeadlineClock::now() + wait >= deadline) return got;
      Pause(wait);
    }
  }

  // Runs a unary call, retrying UNAVAILABLE / DEADLINE_EXCEEDED of one attempt
  // until the overall deadline.
  template <typename Req, typename Resp, typename Call>
  Status UnaryWithRetry(Call call, const Req& req, Resp* resp, DeadlineClock::time_point deadline,
                        std::string_view what) {
    const grpc::Status s = Retrying(
        deadline,
        [&](int) {
          grpc::ClientContext ctx;
          Prepare(&ctx, std::min(deadline, DeadlineClock::now() + options.call_timeout));
          return (stub.get()->*call)(&ctx, req, resp);
        },
        bus_client_internal::RetryableStatus);
    if (s.ok()) return Status::Ok();
    return bus_client_internal::FromGrpc(
        s, std::string(what) + " (bus " + address + ", agent " + cred.agent + ")");
  }

  // A publish or send of an inline payload, addressed in `req` already: fills
  // in the payload, content type, publisher id and sequence, and runs the call
  // with retries until the caller's deadline.
  template <typename Resp, typename Req, typename Call>
  Result<PublishAck> Store(Call call, Req& req, std::string_view payload,
                           const PublishOptions& opts, std::string_view what) {
    req.set_payload(std::string(payload));
    req.set_content_type(opts.content_type);
    req.set_publisher_id(publisher_id);
    const uint64_t seq = SequenceFor(opts);
    req.set_sequence(seq);
    Resp resp;
    const auto deadline = DeadlineClock::now() + opts.timeout.value_or(options.call_timeout);
    AGENTRT_RETURN_IF_ERROR(UnaryWithRetry(call, req, &resp, deadline, what));
    return PublishAck{resp.offset(), resp.duplicate(), seq};
  }

  class SubscriptionReader;  // bus_client_subscription.cc
  class AsyncPublisher;      // bus_client_publisher.cc
  void RunSubscription(const std::shared_ptr<BusClientSubscription>& sub);
  SubscriptionId AddSubscription(std::shared_ptr<BusClientSubscription> sub, StartAt from,
                                 MessageCallback on_message, SubscribeOptions opts);
  void RunAsyncPublisher();
  // A payload above kMaxInlineBytes: PublishLarge, chunk by chunk from
  // `payload` (no copy of it), retried whole with the same sequence.
  Result<PublishAck> PublishChunked(std::string_view topic, std::string_view payload,
                                    const PublishOptions& opts, uint64_t seq);

  // The broker's spool for a publish of `size` bytes to `topic`
  // (bus_client_spool.cc): its folder; "" when this process cannot use it
  // (another node, no spool, write_local_files off, the broker unreachable
  // for now, a refused file's wait: options.spool_retry_after); the
  // broker's refusal of the publish itself (ACL, size) as an error. A folder
  // once proven is remembered; a refused adoption turns the spool off for
  // that wait (RefuseSpoolLocked).
  Result<std::string> SpoolFor(std::string_view topic, size_t size);
  // Whether this process is on the broker's node and may read its spool (so
  // its files): asks the broker (SpoolFor) while that is not known; nullopt
  // while it cannot be told (the broker unreachable, or a refused file's
  // wait, in which a subscription streams and asks again when it
  // reconnects). `again`: ask even though a spool was proven (after a broken
  // stream: the broker may have made its spool anew), using the proven one
  // until answered, and not any more if no answer came; a spool found
  // unusable stays so.
  std::optional<bool> OnBrokerNode(bool again = false);
  // `payload` written into a new file of a spool already proven (no call
  // here), once it has room (spool_room, waiting up to `wait`); null when
  // there is no spool, no room in time or the write fails (the bytes go
  // inline).
  std::unique_ptr<bus_client_internal::SpooledPayload> SpoolPayload(std::string_view payload,
                                                                    std::chrono::milliseconds wait);
  // A new file in spool folder `dir`, held under flock until its adoption
  // is answered; nullopt when it cannot be made (the publish goes another way).
  std::optional<SpoolFile> CreateSpoolFile(const std::string& dir);
  // Hands `file` of `size` bytes with CRC32C `crc` to the broker
  // (AdoptLarge) and closes it. If the broker cannot take it, or the answer
  // is lost, its bytes are sent in chunks with the same sequence (a version
  // already stored is answered as a duplicate); a refused or timed-out one
  // is removed.
  Result<PublishAck> AdoptSpooled(std::string_view topic, const SpoolFile& file, size_t size,
                                  uint32_t crc, const PublishOptions& opts, uint64_t seq);
  // A payload above kMaxInlineBytes written by `fill` into a spool file the
  // broker adopts. nullopt: no usable spool (nothing was written); the
  // caller publishes another way.
  std::optional<Result<PublishAck>> PublishSpooled(
      std::string_view topic, size_t size, const std::function<Status(LargePayloadWriter&)>& fill,
      const PublishOptions& opts, uint64_t seq);
  // One Fetch call (BusClient::Fetch decides about local_files).
  Result<std::vector<BusMessage>> FetchOnce(std::string_view topic, int64_t offset, int max,
                                            std::chrono::milliseconds timeout, bool local_files);
  // Set once a file the broker named could not be read here (another node
  // without the broker's file system): fetches ask for the bytes from then on.
  std::atomic<bool> broker_files_unreadable{false};
  std::mutex node_dir_mu;
  bool node_dir_tried = false;  // guarded by node_dir_mu
  SharedNodeDir node_dir;       // guarded by node_dir_mu
  std::mutex spool_mu;
  int spool_state = 0;  // 0 not proven yet, 1 usable (spool_dir, spool_id), -1 not usable
  bool spool_adopts_entries = false;     // the broker said it takes PublishRequest.spooled_name
  uint64_t spool_answers = 0;            // Spool calls the broker answered
  std::atomic<bool> spool_asked{false};  // by PublishAsync
  std::string spool_dir, spool_id;
  // After a refused spool file (spool_state 0): when the spool may be asked
  // for again (options.spool_retry_after later); none once asked.
  std::optional<DeadlineClock::time_point> spool_ask_after;

  // Under spool_mu: the broker refused a file of the spool in use.
  void RefuseSpoolLocked() {
    spool_state = 0;
    const auto now = DeadlineClock::now();
    const auto wait =
        std::chrono::duration_cast<DeadlineClock::duration>(options.spool_retry_after);
    spool_ask_after = wait >= DeadlineClock::time_point::max() - now
                          ? DeadlineClock::time_point::max()
                          : now + wait;
  }
  // Under spool_mu: a refusal keeps the spool unasked for a while yet.
  bool SpoolHeldOffLocked() const {
    return spool_state == 0 && spool_ask_after && DeadlineClock::now() < *spool_ask_after;
  }
  // Whether PublishAsync asks the broker about its spool now: its first
  // large payload does, and the first after a refusal's wait.
  bool SpoolAskDue();
};

}  // namespace agentrt
