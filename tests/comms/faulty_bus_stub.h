// A real broker behind the generated gRPC stub interface, with scripted faults
// around it, for unit tests of BusClient (comms/bus_client_stub.h). The broker
// is agentrt's own (a BusServer on loopback with an open ACL); the stub passes
// every RPC, synchronous or asynchronous, to a real stub of it and adds only
// what the network would do: calls that fail before or after the broker stored
// them (a lost request / a lost answer), subscribe streams that break after N
// messages, an async publish stream that breaks after storing a batch, and a
// broker restart (the next incarnation, empty, as a memory broker restarts).
// Expired offsets come from the broker's own retention (BrokerOptions).
//
// Thread-safe: BusClient calls the stub from its background threads.
#pragma once

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "comms/auth.h"
#include "comms/bus_server.h"
#include "comms/proto/bus.grpc.pb.h"
#include "tests/common/wait_for.h"

namespace agentrt::testing {

namespace v1 = ::agentrt::bus::v1;

inline constexpr char kFaultyBusSecret[] = "faulty-bus-test-secret-0123456789";

// A credential of `agent` on a FaultyBus.
inline Credential FaultyBusCredential(const std::string& agent) {
  return {agent, DeriveAgentToken(kFaultyBusSecret, agent)};
}

class FaultyBus {
 public:
  static constexpr auto kWaitBound = std::chrono::seconds(10);

  explicit FaultyBus(BrokerOptions broker = {}) : broker_(std::move(broker)) { StartBroker(1); }

