#include "comms/bus_client.h"

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <deque>
#include <mutex>
#include <thread>

#include "common/crc32c.h"
#include "common/file_util.h"
#include "common/random.h"
#include "comms/bus_client_stub.h"
#include "comms/bus_log.h"
#include "comms/bus_validate.h"
#include "comms/grpc_log.h"
#include "comms/proto/bus.grpc.pb.h"

namespace agentrt {

namespace v1 = bus::v1;
using WallClock = std::chrono::system_clock;

namespace {

// The one place where a gRPC status becomes an agentrt::Status (the codes
// share gRPC's numbering; one from a newer peer outside it reads as INTERNAL).
Status FromGrpc(const grpc::Status& s, std::string_view what) {
  if (s.ok()) return Status::Ok();
  const int c = static_cast<int>(s.error_code());
  const auto code =
      c > 0 && c <= kLastStatusCode ? static_cast<StatusCode>(c) : StatusCode::kInternal;
  return Status(code, std::string(what) + ": " + s.error_message());
}

bool Retryable(grpc::StatusCode c) {
  return c == grpc::StatusCode::UNAVAILABLE || c == grpc::StatusCode::DEADLINE_EXCEEDED;
}

// Async publishes, queued as the batches they are sent in. A batch that was
// answered is cleared and reused, its requests' strings keeping their
// storage, so queueing a message does not allocate once batches circulate.
struct AsyncBatch {
  struct Pending {
    uint64_t sequence;
    AckCallback on_ack;
  };
  std::vector<Pending> entries;  // not yet answered, in order
  v1::PublishBatchRequest req;   // the same entries
  int64_t bytes = 0;             // their payload bytes
  WallClock::time_point first_sent;
};

// A direct message (Send, Request, Reply) is one call: at most kMaxInlineBytes.
Status CheckInline(std::string_view payload, std::string_view what) {
  if (static_cast<int64_t>(payload.size()) <= kMaxInlineBytes) return Status::Ok();
  return ResourceExhausted(
      std::string(what) + ": a payload of " + std::to_string(payload.size()) +
      " bytes is more than a direct message carries (" + std::to_string(kMaxInlineBytes) +
      " bytes); publish it to a topic, which takes up to bus.max_message_bytes");
}

// A large message as delivered: its payload whole, no wire fields of chunking.
void ClearChunked(BusMessage* m) {
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
  template <typename Deliver>
  Status Feed(const v1::SubscribeResponse& resp, Deliver&& deliver) {
    for (const auto& m : resp.messages()) {
      if (large_) return Internal("a message inside a large message's chunks");
      if (m.chunked_size() <= 0) {
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
    deliver(*whole);
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
        ReadWholeFile(m.chunked_path(), static_cast<size_t>(m.chunked_size()));
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
    deliver(whole);
    return Status::Ok();
  }

  bool local_failed_ = false;
  bool local_missing_ = false;
  std::unique_ptr<BusMessage> large_;  // under way
  int64_t size_ = 0;
  uint32_t expected_crc_ = 0, crc_ = 0;
};

}  // namespace

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
  bool local_files = false;  // large payloads read from the broker's files (until that fails)
  std::mutex mu;             // guards ctx, stop, final_status
  std::condition_variable cv;
  grpc::ClientContext* ctx = nullptr;
  bool stop = false;
  Status final_status;
  std::thread thread;
};

struct BusClient::Impl {
  std::string address;
  Credential cred;
  BusClientOptions options;
  std::shared_ptr<grpc::Channel> channel;  // null with an injected stub
  std::unique_ptr<v1::Bus::StubInterface> stub;
  uint64_t publisher_id = 0;
  std::atomic<uint64_t> next_sequence{1};

  mutable std::mutex subs_mu;
  std::map<SubscriptionId, std::shared_ptr<BusClientSubscription>> subs;
  SubscriptionId next_sub_id = 1;

  // Async publishing.
  std::mutex async_mu;
  std::condition_variable async_cv;
  std::deque<AsyncBatch> async_queue;   // the back one takes new messages
  std::vector<AsyncBatch> async_spare;  // answered batches, cleared, for reuse
  size_t async_unacked = 0;             // queued + in flight
  bool async_stop = false;
  Status async_error;
  std::thread async_thread;

  // The sequence a publish carries: the caller's, or the next automatic one.
  uint64_t SequenceFor(const PublishOptions& opts) {
    return opts.sequence != 0 ? opts.sequence : next_sequence.fetch_add(1);
  }

  void Prepare(grpc::ClientContext* ctx, WallClock::time_point deadline) const {
    ctx->set_deadline(deadline);
    ctx->AddMetadata("x-agentrt-agent", cred.agent);
    ctx->AddMetadata("x-agentrt-token", cred.token);
  }

  std::chrono::milliseconds Backoff(int attempt) const {
    auto b = options.retry_backoff * (1 << std::min(attempt, 10));
    return std::min<std::chrono::milliseconds>(b, options.max_retry_backoff);
  }

