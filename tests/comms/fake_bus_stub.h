// A fake of the broker behind the generated gRPC stub interface, for unit tests
// of BusClient (comms/bus_client_stub.h): topics and inboxes in memory with the
// broker's duplicate suppression, plus scripted faults — calls that fail before
// or after the broker stored them (a lost request / a lost answer), subscribe
// streams that break after N messages, an expired offset, a broker restart, an
// async publish stream that breaks mid-batch. Everything a test waits for is an
// event (a count reached, a message stored), each wait bounded.
//
// Thread-safe: BusClient calls the stub from its background threads.
#pragma once

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "comms/proto/bus.grpc.pb.h"

namespace agentrt::testing {

namespace v1 = ::agentrt::bus::v1;

// The broker's state, shared by the stub (owned by the client) and the test.
class FakeBus {
 public:
  static constexpr auto kWaitBound = std::chrono::seconds(5);

  // The next `n` unary publishes/sends fail with `code`: before the broker stores
  // them (`stored` false: a lost request) or after (`stored` true: a lost answer).
  void FailNextPublishes(int n, grpc::StatusCode code, bool stored) {
    std::lock_guard<std::mutex> lock(mu_);
    fail_n_ = n;
    fail_code_ = code;
    fail_after_store_ = stored;
  }
  // The next subscribe stream opened ends with UNAVAILABLE after delivering `n` messages.
  void BreakNextStreamAfter(int n) {
    std::lock_guard<std::mutex> lock(mu_);
    break_next_stream_after_ = n;
  }
  // The next async publish stream stores its `n`-th batch, then breaks without answering it.
  void BreakNextPublishStreamAtBatch(int n) {
    std::lock_guard<std::mutex> lock(mu_);
    break_publish_stream_at_ = n;
  }
  // Messages below `offset` of `topic` are gone (retention).
  void ExpireBelow(const std::string& topic, int64_t offset) {
    std::lock_guard<std::mutex> lock(mu_);
    topics_[topic].earliest = offset;
  }
  // A new incarnation: streams that resume with the old one are told the broker restarted.
  void Restart(uint64_t incarnation) {
    std::lock_guard<std::mutex> lock(mu_);
    incarnation_ = incarnation;
  }
  // Every open and later stream ends at once (so a client can be torn down).
  void Close() {
    std::lock_guard<std::mutex> lock(mu_);
    closed_ = true;
    cv_.notify_all();
  }

  // Stores a message as a publisher would (for tests that only subscribe).
  int64_t Append(const std::string& topic, const std::string& payload) {
    std::lock_guard<std::mutex> lock(mu_);
    return StoreLocked(topic, payload, "test", 0, 0);
  }