  // The next `n` unary publishes/sends fail with `code`: before the broker stores
  // them (`stored` false: a lost request) or after (`stored` true: a lost answer).
  void FailNextPublishes(int n, grpc::StatusCode code, bool stored) {
    std::lock_guard<std::mutex> lock(mu_);
    fail_n_ = n;
    fail_code_ = code;
    fail_after_store_ = stored;
  }
  // The next subscribe or receive stream ends with UNAVAILABLE after delivering `n` messages.
  void BreakNextStreamAfter(int n) {
    std::lock_guard<std::mutex> lock(mu_);
    break_stream_after_ = n;
  }
  // The next async publish stream has its `n`-th batch stored, then breaks without
  // passing the answer on.
  void BreakNextPublishStreamAtBatch(int n) {
    std::lock_guard<std::mutex> lock(mu_);
    break_publish_stream_at_ = n;
  }
  // Spool calls from the `n`-th (counted from 1) on wait until ReleaseSpool()
  // (at most kWaitBound): the test acts while the client awaits the answer.
  void HoldSpoolFrom(int n) {
    std::lock_guard<std::mutex> lock(mu_);
    hold_spool_from_ = n;
  }
  void ReleaseSpool() {
    std::lock_guard<std::mutex> lock(mu_);
    hold_spool_from_ = 0;
    cv_.notify_all();
  }
  int spool_calls() {
    std::lock_guard<std::mutex> lock(mu_);
    return spool_calls_;
  }
  // Whether `n` Spool calls arrived within kWaitBound.
  bool WaitSpoolCalls(int n) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, kWaitBound, [&] { return spool_calls_ >= n; });
  }
  // A Spool call: counted, then held as HoldSpoolFrom says.
  void OnSpool() {
    std::unique_lock<std::mutex> lock(mu_);
    const int call = ++spool_calls_;
    cv_.notify_all();
    cv_.wait_for(lock, kWaitBound,
                 [&] { return hold_spool_from_ <= 0 || call < hold_spool_from_; });
  }
  // The broker goes down (open streams end with UNAVAILABLE) and comes back
  // empty under the next incarnation, as a broker without a durable log does.
  void Restart() {
    std::lock_guard<std::mutex> lock(mu_);
    const uint64_t next = server_->incarnation() + 1;
    server_->Shutdown();
    server_.reset();
    StartBrokerLocked(next);
  }

  // Publishes as agent "test" (for tests that only subscribe); returns the offset.
  int64_t Append(const std::string& topic, const std::string& payload) {
    v1::PublishRequest req;
    req.set_topic(topic);
    req.set_payload(payload);
    v1::PublishResponse resp;
    grpc::ClientContext ctx;
    As(&ctx, "test");
    const grpc::Status s = Real()->Publish(&ctx, req, &resp);
    INFO(s.error_message());
    REQUIRE(s.ok());
    return resp.offset();
  }

  // Every payload `topic` (or "@inbox/<agent>") holds, in offset order.
  std::vector<std::string> Payloads(const std::string& topic) {
    const std::string inbox = "@inbox/";
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + kWaitBound);
    std::unique_ptr<grpc::ClientReaderInterface<v1::SubscribeResponse>> reader;
    v1::StartAt earliest;
    earliest.set_earliest(true);
    if (topic.rfind(inbox, 0) == 0) {
      As(&ctx, topic.substr(inbox.size()));
      v1::ReceiveRequest req;
      *req.mutable_start() = earliest;
      reader = Real()->Receive(&ctx, req);
    } else {
      As(&ctx, "test");
      v1::SubscribeRequest req;
      req.set_topic(topic);
      *req.mutable_start() = earliest;
      reader = Real()->Subscribe(&ctx, req);
    }
    v1::SubscribeResponse resp;
    REQUIRE(reader->Read(&resp));
    REQUIRE(resp.has_header());
    const int64_t want = resp.header().end_offset() - resp.header().start_offset();
    std::vector<std::string> out;
    while (static_cast<int64_t>(out.size()) < want && reader->Read(&resp)) {
      for (const v1::Message& m : resp.messages()) out.push_back(m.payload());
    }
    ctx.TryCancel();
    reader->Finish().ok();  // CANCELLED, by the line above
    REQUIRE(static_cast<int64_t>(out.size()) == want);
    return out;
  }

  BusStats Stats() const {
    std::lock_guard<std::mutex> lock(mu_);
    return server_->Stats();
  }
  int publish_calls() const {
    std::lock_guard<std::mutex> lock(mu_);
    return publish_calls_;
  }
  // Where each subscribe/receive stream asked to start: an offset, -1 earliest, -2 latest.
  std::vector<int64_t> stream_starts() const {
    std::lock_guard<std::mutex> lock(mu_);
    return stream_starts_;
  }

  // How many files are in the broker's spool (a publisher's file left behind
  // shows here).
  int SpoolFiles() {
    v1::SpoolRequest req;
    v1::SpoolResponse resp;
    grpc::ClientContext ctx;
    As(&ctx, "test");
    const grpc::Status s = Real()->Spool(&ctx, req, &resp);
    INFO(s.error_message());
    REQUIRE(s.ok());
    int n = 0;
    for (const auto& e : std::filesystem::directory_iterator(resp.dir()))
      n += e.path().extension() == ".part" ? 1 : 0;
    return n;
  }

  // For the stub: the broker's current stub, and the faults each call draws.
  std::shared_ptr<v1::Bus::StubInterface> Real() const {
    std::lock_guard<std::mutex> lock(mu_);
    return stub_;
  }
  // A unary publish or send: false, or true with the fault it suffers.
  bool DrawPublishFault(grpc::StatusCode* code, bool* after_store) {
    std::lock_guard<std::mutex> lock(mu_);
    ++publish_calls_;
    if (fail_n_ <= 0) return false;
    --fail_n_;
    *code = fail_code_;
    *after_store = fail_after_store_;
    return true;
  }
  // A subscribe or receive stream from `start`: after how many messages it breaks (-1 never).
  int DrawStreamBreak(const v1::StartAt& start) {
    std::lock_guard<std::mutex> lock(mu_);
    stream_starts_.push_back(start.has_earliest() ? -1 : start.has_latest() ? -2 : start.offset());
    return std::exchange(break_stream_after_, -1);
  }
  // An async publish stream: at which batch it breaks (-1 never). Counted
  // open until the client drops it (PublishStreamClosed).
  int DrawPublishStreamBreak() {
    std::lock_guard<std::mutex> lock(mu_);
    ++open_publish_streams_;
    return std::exchange(break_publish_stream_at_, -1);
  }
  void PublishStreamClosed() {
    std::lock_guard<std::mutex> lock(mu_);
    --open_publish_streams_;
  }
  // Async publish batches written as packed entries.
  void CountPublishBatch(bool packed) {
    std::lock_guard<std::mutex> lock(mu_);
    if (packed) ++packed_batches_;
  }
  int packed_batches() const {
    std::lock_guard<std::mutex> lock(mu_);
    return packed_batches_;
  }
  // From now on the broker acts as one from before packed entries: it reads
  // a packed batch as an empty one (which it refuses) and never says it
  // takes them.
  void ActAsBrokerBeforePackedEntries() {
    std::lock_guard<std::mutex> lock(mu_);
    before_packed_entries_ = true;
  }
  bool before_packed_entries() const {
    std::lock_guard<std::mutex> lock(mu_);
    return before_packed_entries_;
  }
  // Waits (bounded) until the client has no async publish stream open: the
  // next batch goes on a new one.
  bool WaitPublishStreamsClosed() {
    return WaitFor([this] {
      std::lock_guard<std::mutex> lock(mu_);
      return open_publish_streams_ == 0;
    });
  }

 private:
  void StartBroker(uint64_t incarnation) {
    std::lock_guard<std::mutex> lock(mu_);
    StartBrokerLocked(incarnation);
  }
  void StartBrokerLocked(uint64_t incarnation) {
    BusServerOptions o;
    o.host = "127.0.0.1";
    o.broker = broker_;
    o.incarnation = incarnation;
    BusAcl acl;
    acl.open = true;
    auto server = BusServer::Start(o, kFaultyBusSecret, std::move(acl));
    INFO(server.status().ToString());
    REQUIRE(server.ok());
    server_ = std::move(server).value();
    stub_ = v1::Bus::NewStub(
        grpc::CreateChannel(server_->address(), grpc::InsecureChannelCredentials()));
  }
  static void As(grpc::ClientContext* ctx, const std::string& agent) {
    const Credential c = FaultyBusCredential(agent);
    ctx->AddMetadata("x-agentrt-agent", c.agent);
    ctx->AddMetadata("x-agentrt-token", c.token);
  }

  const BrokerOptions broker_;
  mutable std::mutex mu_;
  std::unique_ptr<BusServer> server_;
  std::shared_ptr<v1::Bus::StubInterface> stub_;
  int fail_n_ = 0;
  grpc::StatusCode fail_code_ = grpc::StatusCode::OK;
  bool fail_after_store_ = false;
  int break_stream_after_ = -1;
  int break_publish_stream_at_ = -1;
  int open_publish_streams_ = 0;
  int packed_batches_ = 0;
  bool before_packed_entries_ = false;
  int publish_calls_ = 0;
  std::vector<int64_t> stream_starts_;
  std::condition_variable cv_;  // Spool calls and their hold
  int spool_calls_ = 0;
  int hold_spool_from_ = 0;  // 0: none held
};