  // Runs a unary call, retrying UNAVAILABLE / DEADLINE_EXCEEDED of one attempt
  // until the overall deadline.
  template <typename Req, typename Resp, typename Call>
  Status UnaryWithRetry(Call call, const Req& req, Resp* resp, WallClock::time_point deadline,
                        std::string_view what) {
    for (int attempt = 0;; ++attempt) {
      grpc::ClientContext ctx;
      const auto attempt_deadline = std::min(deadline, WallClock::now() + options.call_timeout);
      Prepare(&ctx, attempt_deadline);
      grpc::Status s = (stub.get()->*call)(&ctx, req, resp);
      if (s.ok()) return Status::Ok();
      const auto wait = Backoff(attempt);
      if (!Retryable(s.error_code()) || WallClock::now() + wait >= deadline) {
        return FromGrpc(s, std::string(what) + " (bus " + address + ", agent " + cred.agent + ")");
      }
      std::this_thread::sleep_for(wait);
    }
  }

  void RunSubscription(const std::shared_ptr<BusClientSubscription>& sub);
  SubscriptionId AddSubscription(std::shared_ptr<BusClientSubscription> sub, StartAt from,
                                 MessageCallback on_message, SubscribeOptions opts);
  void RunAsyncPublisher();
  // A payload above kMaxInlineBytes: PublishLarge, chunk by chunk from
  // `payload` (no copy of it), retried whole with the same sequence.
  Result<PublishAck> PublishChunked(std::string_view topic, std::string_view payload,
                                    const PublishOptions& opts, uint64_t seq);
};

Result<PublishAck> BusClient::Impl::PublishChunked(std::string_view topic, std::string_view payload,
                                                   const PublishOptions& opts, uint64_t seq) {
  // Unless told, call_timeout plus a second per 64 MiB (1 GiB: 26 s by default).
  const auto deadline =
      WallClock::now() +
      opts.timeout.value_or(options.call_timeout +
                            std::chrono::seconds(static_cast<int64_t>(payload.size() >> 26)));
  const uint32_t crc = Crc32c(payload.data(), payload.size());
  const std::string what = "publish of " + std::to_string(payload.size()) + " bytes to topic \"" +
                           std::string(topic) + "\" (bus " + address + ", agent " + cred.agent +
                           ")";
  v1::PublishChunk chunk;
  for (int attempt = 0;; ++attempt) {
    grpc::ClientContext ctx;
    Prepare(&ctx, deadline);
    v1::PublishResponse resp;
    auto writer = stub->PublishLarge(&ctx, &resp);
    chunk.Clear();
    v1::PublishRequest* head = chunk.mutable_head();
    head->set_topic(std::string(topic));
    head->set_content_type(opts.content_type);
    head->set_publisher_id(publisher_id);
    head->set_sequence(seq);
    chunk.set_size(static_cast<int64_t>(payload.size()));
    chunk.set_crc32c(crc);
    size_t pos = 0;
    bool sent = true;
    while (pos < payload.size()) {
      const size_t n = std::min(payload.size() - pos, static_cast<size_t>(kChunkBytes));
      chunk.set_data(payload.data() + pos, n);
      if (!writer->Write(chunk)) {  // the broker answered already (an error, or a duplicate)
        sent = false;
        break;
      }
      pos += n;
      chunk.clear_head();
      chunk.clear_size();
      chunk.clear_crc32c();
    }
    if (sent) writer->WritesDone();
    grpc::Status s = writer->Finish();
    if (s.ok()) return PublishAck{resp.offset(), resp.duplicate(), seq};
    const auto wait = Backoff(attempt);
    if (!Retryable(s.error_code()) || WallClock::now() + wait >= deadline) return FromGrpc(s, what);
    std::this_thread::sleep_for(wait);
  }
}

BusClient::BusClient(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {
  impl_->async_thread = std::thread([this] { impl_->RunAsyncPublisher(); });
}

BusClient::~BusClient() {
  Flush(impl_->options.call_timeout).IgnoreError();
  {
    std::lock_guard<std::mutex> lock(impl_->async_mu);
    impl_->async_stop = true;
  }
  impl_->async_cv.notify_all();
  impl_->async_thread.join();
  std::vector<SubscriptionId> ids;
  {
    std::lock_guard<std::mutex> lock(impl_->subs_mu);
    for (const auto& [id, s] : impl_->subs) ids.push_back(id);
  }
  for (auto id : ids) Unsubscribe(id).IgnoreError();
}

struct BusClientStubAccess {
  static std::unique_ptr<BusClient> Make(std::unique_ptr<BusClient::Impl> impl) {
    return std::unique_ptr<BusClient>(new BusClient(std::move(impl)));
  }
  static BusClient::Impl& ImplOf(BusClient& client) { return *client.impl_; }
  static std::unique_ptr<BusClient::Impl> NewImpl() { return std::make_unique<BusClient::Impl>(); }
};

Result<std::unique_ptr<BusClient>> BusClient::Connect(std::string address, Credential credential,
                                                      BusClientOptions options) {
  if (address.empty()) return InvalidArgument("bus client: empty bus address (expected host:port)");
  if (credential.agent.empty() || credential.token.empty()) {
    return InvalidArgument("bus client: the credential has no agent name or no token");
  }
  RouteGrpcLogging();
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, options.keepalive_time_ms);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, options.keepalive_timeout_ms);
  args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  args.SetInt(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  args.SetInt(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, 8 << 20);
  args.SetMaxReceiveMessageSize(-1);
  args.SetMaxSendMessageSize(-1);
  std::shared_ptr<grpc::ChannelCredentials> creds;
  if (!options.tls_ca_file.empty()) {
    grpc::SslCredentialsOptions ssl;
    AGENTRT_ASSIGN_OR_RETURN(ssl.pem_root_certs, ReadTlsFile(options.tls_ca_file, "bus TLS CA"));
    if (!options.tls_cert_file.empty()) {
      AGENTRT_ASSIGN_OR_RETURN(ssl.pem_cert_chain,
                               ReadTlsFile(options.tls_cert_file, "bus TLS client certificate"));
      AGENTRT_ASSIGN_OR_RETURN(ssl.pem_private_key,
                               ReadTlsFile(options.tls_key_file, "bus TLS client key"));
    }
    if (!options.tls_server_name.empty()) args.SetSslTargetNameOverride(options.tls_server_name);
    creds = grpc::SslCredentials(ssl);
  } else {
    creds = grpc::InsecureChannelCredentials();
  }
  auto channel = grpc::CreateCustomChannel(address, creds, args);
  auto client = MakeBusClientWithStub(v1::Bus::NewStub(channel), std::move(address),
                                      std::move(credential), std::move(options));
  if (client.ok()) BusClientStubAccess::ImplOf(**client).channel = std::move(channel);
  return client;
}

Result<std::unique_ptr<BusClient>> MakeBusClientWithStub(
    std::unique_ptr<bus::v1::Bus::StubInterface> stub, std::string address, Credential credential,
    BusClientOptions options) {
  if (stub == nullptr) return InvalidArgument("bus client: no stub");
  if (credential.agent.empty() || credential.token.empty()) {
    return InvalidArgument("bus client: the credential has no agent name or no token");
  }
  auto impl = BusClientStubAccess::NewImpl();
  impl->stub = std::move(stub);
  impl->address = std::move(address);
  impl->cred = std::move(credential);
  impl->publisher_id = options.publisher_id != 0 ? options.publisher_id : RandomNonZeroU64();
  if (const char* local = std::getenv("AGENTRT_BUS_LOCAL_FILES"); local != nullptr)
    options.read_local_files = std::string_view(local) == "1";
  impl->options = std::move(options);
  return BusClientStubAccess::Make(std::move(impl));
}

Result<std::unique_ptr<BusClient>> BusClient::FromEnvironment(BusClientOptions options) {
  AGENTRT_ASSIGN_OR_RETURN(const AgentEnv env, AgentEnv::FromProcess());
  return ForAgent(env, std::move(options));
}

Result<std::unique_ptr<BusClient>> BusClient::ForAgent(const AgentEnv& env,
                                                       BusClientOptions options) {
  if (env.bus.empty()) {
    return FailedPrecondition("agent " + env.agent +
                              ": AGENTRT_BUS is not set: this run has no message bus");
  }
  if (env.token_file.empty()) {
    return FailedPrecondition(
        "agent " + env.agent +
        ": AGENTRT_TOKEN_FILE is not set; is this process started by agentctl run?");
  }
  AGENTRT_ASSIGN_OR_RETURN(Credential cred, ReadTokenFile(env.token_file));
  return Connect(env.bus, std::move(cred), std::move(options));
}

const std::string& BusClient::agent() const { return impl_->cred.agent; }
const std::string& BusClient::address() const { return impl_->address; }
uint64_t BusClient::publisher_id() const { return impl_->publisher_id; }
uint64_t BusClient::NextSequence() const { return impl_->next_sequence.load(); }
void BusClient::SetNextSequence(uint64_t next) { impl_->next_sequence.store(next == 0 ? 1 : next); }

Status BusClient::WaitForReady(std::chrono::milliseconds timeout) {
  const auto deadline = WallClock::now() + timeout;
  for (int attempt = 0;; ++attempt) {
    grpc::ClientContext ctx;
    impl_->Prepare(&ctx, deadline);
    ctx.set_wait_for_ready(true);
    v1::StatsResponse resp;
    grpc::Status s = impl_->stub->Stats(&ctx, v1::StatsRequest(), &resp);
    if (s.ok()) return Status::Ok();
    if (s.error_code() != grpc::StatusCode::UNAVAILABLE || WallClock::now() >= deadline) {
      return FromGrpc(s, "waiting for the bus at " + impl_->address);
    }
    std::this_thread::sleep_for(impl_->Backoff(attempt));
  }
}

Result<PublishAck> BusClient::Publish(std::string_view topic, std::string_view payload,
                                      const PublishOptions& opts) {
  if (static_cast<int64_t>(payload.size()) > kMaxInlineBytes)
    return impl_->PublishChunked(topic, payload, opts, impl_->SequenceFor(opts));
  v1::PublishRequest req;
  req.set_topic(std::string(topic));
  req.set_payload(std::string(payload));
  req.set_content_type(opts.content_type);
  req.set_publisher_id(impl_->publisher_id);
  const uint64_t seq = impl_->SequenceFor(opts);
  req.set_sequence(seq);
  v1::PublishResponse resp;
  const auto deadline = WallClock::now() + opts.timeout.value_or(impl_->options.call_timeout);
  AGENTRT_RETURN_IF_ERROR(impl_->UnaryWithRetry(&v1::Bus::StubInterface::Publish, req, &resp,
                                                deadline,
                                                "publish to topic \"" + std::string(topic) + "\""));
  return PublishAck{resp.offset(), resp.duplicate(), seq};
}

void BusClient::PublishAsync(std::string_view topic, std::string_view payload,
                             const PublishOptions& opts, AckCallback on_ack) {
  if (static_cast<int64_t>(payload.size()) > kMaxInlineBytes) {
    // A large payload is not copied into the queue: it is published here,
    // after everything queued before it is stored (the order holds).
    const auto timeout = opts.timeout.value_or(impl_->options.call_timeout);
    bool drained = false;
    {
      std::unique_lock<std::mutex> lock(impl_->async_mu);
      drained = impl_->async_cv.wait_for(lock, timeout, [&] { return impl_->async_unacked == 0; });
    }
    Result<PublishAck> ack = drained ? Publish(topic, payload, opts)
                                     : Result<PublishAck>(DeadlineExceeded(
                                           "publish of " + std::to_string(payload.size()) +
                                           " bytes to topic \"" + std::string(topic) +
                                           "\": the async publishes queued before it were not "
                                           "stored in time"));
    if (!ack.ok()) {
      std::lock_guard<std::mutex> lock(impl_->async_mu);
      if (impl_->async_error.ok()) impl_->async_error = ack.status();
    }
    if (on_ack) on_ack(ack);
    return;
  }
  const int64_t size = static_cast<int64_t>(payload.size());
  std::unique_lock<std::mutex> lock(impl_->async_mu);
  impl_->async_cv.wait(lock,
                       [&] { return impl_->async_unacked < impl_->options.async_max_pending; });
  const bool was_empty = impl_->async_queue.empty();
  auto& queue = impl_->async_queue;
  if (queue.empty() ||
      static_cast<int>(queue.back().entries.size()) >= impl_->options.async_batch_messages ||
      (!queue.back().entries.empty() &&
       queue.back().bytes + size > impl_->options.async_batch_bytes)) {
    if (impl_->async_spare.empty()) {
      queue.emplace_back();
    } else {
      queue.push_back(std::move(impl_->async_spare.back()));
      impl_->async_spare.pop_back();
    }
  }
  AsyncBatch& batch = queue.back();
  // Sequence taken under the queue lock: queue order == sequence order.
  const uint64_t seq = impl_->SequenceFor(opts);
  // Into a reused request's own strings (no temporary copies).
  v1::PublishRequest* m = batch.req.add_messages();
  m->set_topic(topic.data(), topic.size());
  m->set_payload(payload.data(), payload.size());
  m->set_content_type(opts.content_type);
  m->set_publisher_id(impl_->publisher_id);
  m->set_sequence(seq);
  batch.entries.push_back(AsyncBatch::Pending{seq, std::move(on_ack)});
  batch.bytes += size;
  ++impl_->async_unacked;
  lock.unlock();
  // Only the sending thread waits for the queue, and only for it to be
  // non-empty: one wake-up per burst, not a futex call per message.
  if (was_empty) impl_->async_cv.notify_all();
}

Status BusClient::Flush(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(impl_->async_mu);
  if (!impl_->async_cv.wait_for(lock, timeout, [&] { return impl_->async_unacked == 0; })) {
    return DeadlineExceeded("flush: " + std::to_string(impl_->async_unacked) +
                            " async publishes still unacknowledged by the bus at " +
                            impl_->address);
  }
  Status s = impl_->async_error;
  impl_->async_error = Status::Ok();
  return s;
}

// Async publishing: batches from the queue go out on one PublishStream, up to
// kMaxInFlight unanswered at a time, so the broker stores them in queue order
// while the next ones are already on the wire. A stream is open only while
// there is work; when it breaks, the unanswered batches are resent in order
// on a new one (their sequences make that safe).
void BusClient::Impl::RunAsyncPublisher() {
  constexpr size_t kMaxInFlight = 8;
  constexpr size_t kMaxSpareBatches = 2 * kMaxInFlight;
  using Batch = AsyncBatch;
  std::deque<Batch> in_flight;  // guarded by async_mu once the reader runs
  // Under async_mu: an answered batch goes back for reuse (or away).
  auto retire_front = [&] {
    // Reused only when its requests keep little storage (a batch that once
    // carried large payloads would hold on to them for good).
    size_t kept = 0;
    for (const auto& m : in_flight.front().req.messages()) kept += m.payload().capacity();
    if (async_spare.size() < kMaxSpareBatches &&
        kept <= static_cast<size_t>(options.async_batch_bytes)) {
      Batch& f = in_flight.front();
      f.entries.clear();
      f.req.Clear();  // keeps its requests, cleared, with their strings' storage
      f.bytes = 0;
      async_spare.push_back(std::move(f));
    }
    in_flight.pop_front();
  };
  std::vector<std::pair<AckCallback, Result<PublishAck>>> done;

  // Runs callbacks outside the lock and releases their backpressure.
  auto complete = [&](std::vector<std::pair<AckCallback, Result<PublishAck>>>& results) {
    for (auto& [cb, r] : results) {
      if (cb) cb(r);
    }
    {
      std::lock_guard<std::mutex> lock(async_mu);
      async_unacked -= results.size();
    }
    async_cv.notify_all();
    results.clear();
  };
  auto fail_front_entries = [&](size_t count, const Status& err) {
    std::vector<std::pair<AckCallback, Result<PublishAck>>> failed;
    {
      std::lock_guard<std::mutex> lock(async_mu);
      if (async_error.ok()) async_error = err;
      while (count > 0 && !in_flight.empty()) {
        Batch& f = in_flight.front();
        const size_t n = std::min(count, f.entries.size());
        for (size_t i = 0; i < n; ++i) failed.emplace_back(std::move(f.entries[i].on_ack), err);
        f.entries.erase(f.entries.begin(), f.entries.begin() + static_cast<std::ptrdiff_t>(n));
        f.req.mutable_messages()->DeleteSubrange(0, static_cast<int>(n));
        count -= n;
        if (f.entries.empty()) in_flight.pop_front();
      }
    }
    complete(failed);
  };

  int attempt = 0;
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(async_mu);
      async_cv.wait(lock, [&] { return !async_queue.empty() || !in_flight.empty() || async_stop; });
      if (async_queue.empty() && in_flight.empty()) return;  // stopping, nothing left
    }
    grpc::ClientContext ctx;
    Prepare(&ctx, WallClock::now() + options.stream_deadline);
    auto stream = stub->PublishStream(&ctx);
    bool broken = false;
    bool reader_done = false;
    // Resend what the last stream left unanswered, in order.
    for (auto& f : in_flight) {
      if (!stream->Write(f.req)) {
        broken = true;
        break;
      }
    }
    std::thread reader([&] {
      v1::PublishBatchResponse resp;
      std::vector<std::pair<AckCallback, Result<PublishAck>>> acked;
      while (stream->Read(&resp)) {
        {
          std::lock_guard<std::mutex> lock(async_mu);
          if (in_flight.empty()) break;  // protocol violation: nothing was waiting for this
          Batch& f = in_flight.front();
          const size_t n =
              std::min<size_t>(static_cast<size_t>(resp.acks_size()), f.entries.size());
          for (size_t i = 0; i < n; ++i) {
            const auto& a = resp.acks(static_cast<int>(i));
            acked.emplace_back(std::move(f.entries[i].on_ack),
                               PublishAck{a.offset(), a.duplicate(), f.entries[i].sequence});
          }
          if (n == f.entries.size()) {
            retire_front();
          } else {  // a partial answer precedes the stream's error
            f.entries.erase(f.entries.begin(), f.entries.begin() + static_cast<std::ptrdiff_t>(n));
            f.req.mutable_messages()->DeleteSubrange(0, static_cast<int>(n));
          }
        }
        complete(acked);
      }
      std::lock_guard<std::mutex> lock(async_mu);
      reader_done = true;
      async_cv.notify_all();
    });
    while (!broken) {
      Batch* next = nullptr;
      {
        std::unique_lock<std::mutex> lock(async_mu);
        async_cv.wait(lock, [&] {
          return reader_done || (!async_queue.empty() && in_flight.size() < kMaxInFlight) ||
                 (async_queue.empty() && in_flight.empty());
        });
        if (reader_done || async_queue.empty()) break;  // broken, or idle: close the stream
        // The oldest batch (closed from now on: new messages start another).
        in_flight.push_back(std::move(async_queue.front()));
        async_queue.pop_front();
        in_flight.back().first_sent = WallClock::now();
        next = &in_flight.back();  // deque: stays valid while the reader pops the front
      }
      // The reader cannot touch `next` before the broker has read all of it.
      if (!stream->Write(next->req)) broken = true;
    }
    stream->WritesDone();
    reader.join();
    grpc::Status s = stream->Finish();
    bool idle = false;
    {
      std::lock_guard<std::mutex> lock(async_mu);
      idle = in_flight.empty();
    }
    if (s.ok() && idle) {
      attempt = 0;
      continue;
    }
    const std::string what = "async publish (bus " + address + ", agent " + cred.agent + ")";
    Status err = s.ok() ? Unavailable(what + ": the stream ended with publishes unanswered")
                        : FromGrpc(s, what);
    if (!s.ok() && !Retryable(s.error_code())) {
      // The broker refused the first unanswered entry; the rest are resent.
      // UNAUTHENTICATED refuses everything sent with this credential.
      fail_front_entries(s.error_code() == grpc::StatusCode::UNAUTHENTICATED ? SIZE_MAX : 1, err);
      continue;
    }
    WallClock::time_point oldest;
    bool stopping = false;
    {
      std::lock_guard<std::mutex> lock(async_mu);
      oldest = in_flight.empty() ? WallClock::now() : in_flight.front().first_sent;
      stopping = async_stop;
    }
    if (stopping) {  // the client is being destroyed: no more retries
      std::vector<std::pair<AckCallback, Result<PublishAck>>> dropped;
      {
        std::lock_guard<std::mutex> lock(async_mu);
        for (auto& batch : async_queue) {
          for (auto& e : batch.entries) dropped.emplace_back(std::move(e.on_ack), err);
        }
        async_queue.clear();
      }
      fail_front_entries(SIZE_MAX, err.WithContext("client closing"));
      complete(dropped);
      continue;
    }
    if (WallClock::now() - oldest > options.call_timeout) {
      fail_front_entries(SIZE_MAX, err.WithContext("gave up after call_timeout"));
      attempt = 0;
      continue;
    }
    std::this_thread::sleep_for(Backoff(attempt++));
  }
}

