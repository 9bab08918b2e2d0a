// BusClient subscriptions (Subscribe, Receive, Unsubscribe, their offsets) and
// the loop that reads each.
#include <chrono>
#include <optional>
#include <utility>

#include "comms/bus_client_internal.h"

namespace agentrt {

using namespace bus_client_internal;  // NOLINT(google-build-using-namespace): its own insides

// One subscription's reading loop: a stream from its position, its messages
// delivered in order, and on the stream's end a decision: read on (at once or
// after a backoff), or end with a final status.
class BusClient::Impl::SubscriptionReader {
 public:
  SubscriptionReader(Impl& impl, const std::shared_ptr<BusClientSubscription>& sub)
      : impl_(impl), sub_(sub), name_(sub->inbox ? InboxName(impl.cred.agent) : sub->topic) {}

  void Run() {
    for (;;) {
      grpc::ClientContext ctx;
      impl_.Prepare(&ctx, DeadlineClock::now() + impl_.options.stream_deadline);
      {
        std::lock_guard<std::mutex> lock(sub_->mu);
        if (sub_->stop) return;
        sub_->ctx = &ctx;
      }
      auto reader = Open(&ctx);
      Reassembler assembler;  // a stream's large message: whole, or not at all
      int64_t expired_earliest = -1;
      const Status broken = Read(*reader, &ctx, &assembler, &expired_earliest);
      const grpc::Status s = reader->Finish();
      {
        std::lock_guard<std::mutex> lock(sub_->mu);
        sub_->ctx = nullptr;
        if (sub_->stop) return;
      }
      const std::optional<std::chrono::milliseconds> wait =
          AfterStream(s, broken, assembler, expired_earliest);
      if (!wait) return;
      if (*wait == std::chrono::milliseconds::max()) continue;  // at once
      // The backoff, driving the reconnection meanwhile (Impl::Pause), in
      // slices short enough that Unsubscribe is heard at once.
      const auto until = std::chrono::steady_clock::now() + *wait;
      for (;;) {
        {
          std::lock_guard<std::mutex> lock(sub_->mu);
          if (sub_->stop) return;
        }
        const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
            until - std::chrono::steady_clock::now());
        if (left.count() <= 0) break;
        impl_.Pause(std::min(left, kStopCheck));
      }
    }
  }

 private:
  void Emit(SubscriptionEvent::Kind kind, Status status, int64_t offset, int64_t earliest = 0) {
    if (sub_->opts.on_event)
      sub_->opts.on_event(SubscriptionEvent{kind, name_, std::move(status), offset, earliest});
  }

  void Finish(const Status& s) {
    {
      std::lock_guard<std::mutex> lock(sub_->mu);
      sub_->final_status = s;
    }
    Emit(SubscriptionEvent::Kind::kFailed, s, sub_->next_offset.load());
  }

  // A stream from the subscription's position (or its StartAt, the first time).
  std::unique_ptr<grpc::ClientReaderInterface<v1::SubscribeResponse>> Open(
      grpc::ClientContext* ctx) {
    v1::StartAt start;
    if (sub_->has_position.load()) {
      start.set_offset(sub_->next_offset.load());
    } else {
      ToProto(sub_->from, &start);
    }
    if (!sub_->local_decided) {  // on the broker's node: its files, unless told otherwise
      if (std::optional<bool> here = impl_.OnBrokerNode()) {
        sub_->local_files = *here;
        sub_->local_decided = true;
      }
    }
    const bool local_files = sub_->local_files && !stream_once_;
    stream_once_ = false;
    if (sub_->inbox) {
      v1::ReceiveRequest req;
      *req.mutable_start() = start;
      req.set_incarnation(sub_->incarnation.load());
      req.set_max_batch_messages(sub_->opts.max_batch_messages);
      req.set_local_files(local_files);
      return impl_.stub->Receive(ctx, req);
    }
    v1::SubscribeRequest req;
    req.set_topic(sub_->topic);
    *req.mutable_start() = start;
    req.set_incarnation(sub_->incarnation.load());
    req.set_max_batch_messages(sub_->opts.max_batch_messages);
    req.set_local_files(local_files);
    return impl_.stub->Subscribe(ctx, req);
  }