  std::vector<std::string> Payloads(const std::string& topic) {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<std::string> out;
    for (const auto& m : topics_[topic].log) out.push_back(m.payload());
    return out;
  }
  int publish_calls() {
    std::lock_guard<std::mutex> lock(mu_);
    return publish_calls_;
  }
  int streams_opened() {
    std::lock_guard<std::mutex> lock(mu_);
    return streams_opened_;
  }
  // The start offsets subscribe streams asked for, in order (-1 earliest, -2 latest).
  std::vector<int64_t> stream_starts() {
    std::lock_guard<std::mutex> lock(mu_);
    return stream_starts_;
  }
  // Waits until `topic` holds `n` messages; false after kWaitBound.
  bool WaitStored(const std::string& topic, size_t n) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, kWaitBound, [&] { return topics_[topic].log.size() >= n; });
  }

  // --- used by the stub ---------------------------------------------------

  grpc::Status Publish(const std::string& topic, const std::string& agent,
                       const v1::PublishRequest& req, v1::PublishResponse* resp) {
    std::lock_guard<std::mutex> lock(mu_);
    ++publish_calls_;
    if (fail_n_ > 0 && !fail_after_store_) {
      --fail_n_;
      return grpc::Status(fail_code_, "fake: lost request");
    }
    StoreOrDedupeLocked(topic, agent, req, resp);
    if (fail_n_ > 0) {
      --fail_n_;
      return grpc::Status(fail_code_, "fake: lost answer");
    }
    return grpc::Status::OK;
  }

  // One publish stream batch: stores it and answers, or (scripted) breaks after storing.
  bool StreamBatch(const std::string& agent, const v1::PublishBatchRequest& batch,
                   v1::PublishBatchResponse* resp) {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& m : batch.messages())
      StoreOrDedupeLocked(m.topic(), agent, m, resp->add_acks());
    if (break_publish_stream_at_ > 0 && --break_publish_stream_at_ == 0) return false;
    return true;
  }

  struct StreamPlan {
    int64_t next = 0;
    int break_after = -1;  // messages before the stream breaks; -1: never
    uint64_t incarnation = 0;
    bool restarted = false;
    bool expired = false;
    int64_t earliest = 0;
  };

  StreamPlan OpenStream(const std::string& topic, const v1::StartAt& start, uint64_t incarnation) {
    std::lock_guard<std::mutex> lock(mu_);
    ++streams_opened_;
    Topic& t = topics_[topic];
    const int64_t end = t.earliest + static_cast<int64_t>(t.log.size()) - t.dropped_front;
    StreamPlan plan;
    plan.incarnation = incarnation_;
    plan.earliest = t.earliest;
    plan.restarted = incarnation != 0 && incarnation != incarnation_;
    if (plan.restarted || start.has_earliest()) {
      plan.next = t.earliest;
    } else if (start.has_latest()) {
      plan.next = end;
    } else {
      plan.next = start.offset();
    }
    stream_starts_.push_back(start.has_earliest() ? -1 : start.has_latest() ? -2 : start.offset());
    plan.expired = plan.next < t.earliest;
    plan.break_after = std::exchange(break_next_stream_after_, -1);
    return plan;
  }

  // Waits for messages at `next` (bounded); false when the stream must end.
  bool NextMessages(const std::string& topic, int64_t next, int max, v1::SubscribeResponse* out) {
    std::unique_lock<std::mutex> lock(mu_);
    const bool ready = cv_.wait_for(lock, kWaitBound, [&] {
      return closed_ || static_cast<int64_t>(topics_[topic].log.size()) > next;
    });
    if (!ready || closed_) return false;
    const auto& log = topics_[topic].log;
    for (int64_t o = next; o < static_cast<int64_t>(log.size()) && max > 0; ++o, --max) {
      *out->add_messages() = log[static_cast<size_t>(o)];
    }
    return true;
  }

  bool closed() {
    std::lock_guard<std::mutex> lock(mu_);
    return closed_;
  }

  void Stats(v1::StatsResponse* resp) {
    std::lock_guard<std::mutex> lock(mu_);
    resp->set_incarnation(incarnation_);
    resp->set_topics(static_cast<int64_t>(topics_.size()));
  }

 private:
  struct Topic {
    std::vector<v1::Message> log;  // offset = index (earliest only hides the front)
    int64_t earliest = 0;
    int64_t dropped_front = 0;
  };

  int64_t StoreLocked(const std::string& topic, const std::string& payload,
                      const std::string& agent, uint64_t publisher_id, uint64_t sequence) {
    Topic& t = topics_[topic];
    v1::Message m;
    m.set_topic(topic);
    m.set_offset(static_cast<int64_t>(t.log.size()));
    m.set_payload(payload);
    m.set_publisher(agent);
    m.set_publisher_id(publisher_id);
    m.set_sequence(sequence);
    t.log.push_back(m);
    cv_.notify_all();
    return m.offset();
  }

  void StoreOrDedupeLocked(const std::string& topic, const std::string& agent,
                           const v1::PublishRequest& req, v1::PublishResponse* resp) {
    const auto key = std::make_tuple(agent, req.publisher_id(), req.sequence());
    auto it = seen_.find(key);
    if (it != seen_.end()) {
      resp->set_offset(it->second);
      resp->set_duplicate(true);
      return;
    }
    const int64_t offset =
        StoreLocked(topic, req.payload(), agent, req.publisher_id(), req.sequence());
    seen_[key] = offset;
    resp->set_offset(offset);
    resp->set_duplicate(false);
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, Topic> topics_;
  std::map<std::tuple<std::string, uint64_t, uint64_t>, int64_t> seen_;
  uint64_t incarnation_ = 1;
  int fail_n_ = 0;
  grpc::StatusCode fail_code_ = grpc::StatusCode::UNAVAILABLE;
  bool fail_after_store_ = false;
  int break_next_stream_after_ = -1;
  int break_publish_stream_at_ = 0;
  bool closed_ = false;
  int publish_calls_ = 0;
  int streams_opened_ = 0;
  std::vector<int64_t> stream_starts_;
};