Result<PublishAck> BusClient::Send(std::string_view to, std::string_view payload,
                                   const PublishOptions& opts) {
  AGENTRT_RETURN_IF_ERROR(CheckInline(payload, "send to agent " + std::string(to)));
  v1::SendRequest req;
  req.set_to(std::string(to));
  req.set_payload(std::string(payload));
  req.set_content_type(opts.content_type);
  req.set_publisher_id(impl_->publisher_id);
  const uint64_t seq = impl_->SequenceFor(opts);
  req.set_sequence(seq);
  v1::SendResponse resp;
  const auto deadline = WallClock::now() + opts.timeout.value_or(impl_->options.call_timeout);
  AGENTRT_RETURN_IF_ERROR(impl_->UnaryWithRetry(&v1::Bus::StubInterface::Send, req, &resp, deadline,
                                                "send to agent " + std::string(to)));
  return PublishAck{resp.offset(), resp.duplicate(), seq};
}

Result<BusReply> BusClient::Request(std::string_view to, std::string_view payload,
                                    std::chrono::milliseconds timeout,
                                    std::string_view content_type) {
  AGENTRT_RETURN_IF_ERROR(CheckInline(payload, "request to agent " + std::string(to)));
  v1::RequestRequest req;
  req.set_to(std::string(to));
  req.set_payload(std::string(payload));
  req.set_content_type(std::string(content_type));
  v1::RequestResponse resp;
  grpc::ClientContext ctx;
  impl_->Prepare(&ctx, WallClock::now() + timeout);
  // Not retried: the request may already sit in the receiver's inbox.
  grpc::Status s = impl_->stub->Request(&ctx, req, &resp);
  if (!s.ok()) {
    return FromGrpc(s, "request to agent " + std::string(to) + " (bus " + impl_->address +
                           ", agent " + impl_->cred.agent + ")");
  }
  return BusReply{std::move(*resp.mutable_payload()), std::move(*resp.mutable_content_type()),
                  std::move(*resp.mutable_replier())};
}