  // Delivers the stream's messages; a stream that broke the protocol (or a
  // CRC) is cancelled and its reason returned.
  Status Read(grpc::ClientReaderInterface<v1::SubscribeResponse>& reader, grpc::ClientContext* ctx,
              Reassembler* assembler, int64_t* expired_earliest) {
    while (reader.Read(&resp_)) {
      if (resp_.has_header()) {
        const auto& h = resp_.header();
        if (h.broker_restarted()) {
          Emit(SubscriptionEvent::Kind::kBrokerRestarted,
               DataLoss("the bus broker restarted and lost its logs; reading " + name_ +
                        " restarts at offset " + std::to_string(h.start_offset())),
               h.start_offset());
        }
        sub_->incarnation.store(h.incarnation());
        sub_->next_offset.store(h.start_offset());
        sub_->has_position.store(true);
        attempt_ = 0;
        Emit(SubscriptionEvent::Kind::kConnected, Status::Ok(), h.start_offset(),
             h.earliest_offset());
      }
      Status broken = assembler->Feed(resp_, [&](const BusMessage& m) {
        sub_->on_message(m);
        sub_->next_offset.store(m.offset() + 1, std::memory_order_release);
      });
      if (!broken.ok()) {
        ctx->TryCancel();
        return broken;
      }
      if (resp_.has_expired()) *expired_earliest = resp_.expired().earliest_offset();
    }
    return Status::Ok();
  }

  // After a stream ended: nullopt to end the subscription (its final status
  // set), milliseconds::max() to read again at once, else the wait first.
  std::optional<std::chrono::milliseconds> AfterStream(const grpc::Status& s, const Status& broken,
                                                       const Reassembler& assembler,
                                                       int64_t expired_earliest) {
    constexpr auto kAtOnce = std::chrono::milliseconds::max();
    if (assembler.local_failed()) {
      // The file is not here: this stream has the broker send the bytes,
      // from the same message (which is then expired, if retention took it
      // meanwhile). The file holds other bytes: streamed from now on.
      if (!assembler.local_missing()) sub_->local_files = false;
      stream_once_ = true;
      Emit(SubscriptionEvent::Kind::kReconnecting, broken, sub_->next_offset.load());
      return kAtOnce;
    }
    if (broken.code() == StatusCode::kDataLoss) {
      // The broker's copy does not check: reading it again would not help.
      Finish(broken.WithContext("subscription to " + name_ + " (bus " + impl_.address + ")"));
      return std::nullopt;
    }
    const std::string what =
        "subscription to " + name_ + " (bus " + impl_.address + ", agent " + impl_.cred.agent + ")";
    if (s.error_code() == grpc::StatusCode::OUT_OF_RANGE && expired_earliest >= 0) {
      if (!sub_->opts.skip_expired) {
        Finish(Status(StatusCode::kOutOfRange, what + ": " + s.error_message()));
        return std::nullopt;
      }
      Emit(SubscriptionEvent::Kind::kOffsetExpired,
           Status(StatusCode::kOutOfRange, s.error_message()), sub_->next_offset.load(),
           expired_earliest);
      sub_->next_offset.store(expired_earliest);
      sub_->has_position.store(true);  // resume there, not at the expired start again
      return kAtOnce;
    }
    switch (s.error_code()) {
      case grpc::StatusCode::UNAUTHENTICATED:
      case grpc::StatusCode::PERMISSION_DENIED:
      case grpc::StatusCode::INVALID_ARGUMENT:
      case grpc::StatusCode::OUT_OF_RANGE:
      case grpc::StatusCode::UNIMPLEMENTED:
      case grpc::StatusCode::DATA_LOSS:  // the broker's copy is damaged: again would not help
        Finish(FromGrpc(s, what));
        return std::nullopt;
      default:
        break;
    }
    // Transient (broker restart, closed stream, stream deadline): resume at next_offset.
    const auto wait = s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED
                          ? std::chrono::milliseconds(0)
                          : impl_.Backoff(attempt_++);
    Emit(SubscriptionEvent::Kind::kReconnecting, FromGrpc(s, what), sub_->next_offset.load());
    return wait;
  }

  static constexpr std::chrono::milliseconds kStopCheck{50};

  Impl& impl_;
  const std::shared_ptr<BusClientSubscription> sub_;
  const std::string name_;
  int attempt_ = 0;
  bool stream_once_ = false;  // the next stream without local files (one failed to read)
  v1::SubscribeResponse resp_;
};

void BusClient::Impl::RunSubscription(const std::shared_ptr<BusClientSubscription>& sub) {
  SubscriptionReader(*this, sub).Run();
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
  sub->local_decided = options.read_local_files;
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

}  // namespace agentrt