// A Subscribe/Receive stream over FakeBus.
class FakeSubscribeReader final : public grpc::ClientReaderInterface<v1::SubscribeResponse> {
 public:
  FakeSubscribeReader(FakeBus* bus, std::string topic, const v1::StartAt& start,
                      uint64_t incarnation, int max_batch)
      : bus_(bus), topic_(std::move(topic)), max_batch_(max_batch > 0 ? max_batch : 64) {
    plan_ = bus_->OpenStream(topic_, start, incarnation);
  }

  bool Read(v1::SubscribeResponse* resp) override {
    resp->Clear();
    if (!header_sent_) {
      header_sent_ = true;
      if (plan_.expired) {
        resp->mutable_expired()->set_requested_offset(plan_.next);
        resp->mutable_expired()->set_earliest_offset(plan_.earliest);
        status_ = grpc::Status(grpc::StatusCode::OUT_OF_RANGE, "fake: offset expired");
        done_ = true;
        return true;
      }
      auto* h = resp->mutable_header();
      h->set_incarnation(plan_.incarnation);
      h->set_start_offset(plan_.next);
      h->set_earliest_offset(plan_.earliest);
      h->set_broker_restarted(plan_.restarted);
      return true;
    }
    if (done_) return false;
    if (plan_.break_after == 0) {
      status_ = grpc::Status(grpc::StatusCode::UNAVAILABLE, "fake: stream broken");
      return false;
    }
    const int max = plan_.break_after > 0 ? std::min(plan_.break_after, max_batch_) : max_batch_;
    if (!bus_->NextMessages(topic_, plan_.next, max, resp)) {
      status_ = grpc::Status(grpc::StatusCode::UNAVAILABLE, "fake: closed");
      return false;
    }
    plan_.next += resp->messages_size();
    if (plan_.break_after > 0) plan_.break_after -= resp->messages_size();
    return true;
  }
  grpc::Status Finish() override { return status_; }
  bool NextMessageSize(uint32_t* sz) override {
    *sz = 1 << 20;
    return true;
  }
  void WaitForInitialMetadata() override {}

 private:
  FakeBus* bus_;
  std::string topic_;
  int max_batch_;
  FakeBus::StreamPlan plan_;
  bool header_sent_ = false;
  bool done_ = false;
  grpc::Status status_ = grpc::Status::OK;
};

// The async publishers' bidirectional stream over FakeBus.
class FakePublishStream final
    : public grpc::ClientReaderWriterInterface<v1::PublishBatchRequest, v1::PublishBatchResponse> {
 public:
  FakePublishStream(FakeBus* bus, std::string agent) : bus_(bus), agent_(std::move(agent)) {}

  bool Write(const v1::PublishBatchRequest& batch, grpc::WriteOptions) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (broken_) return false;
    v1::PublishBatchResponse resp;
    if (!bus_->StreamBatch(agent_, batch, &resp)) {
      broken_ = true;  // stored, never answered
      cv_.notify_all();
      return true;
    }
    answers_.push_back(std::move(resp));
    cv_.notify_all();
    return true;
  }
  bool WritesDone() override {
    std::lock_guard<std::mutex> lock(mu_);
    writes_done_ = true;
    cv_.notify_all();
    return true;
  }
  bool Read(v1::PublishBatchResponse* resp) override {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait_for(lock, FakeBus::kWaitBound,
                 [&] { return !answers_.empty() || writes_done_ || broken_; });
    if (answers_.empty()) return false;
    *resp = std::move(answers_.front());
    answers_.pop_front();
    return true;
  }
  grpc::Status Finish() override {
    std::lock_guard<std::mutex> lock(mu_);
    return broken_ ? grpc::Status(grpc::StatusCode::UNAVAILABLE, "fake: publish stream broken")
                   : grpc::Status::OK;
  }
  bool NextMessageSize(uint32_t* sz) override {
    *sz = 1 << 20;
    return true;
  }
  void WaitForInitialMetadata() override {}

 private:
  FakeBus* bus_;
  std::string agent_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<v1::PublishBatchResponse> answers_;
  bool writes_done_ = false;
  bool broken_ = false;
};