// A real stream of kind `Interface` that the test can break: from then on it
// reads and writes nothing and finishes UNAVAILABLE, as a cut connection does.
// It holds the stub, so the channel outlives the stream.
template <typename Interface>
class BreakableStream : public Interface {
 public:
  grpc::Status Finish() override {
    grpc::Status real = real_->Finish();
    if (!broken_) return real;
    return grpc::Status(grpc::StatusCode::UNAVAILABLE, "stream broken by the test");
  }
  bool NextMessageSize(uint32_t* sz) override { return real_->NextMessageSize(sz); }
  void WaitForInitialMetadata() override { real_->WaitForInitialMetadata(); }

 protected:
  BreakableStream(std::shared_ptr<v1::Bus::StubInterface> stub, grpc::ClientContext* ctx,
                  std::unique_ptr<Interface> real)
      : stub_(std::move(stub)), ctx_(ctx), real_(std::move(real)) {}
  void Break() {
    broken_ = true;
    ctx_->TryCancel();
  }

  std::shared_ptr<v1::Bus::StubInterface> stub_;
  grpc::ClientContext* ctx_;
  std::unique_ptr<Interface> real_;
  // Set by the reading thread, read by a writing one (an async publish stream).
  std::atomic<bool> broken_{false};
};

// A subscribe/receive stream that ends after `remaining` messages (never when negative).
class BreakingReader final
    : public BreakableStream<grpc::ClientReaderInterface<v1::SubscribeResponse>> {
 public:
  BreakingReader(std::shared_ptr<v1::Bus::StubInterface> stub, grpc::ClientContext* ctx,
                 std::unique_ptr<grpc::ClientReaderInterface<v1::SubscribeResponse>> real,
                 int remaining)
      : BreakableStream(std::move(stub), ctx, std::move(real)), remaining_(remaining) {}

  bool Read(v1::SubscribeResponse* resp) override {
    if (broken_ || !real_->Read(resp)) return false;
    if (remaining_ >= 0 && resp->messages_size() > 0 && resp->messages_size() >= remaining_) {
      while (resp->messages_size() > remaining_) resp->mutable_messages()->RemoveLast();
      Break();
      return resp->messages_size() > 0;
    }
    if (remaining_ >= 0) remaining_ -= resp->messages_size();
    return true;
  }

 private:
  int remaining_;
};