Status BusClient::Reply(uint64_t request_id, std::string_view payload,
                        std::string_view content_type) {
  AGENTRT_RETURN_IF_ERROR(CheckInline(payload, "reply to request " + std::to_string(request_id)));
  v1::ReplyRequest req;
  req.set_request_id(request_id);
  req.set_payload(std::string(payload));
  req.set_content_type(std::string(content_type));
  v1::ReplyResponse resp;
  grpc::ClientContext ctx;
  impl_->Prepare(&ctx, WallClock::now() + impl_->options.call_timeout);
  return FromGrpc(
      impl_->stub->Reply(&ctx, req, &resp),
      "reply to request " + std::to_string(request_id) + " (agent " + impl_->cred.agent + ")");
}

namespace {
void ToProto(const StartAt& from, v1::StartAt* out) {
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
}  // namespace

void BusClient::Impl::RunSubscription(const std::shared_ptr<BusClientSubscription>& sub) {
  const std::string name = sub->inbox ? InboxName(cred.agent) : sub->topic;
  auto emit = [&](SubscriptionEvent::Kind kind, Status status, int64_t offset,
                  int64_t earliest = 0) {
    if (sub->opts.on_event)
      sub->opts.on_event(SubscriptionEvent{kind, name, std::move(status), offset, earliest});
  };
  auto finish = [&](const Status& s) {
    {
      std::lock_guard<std::mutex> lock(sub->mu);
      sub->final_status = s;
    }
    emit(SubscriptionEvent::Kind::kFailed, s, sub->next_offset.load());
  };
  int attempt = 0;
  bool stream_once = false;  // this attempt without local files (one failed to read)
  v1::SubscribeResponse resp;
  for (;;) {
    grpc::ClientContext ctx;
    Prepare(&ctx, WallClock::now() + options.stream_deadline);
    {
      std::lock_guard<std::mutex> lock(sub->mu);
      if (sub->stop) return;
      sub->ctx = &ctx;
    }
    v1::StartAt start;
    if (sub->has_position.load()) {
      start.set_offset(sub->next_offset.load());
    } else {
      ToProto(sub->from, &start);
    }
    std::unique_ptr<grpc::ClientReaderInterface<v1::SubscribeResponse>> reader;
    if (sub->inbox) {
      v1::ReceiveRequest req;
      *req.mutable_start() = start;
      req.set_incarnation(sub->incarnation.load());
      req.set_max_batch_messages(sub->opts.max_batch_messages);
      req.set_local_files(sub->local_files && !stream_once);
      reader = stub->Receive(&ctx, req);
    } else {
      v1::SubscribeRequest req;
      req.set_topic(sub->topic);
      *req.mutable_start() = start;
      req.set_incarnation(sub->incarnation.load());
      req.set_max_batch_messages(sub->opts.max_batch_messages);
      req.set_local_files(sub->local_files && !stream_once);
      reader = stub->Subscribe(&ctx, req);
    }
    int64_t expired_earliest = -1;
    Reassembler assembler;  // a stream's large message: whole, or not at all
    Status broken;          // a stream that broke the protocol (or a CRC): read again
    while (reader->Read(&resp)) {
      if (resp.has_header()) {
        const auto& h = resp.header();
        if (h.broker_restarted()) {
          emit(SubscriptionEvent::Kind::kBrokerRestarted,
               DataLoss("the bus broker restarted and lost its logs; reading " + name +
                        " restarts at offset " + std::to_string(h.start_offset())),
               h.start_offset());
        }
        sub->incarnation.store(h.incarnation());
        sub->next_offset.store(h.start_offset());
        sub->has_position.store(true);
        attempt = 0;
        emit(SubscriptionEvent::Kind::kConnected, Status::Ok(), h.start_offset(),
             h.earliest_offset());
      }
      broken = assembler.Feed(resp, [&](const BusMessage& m) {
        sub->on_message(m);
        sub->next_offset.store(m.offset() + 1, std::memory_order_release);
      });
      if (!broken.ok()) {
        ctx.TryCancel();
        break;
      }
      if (resp.has_expired()) expired_earliest = resp.expired().earliest_offset();
    }
    grpc::Status s = reader->Finish();
    {
      std::lock_guard<std::mutex> lock(sub->mu);
      sub->ctx = nullptr;
      if (sub->stop) return;
    }
    stream_once = false;
    if (assembler.local_failed()) {
      // The file is not here: this stream has the broker send the bytes,
      // from the same message (which is then expired, if retention took it
      // meanwhile). The file holds other bytes: streamed from now on.
      if (!assembler.local_missing()) sub->local_files = false;
      stream_once = true;
      emit(SubscriptionEvent::Kind::kReconnecting, broken, sub->next_offset.load());
      continue;
    }
    if (broken.code() == StatusCode::kDataLoss) {
      // The broker's copy does not check: reading it again would not help.
      finish(broken.WithContext("subscription to " + name + " (bus " + address + ")"));
      return;
    }
    const std::string what =
        "subscription to " + name + " (bus " + address + ", agent " + cred.agent + ")";
    if (s.error_code() == grpc::StatusCode::OUT_OF_RANGE && expired_earliest >= 0) {
      if (!sub->opts.skip_expired) {
        finish(Status(StatusCode::kOutOfRange, what + ": " + s.error_message()));
        return;
      }
      emit(SubscriptionEvent::Kind::kOffsetExpired,
           Status(StatusCode::kOutOfRange, s.error_message()), sub->next_offset.load(),
           expired_earliest);
      sub->next_offset.store(expired_earliest);
      sub->has_position.store(true);  // resume there, not at the expired start again
      continue;
    }
    switch (s.error_code()) {
      case grpc::StatusCode::UNAUTHENTICATED:
      case grpc::StatusCode::PERMISSION_DENIED:
      case grpc::StatusCode::INVALID_ARGUMENT:
      case grpc::StatusCode::OUT_OF_RANGE:
      case grpc::StatusCode::UNIMPLEMENTED:
      case grpc::StatusCode::DATA_LOSS:  // the broker's copy is damaged: again would not help
        finish(FromGrpc(s, what));
        return;
      default:
        break;
    }
    // Transient (broker restart, closed stream, stream deadline): resume at next_offset.
    const auto wait = s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED
                          ? std::chrono::milliseconds(0)
                          : Backoff(attempt++);
    emit(SubscriptionEvent::Kind::kReconnecting, FromGrpc(s, what), sub->next_offset.load());
    std::unique_lock<std::mutex> lock(sub->mu);
    sub->cv.wait_for(lock, wait, [&] { return sub->stop; });
    if (sub->stop) return;
  }
}

Result<SubscriptionId> BusClient::Subscribe(std::string_view topic, StartAt from,
                                            MessageCallback on_message, SubscribeOptions opts) {
  if (!on_message)
    return InvalidArgument("subscribe to \"" + std::string(topic) + "\": no message callback");
  AGENTRT_RETURN_IF_ERROR(ValidateTopic(topic).WithContext("subscribe"));
  if (from.kind == StartAt::Kind::kOffset && from.offset < 0) {
    return InvalidArgument("subscribe to \"" + std::string(topic) + "\": negative start offset");
  }
  auto sub = std::make_shared<BusClientSubscription>();
  sub->topic = std::string(topic);
  return impl_->AddSubscription(std::move(sub), from, std::move(on_message), std::move(opts));
}

Result<SubscriptionId> BusClient::Receive(StartAt from, MessageCallback on_message,
                                          SubscribeOptions opts) {
  if (!on_message) return InvalidArgument("receive: no message callback");
  auto sub = std::make_shared<BusClientSubscription>();
  sub->inbox = true;
  return impl_->AddSubscription(std::move(sub), from, std::move(on_message), std::move(opts));
}

SubscriptionId BusClient::Impl::AddSubscription(std::shared_ptr<BusClientSubscription> sub,
                                                StartAt from, MessageCallback on_message,
                                                SubscribeOptions opts) {
  sub->from = from;
  if (from.kind == StartAt::Kind::kOffset) sub->incarnation.store(from.incarnation);
  sub->on_message = std::move(on_message);
  sub->opts = std::move(opts);
  sub->local_files = options.read_local_files;
  std::lock_guard<std::mutex> lock(subs_mu);
  sub->id = next_sub_id++;
  subs.emplace(sub->id, sub);
  sub->thread = std::thread([this, sub] { RunSubscription(sub); });
  return sub->id;
}

Status BusClient::Unsubscribe(SubscriptionId id) {
  std::shared_ptr<BusClientSubscription> sub;
  {
    std::lock_guard<std::mutex> lock(impl_->subs_mu);
    auto it = impl_->subs.find(id);
    if (it == impl_->subs.end())
      return NotFound("unsubscribe: no subscription " + std::to_string(id));
    sub = it->second;
    if (sub->thread.get_id() == std::this_thread::get_id()) {
      return FailedPrecondition("unsubscribe called from the subscription's own callback");
    }
    impl_->subs.erase(it);
  }
  {
    std::lock_guard<std::mutex> lock(sub->mu);
    sub->stop = true;
    if (sub->ctx != nullptr) sub->ctx->TryCancel();
  }
  sub->cv.notify_all();
  sub->thread.join();
  return Status::Ok();
}

Status BusClient::SubscriptionStatus(SubscriptionId id) const {
  std::shared_ptr<BusClientSubscription> sub;
  {
    std::lock_guard<std::mutex> lock(impl_->subs_mu);
    auto it = impl_->subs.find(id);
    if (it == impl_->subs.end()) return NotFound("no subscription " + std::to_string(id));
    sub = it->second;
  }
  std::lock_guard<std::mutex> lock(sub->mu);
  return sub->final_status;
}

std::map<std::string, int64_t> BusClient::SubscriptionOffsets() const {
  std::map<std::string, int64_t> out;
  std::lock_guard<std::mutex> lock(impl_->subs_mu);
  for (const auto& [id, sub] : impl_->subs) {
    if (!sub->has_position.load()) {
      // Not connected yet: an explicit start offset is still exact.
      if (sub->from.kind != StartAt::Kind::kOffset) continue;
      out[sub->inbox ? InboxName(impl_->cred.agent) : sub->topic] = sub->from.offset;
      continue;
    }
    out[sub->inbox ? InboxName(impl_->cred.agent) : sub->topic] =
        sub->next_offset.load(std::memory_order_acquire);
  }
  return out;
}

uint64_t BusClient::SubscriptionIncarnation() const {
  uint64_t common = 0;
  std::lock_guard<std::mutex> lock(impl_->subs_mu);
  for (const auto& [id, sub] : impl_->subs) {
    // Not connected yet: the incarnation given with its start offset, if any.
    const uint64_t here = sub->incarnation.load();
    if (here == 0) continue;
    if (common != 0 && here != common) return kMixedIncarnation;
    common = here;
  }
  return common;
}

Result<std::vector<BusMessage>> BusClient::Fetch(std::string_view topic, int64_t offset, int max,
                                                 std::chrono::milliseconds timeout) {
  if (max <= 0) return InvalidArgument("fetch: max must be > 0");
  v1::SubscribeRequest req;
  req.set_topic(std::string(topic));
  req.mutable_start()->set_offset(offset);
  req.set_max_batch_messages(std::min(max, 4096));
  grpc::ClientContext ctx;
  impl_->Prepare(&ctx, WallClock::now() + timeout);
  auto reader = impl_->stub->Subscribe(&ctx, req);
  std::vector<BusMessage> out;
  v1::SubscribeResponse resp;
  Reassembler assembler;
  Status broken;
  while (static_cast<int>(out.size()) < max && reader->Read(&resp)) {
    broken = assembler.Feed(resp, [&](const BusMessage& m) {
      if (static_cast<int>(out.size()) < max) out.push_back(m);
    });
    if (!broken.ok() || !out.empty()) break;  // return what the first batch brought
  }
  ctx.TryCancel();
  grpc::Status s = reader->Finish();
  if (!out.empty()) return out;
  AGENTRT_RETURN_IF_ERROR(broken.WithContext("fetch from topic \"" + std::string(topic) +
                                             "\" (bus " + impl_->address + ")"));
  if (s.ok() || s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED ||
      s.error_code() == grpc::StatusCode::CANCELLED) {
    return out;  // nothing arrived in time
  }
  return FromGrpc(s,
                  "fetch from topic \"" + std::string(topic) + "\" (bus " + impl_->address + ")");
}

Result<std::vector<BusTopicInfo>> BusClient::ListTopics() {
  v1::ListTopicsResponse resp;
  grpc::ClientContext ctx;
  impl_->Prepare(&ctx, WallClock::now() + impl_->options.call_timeout);
  AGENTRT_RETURN_IF_ERROR(FromGrpc(impl_->stub->ListTopics(&ctx, v1::ListTopicsRequest(), &resp),
                                   "list topics (bus " + impl_->address + ")"));
  return std::vector<BusTopicInfo>(resp.topics().begin(), resp.topics().end());
}

Result<BusStats> BusClient::Stats() {
  v1::StatsResponse r;
  grpc::ClientContext ctx;
  impl_->Prepare(&ctx, WallClock::now() + impl_->options.call_timeout);
  AGENTRT_RETURN_IF_ERROR(FromGrpc(impl_->stub->Stats(&ctx, v1::StatsRequest(), &r),
                                   "bus stats (" + impl_->address + ")"));
  BusStats s;
  s.incarnation = r.incarnation();
  s.topics = r.topics();
  s.messages_published = r.messages_published();
  s.duplicates_dropped = r.duplicates_dropped();
  s.messages_delivered = r.messages_delivered();
  s.messages_expired = r.messages_expired();
  s.retained_bytes = r.retained_bytes();
  s.active_streams = r.active_streams();
  s.rejected_unauthenticated = r.rejected_unauthenticated();
  s.rejected_permission = r.rejected_permission();
  s.rejected_invalid = r.rejected_invalid();
  s.log_sync_errors = r.log_sync_errors();
  return s;
}

}  // namespace agentrt