class FakeBusStub final : public v1::Bus::StubInterface {
 public:
  explicit FakeBusStub(std::shared_ptr<FakeBus> bus) : bus_(std::move(bus)) {}

  grpc::Status Publish(grpc::ClientContext* ctx, const v1::PublishRequest& req,
                       v1::PublishResponse* resp) override {
    return bus_->Publish(req.topic(), Agent(ctx), req, resp);
  }
  grpc::Status Send(grpc::ClientContext* ctx, const v1::SendRequest& req,
                    v1::SendResponse* resp) override {
    v1::PublishRequest as_publish;
    as_publish.set_payload(req.payload());
    as_publish.set_publisher_id(req.publisher_id());
    as_publish.set_sequence(req.sequence());
    v1::PublishResponse ack;
    grpc::Status s = bus_->Publish("@inbox/" + req.to(), Agent(ctx), as_publish, &ack);
    resp->set_offset(ack.offset());
    resp->set_duplicate(ack.duplicate());
    return s;
  }
  grpc::Status Stats(grpc::ClientContext*, const v1::StatsRequest&,
                     v1::StatsResponse* resp) override {
    bus_->Stats(resp);
    return grpc::Status::OK;
  }
  grpc::Status PublishBatch(grpc::ClientContext*, const v1::PublishBatchRequest&,
                            v1::PublishBatchResponse*) override {
    return Unimplemented();
  }
  grpc::Status Request(grpc::ClientContext*, const v1::RequestRequest&,
                       v1::RequestResponse*) override {
    return Unimplemented();
  }
  grpc::Status Reply(grpc::ClientContext*, const v1::ReplyRequest&, v1::ReplyResponse*) override {
    return Unimplemented();
  }
  grpc::Status ListTopics(grpc::ClientContext*, const v1::ListTopicsRequest&,
                          v1::ListTopicsResponse*) override {
    return Unimplemented();
  }

 private:
  static grpc::Status Unimplemented() {
    return grpc::Status(grpc::StatusCode::UNIMPLEMENTED, "fake");
  }
  // The agent the client authenticates as (its x-agentrt-agent metadata is not
  // readable from a ClientContext, so the fake serves one agent: "me").
  static std::string Agent(grpc::ClientContext*) { return "me"; }

  grpc::ClientReaderWriterInterface<v1::PublishBatchRequest, v1::PublishBatchResponse>*
  PublishStreamRaw(grpc::ClientContext* ctx) override {
    return new FakePublishStream(bus_.get(), Agent(ctx));
  }
  grpc::ClientReaderInterface<v1::SubscribeResponse>* SubscribeRaw(
      grpc::ClientContext*, const v1::SubscribeRequest& req) override {
    return new FakeSubscribeReader(bus_.get(), req.topic(), req.start(), req.incarnation(),
                                   req.max_batch_messages());
  }
  grpc::ClientReaderInterface<v1::SubscribeResponse>* ReceiveRaw(
      grpc::ClientContext* ctx, const v1::ReceiveRequest& req) override {
    return new FakeSubscribeReader(bus_.get(), "@inbox/" + Agent(ctx), req.start(),
                                   req.incarnation(), req.max_batch_messages());
  }