using PublishBatchStream =
    grpc::ClientReaderWriterInterface<v1::PublishBatchRequest, v1::PublishBatchResponse>;

// An async publish stream that breaks after the broker answered batch `at`
// (never when negative): the batch is stored, its answer lost.
class BreakingPublishStream final : public BreakableStream<PublishBatchStream> {
 public:
  BreakingPublishStream(std::shared_ptr<v1::Bus::StubInterface> stub, grpc::ClientContext* ctx,
                        std::unique_ptr<PublishBatchStream> real, std::shared_ptr<FaultyBus> bus)
      : BreakableStream(std::move(stub), ctx, std::move(real)),
        bus_(std::move(bus)),
        at_(bus_->DrawPublishStreamBreak()) {}
  ~BreakingPublishStream() override { bus_->PublishStreamClosed(); }
  BreakingPublishStream(const BreakingPublishStream&) = delete;
  BreakingPublishStream& operator=(const BreakingPublishStream&) = delete;

  bool Write(const v1::PublishBatchRequest& batch, grpc::WriteOptions options) override {
    bus_->CountPublishBatch(batch.has_packed());
    if (batch.has_packed() && bus_->before_packed_entries()) {
      v1::PublishBatchRequest unknown_field_dropped = batch;
      unknown_field_dropped.clear_packed();
      return !broken_ && real_->Write(unknown_field_dropped, options);
    }
    return !broken_ && real_->Write(batch, options);
  }
  bool WritesDone() override { return !broken_ && real_->WritesDone(); }
  bool Read(v1::PublishBatchResponse* resp) override {
    if (broken_ || !real_->Read(resp)) return false;
    if (bus_->before_packed_entries()) resp->clear_packed_entries();
    if (++answered_ == at_) {
      Break();
      return false;
    }
    return true;
  }

 private:
  const std::shared_ptr<FaultyBus> bus_;
  const int at_;
  int answered_ = 0;
};

// The unary RPCs the test scripts no faults for (Publish, Send and AdoptLarge
// it does; Spool it counts and may hold).
#define AGENTRT_FAULTLESS_UNARY(X)                           \
  X(PublishBatch, PublishBatchRequest, PublishBatchResponse) \
  X(Request, RequestRequest, RequestResponse)                \
  X(Reply, ReplyRequest, ReplyResponse)                      \
  X(ListTopics, ListTopicsRequest, ListTopicsResponse)       \
  X(Stats, StatsRequest, StatsResponse)