  // Large publishes are tested against the real broker (bus_large_test).
  grpc::ClientWriterInterface<v1::PublishChunk>* PublishLargeRaw(grpc::ClientContext*,
                                                                 v1::PublishResponse*) override {
    return nullptr;
  }

  // The asynchronous API is not used by BusClient.
#define AGENTRT_FAKE_ASYNC_UNARY(Name, Req, Resp)                              \
  grpc::ClientAsyncResponseReaderInterface<v1::Resp>* Async##Name##Raw(        \
      grpc::ClientContext*, const v1::Req&, grpc::CompletionQueue*) override { \
    return nullptr;                                                            \
  }                                                                            \
  grpc::ClientAsyncResponseReaderInterface<v1::Resp>* PrepareAsync##Name##Raw( \
      grpc::ClientContext*, const v1::Req&, grpc::CompletionQueue*) override { \
    return nullptr;                                                            \
  }
  AGENTRT_FAKE_ASYNC_UNARY(Publish, PublishRequest, PublishResponse)
  AGENTRT_FAKE_ASYNC_UNARY(PublishBatch, PublishBatchRequest, PublishBatchResponse)
  AGENTRT_FAKE_ASYNC_UNARY(Send, SendRequest, SendResponse)
  AGENTRT_FAKE_ASYNC_UNARY(Request, RequestRequest, RequestResponse)
  AGENTRT_FAKE_ASYNC_UNARY(Reply, ReplyRequest, ReplyResponse)
  AGENTRT_FAKE_ASYNC_UNARY(ListTopics, ListTopicsRequest, ListTopicsResponse)
  AGENTRT_FAKE_ASYNC_UNARY(Stats, StatsRequest, StatsResponse)
#undef AGENTRT_FAKE_ASYNC_UNARY
  grpc::ClientAsyncReaderWriterInterface<v1::PublishBatchRequest, v1::PublishBatchResponse>*
  AsyncPublishStreamRaw(grpc::ClientContext*, grpc::CompletionQueue*, void*) override {
    return nullptr;
  }
  grpc::ClientAsyncReaderWriterInterface<v1::PublishBatchRequest, v1::PublishBatchResponse>*
  PrepareAsyncPublishStreamRaw(grpc::ClientContext*, grpc::CompletionQueue*) override {
    return nullptr;
  }
  grpc::ClientAsyncWriterInterface<v1::PublishChunk>* AsyncPublishLargeRaw(grpc::ClientContext*,
                                                                           v1::PublishResponse*,
                                                                           grpc::CompletionQueue*,
                                                                           void*) override {
    return nullptr;
  }
  grpc::ClientAsyncWriterInterface<v1::PublishChunk>* PrepareAsyncPublishLargeRaw(
      grpc::ClientContext*, v1::PublishResponse*, grpc::CompletionQueue*) override {
    return nullptr;
  }
  grpc::ClientAsyncReaderInterface<v1::SubscribeResponse>* AsyncSubscribeRaw(
      grpc::ClientContext*, const v1::SubscribeRequest&, grpc::CompletionQueue*, void*) override {
    return nullptr;
  }
  grpc::ClientAsyncReaderInterface<v1::SubscribeResponse>* PrepareAsyncSubscribeRaw(
      grpc::ClientContext*, const v1::SubscribeRequest&, grpc::CompletionQueue*) override {
    return nullptr;
  }
  grpc::ClientAsyncReaderInterface<v1::SubscribeResponse>* AsyncReceiveRaw(
      grpc::ClientContext*, const v1::ReceiveRequest&, grpc::CompletionQueue*, void*) override {
    return nullptr;
  }
  grpc::ClientAsyncReaderInterface<v1::SubscribeResponse>* PrepareAsyncReceiveRaw(
      grpc::ClientContext*, const v1::ReceiveRequest&, grpc::CompletionQueue*) override {
    return nullptr;
  }

  std::shared_ptr<FakeBus> bus_;
};

}  // namespace agentrt::testing