// The stub a BusClient under test is given: every RPC goes to the FaultyBus's
// real broker, through the faults the test scripted.
class FaultyBusStub final : public v1::Bus::StubInterface {
 public:
  explicit FaultyBusStub(std::shared_ptr<FaultyBus> bus) : bus_(std::move(bus)) {}

  grpc::Status Publish(grpc::ClientContext* ctx, const v1::PublishRequest& req,
                       v1::PublishResponse* resp) override {
    return Unary(ctx, req, resp, &v1::Bus::StubInterface::Publish);
  }
  grpc::Status Send(grpc::ClientContext* ctx, const v1::SendRequest& req,
                    v1::SendResponse* resp) override {
    return Unary(ctx, req, resp, &v1::Bus::StubInterface::Send);
  }
  // Counted, and held as the test says (FaultyBus::HoldSpoolFrom).
  grpc::Status Spool(grpc::ClientContext* ctx, const v1::SpoolRequest& req,
                     v1::SpoolResponse* resp) override {
    bus_->OnSpool();
    return bus_->Real()->Spool(ctx, req, resp);
  }
  // A large publish through the broker's spool: a publish like the others.
  grpc::Status AdoptLarge(grpc::ClientContext* ctx, const v1::AdoptRequest& req,
                          v1::PublishResponse* resp) override {
    return Unary(ctx, req, resp, &v1::Bus::StubInterface::AdoptLarge);
  }
#define AGENTRT_PASS_UNARY(Name, Req, Resp)                                                  \
  grpc::Status Name(grpc::ClientContext* ctx, const v1::Req& req, v1::Resp* resp) override { \
    return bus_->Real()->Name(ctx, req, resp);                                               \
  }
  AGENTRT_FAULTLESS_UNARY(AGENTRT_PASS_UNARY)
#undef AGENTRT_PASS_UNARY

 private:
  template <typename Req, typename Resp, typename Call>
  grpc::Status Unary(grpc::ClientContext* ctx, const Req& req, Resp* resp, Call call) {
    grpc::StatusCode code = grpc::StatusCode::OK;
    bool after_store = false;
    const bool fault = bus_->DrawPublishFault(&code, &after_store);
    if (fault && !after_store) return grpc::Status(code, "request lost by the test");
    const grpc::Status s = (bus_->Real().get()->*call)(ctx, req, resp);
    if (fault && s.ok()) return grpc::Status(code, "answer lost by the test");
    return s;
  }

  PublishBatchStream* PublishStreamRaw(grpc::ClientContext* ctx) override {
    auto real = bus_->Real();
    auto stream = real->PublishStream(ctx);
    return new BreakingPublishStream(std::move(real), ctx, std::move(stream), bus_);
  }
  grpc::ClientReaderInterface<v1::SubscribeResponse>* SubscribeRaw(
      grpc::ClientContext* ctx, const v1::SubscribeRequest& req) override {
    auto real = bus_->Real();
    auto stream = real->Subscribe(ctx, req);
    return Breaking(std::move(real), ctx, std::move(stream), req.start());
  }
  grpc::ClientReaderInterface<v1::SubscribeResponse>* ReceiveRaw(
      grpc::ClientContext* ctx, const v1::ReceiveRequest& req) override {
    auto real = bus_->Real();
    auto stream = real->Receive(ctx, req);
    return Breaking(std::move(real), ctx, std::move(stream), req.start());
  }
  grpc::ClientReaderInterface<v1::SubscribeResponse>* Breaking(
      std::shared_ptr<v1::Bus::StubInterface> real, grpc::ClientContext* ctx,
      std::unique_ptr<grpc::ClientReaderInterface<v1::SubscribeResponse>> stream,
      const v1::StartAt& start) {
    return new BreakingReader(std::move(real), ctx, std::move(stream),
                              bus_->DrawStreamBreak(start));
  }
  grpc::ClientWriterInterface<v1::PublishChunk>* PublishLargeRaw(
      grpc::ClientContext* ctx, v1::PublishResponse* resp) override {
    return bus_->Real()->PublishLarge(ctx, resp).release();
  }

  // The asynchronous API: passed through untouched (BusClient does not use it).
#define AGENTRT_PASS_ASYNC_UNARY(Name, Req, Resp)                                         \
  grpc::ClientAsyncResponseReaderInterface<v1::Resp>* Async##Name##Raw(                   \
      grpc::ClientContext* ctx, const v1::Req& req, grpc::CompletionQueue* cq) override { \
    return bus_->Real()->Async##Name(ctx, req, cq).release();                             \
  }                                                                                       \
  grpc::ClientAsyncResponseReaderInterface<v1::Resp>* PrepareAsync##Name##Raw(            \
      grpc::ClientContext* ctx, const v1::Req& req, grpc::CompletionQueue* cq) override { \
    return bus_->Real()->PrepareAsync##Name(ctx, req, cq).release();                      \
  }
  AGENTRT_PASS_ASYNC_UNARY(Publish, PublishRequest, PublishResponse)
  AGENTRT_PASS_ASYNC_UNARY(Send, SendRequest, SendResponse)
  AGENTRT_PASS_ASYNC_UNARY(AdoptLarge, AdoptRequest, PublishResponse)
  AGENTRT_PASS_ASYNC_UNARY(Spool, SpoolRequest, SpoolResponse)
  AGENTRT_FAULTLESS_UNARY(AGENTRT_PASS_ASYNC_UNARY)
#undef AGENTRT_PASS_ASYNC_UNARY
#define AGENTRT_PASS_ASYNC_READ(Name, Req)                                                \
  grpc::ClientAsyncReaderInterface<v1::SubscribeResponse>* Async##Name##Raw(              \
      grpc::ClientContext* ctx, const v1::Req& req, grpc::CompletionQueue* cq, void* tag) \
      override {                                                                          \
    return bus_->Real()->Async##Name(ctx, req, cq, tag).release();                        \
  }                                                                                       \
  grpc::ClientAsyncReaderInterface<v1::SubscribeResponse>* PrepareAsync##Name##Raw(       \
      grpc::ClientContext* ctx, const v1::Req& req, grpc::CompletionQueue* cq) override { \
    return bus_->Real()->PrepareAsync##Name(ctx, req, cq).release();                      \
  }
  AGENTRT_PASS_ASYNC_READ(Subscribe, SubscribeRequest)
  AGENTRT_PASS_ASYNC_READ(Receive, ReceiveRequest)
#undef AGENTRT_PASS_ASYNC_READ
  grpc::ClientAsyncReaderWriterInterface<v1::PublishBatchRequest, v1::PublishBatchResponse>*
  AsyncPublishStreamRaw(grpc::ClientContext* ctx, grpc::CompletionQueue* cq, void* tag) override {
    return bus_->Real()->AsyncPublishStream(ctx, cq, tag).release();
  }
  grpc::ClientAsyncReaderWriterInterface<v1::PublishBatchRequest, v1::PublishBatchResponse>*
  PrepareAsyncPublishStreamRaw(grpc::ClientContext* ctx, grpc::CompletionQueue* cq) override {
    return bus_->Real()->PrepareAsyncPublishStream(ctx, cq).release();
  }
  grpc::ClientAsyncWriterInterface<v1::PublishChunk>* AsyncPublishLargeRaw(
      grpc::ClientContext* ctx, v1::PublishResponse* resp, grpc::CompletionQueue* cq,
      void* tag) override {
    return bus_->Real()->AsyncPublishLarge(ctx, resp, cq, tag).release();
  }
  grpc::ClientAsyncWriterInterface<v1::PublishChunk>* PrepareAsyncPublishLargeRaw(
      grpc::ClientContext* ctx, v1::PublishResponse* resp, grpc::CompletionQueue* cq) override {
    return bus_->Real()->PrepareAsyncPublishLarge(ctx, resp, cq).release();
  }

  std::shared_ptr<FaultyBus> bus_;
};
#undef AGENTRT_FAULTLESS_UNARY

}  // namespace agentrt::testing
