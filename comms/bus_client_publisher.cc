// BusClient::PublishAsync and Flush, and the loop that sends their batches.
#include <cstdint>
#include <deque>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "comms/bus_client_internal.h"

namespace agentrt {

using namespace bus_client_internal;  // NOLINT(google-build-using-namespace): its own insides

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
class BusClient::Impl::AsyncPublisher {
 public:
  explicit AsyncPublisher(Impl& impl) : impl_(impl) {}

  void Run() {
    int attempt = 0;
    for (;;) {
      {
        std::unique_lock<std::mutex> lock(impl_.async_mu);
        impl_.async_cv.wait(lock, [&] {
          return !impl_.async_queue.empty() || !in_flight_.empty() || impl_.async_stop;
        });
        if (impl_.async_queue.empty() && in_flight_.empty()) return;  // stopping, nothing left
      }
      const grpc::Status s = RunStream();
      bool idle = false;
      {
        std::lock_guard<std::mutex> lock(impl_.async_mu);
        idle = in_flight_.empty();
      }
      if (s.ok() && idle) {
        attempt = 0;
        continue;
      }
      AfterBrokenStream(s, &attempt);
    }
  }

 private:
  static constexpr size_t kMaxInFlight = 8;
  static constexpr size_t kMaxSpareBatches = 2 * kMaxInFlight;
  using Results = std::vector<std::pair<AckCallback, Result<PublishAck>>>;

  // Under async_mu: an answered batch goes back for reuse (or away).
  void RetireFront() {
    // Reused only when its requests keep little storage (a batch that once
    // carried large payloads would hold on to them for good).
    size_t kept = 0;
    for (const auto& m : in_flight_.front().req.messages()) kept += m.payload().capacity();
    if (impl_.async_spare.size() < kMaxSpareBatches &&
        kept <= static_cast<size_t>(impl_.options.async_batch_bytes)) {
      AsyncBatch& f = in_flight_.front();
      f.entries.clear();
      f.req.Clear();  // keeps its requests, cleared, with their strings' storage
      f.bytes = 0;
      impl_.async_spare.push_back(std::move(f));
    }
    in_flight_.pop_front();
  }

  // Runs callbacks outside the lock and releases their backpressure.
  void Complete(Results& results) {
    for (auto& [cb, r] : results) {
      if (cb) cb(r);
    }
    {
      std::lock_guard<std::mutex> lock(impl_.async_mu);
      impl_.async_unacked -= results.size();
    }
    impl_.async_cv.notify_all();
    results.clear();
  }

  void FailFrontEntries(size_t count, const Status& err) {
    Results failed;
    {
      std::lock_guard<std::mutex> lock(impl_.async_mu);
      if (impl_.async_error.ok()) impl_.async_error = err;
      while (count > 0 && !in_flight_.empty()) {
        AsyncBatch& f = in_flight_.front();
        const size_t n = std::min(count, f.entries.size());
        for (size_t i = 0; i < n; ++i) failed.emplace_back(std::move(f.entries[i].on_ack), err);
        f.entries.erase(f.entries.begin(), f.entries.begin() + static_cast<std::ptrdiff_t>(n));
        f.req.mutable_messages()->DeleteSubrange(0, static_cast<int>(n));
        count -= n;
        if (f.entries.empty()) in_flight_.pop_front();
      }
    }
    Complete(failed);
  }

  // The stream's answers, in order, until it ends: each acknowledges the
  // oldest batch in flight (a partial answer precedes the stream's error).
  void ReadAcks(
      grpc::ClientReaderWriterInterface<v1::PublishBatchRequest, v1::PublishBatchResponse>& stream,
      bool* reader_done) {
    v1::PublishBatchResponse resp;
    Results acked;
    while (stream.Read(&resp)) {
      {
        std::lock_guard<std::mutex> lock(impl_.async_mu);
        if (in_flight_.empty()) break;  // protocol violation: nothing was waiting for this
        AsyncBatch& f = in_flight_.front();
        const size_t n = std::min<size_t>(static_cast<size_t>(resp.acks_size()), f.entries.size());
        for (size_t i = 0; i < n; ++i) {
          const auto& a = resp.acks(static_cast<int>(i));
          acked.emplace_back(std::move(f.entries[i].on_ack),
                             PublishAck{a.offset(), a.duplicate(), f.entries[i].sequence});
        }
        if (n == f.entries.size()) {
          RetireFront();
        } else {
          f.entries.erase(f.entries.begin(), f.entries.begin() + static_cast<std::ptrdiff_t>(n));
          f.req.mutable_messages()->DeleteSubrange(0, static_cast<int>(n));
        }
      }
      Complete(acked);
    }
    std::lock_guard<std::mutex> lock(impl_.async_mu);
    *reader_done = true;
    impl_.async_cv.notify_all();
  }

  // One stream: what the last one left unanswered first, then queued batches
  // while there are any; closed when idle or broken. Its final status.
  grpc::Status RunStream() {
    grpc::ClientContext ctx;
    impl_.Prepare(&ctx, DeadlineClock::now() + impl_.options.stream_deadline);
    auto stream = impl_.stub->PublishStream(&ctx);
    bool broken = false;
    bool reader_done = false;
    for (auto& f : in_flight_) {
      if (!stream->Write(f.req)) {
        broken = true;
        break;
      }
    }
    std::thread reader([&] { ReadAcks(*stream, &reader_done); });
    while (!broken) {
      AsyncBatch* next = nullptr;
      {
        std::unique_lock<std::mutex> lock(impl_.async_mu);
        impl_.async_cv.wait(lock, [&] {
          return reader_done || (!impl_.async_queue.empty() && in_flight_.size() < kMaxInFlight) ||
                 (impl_.async_queue.empty() && in_flight_.empty());
        });
        if (reader_done || impl_.async_queue.empty()) break;  // broken, or idle: close the stream
        // The oldest batch (closed from now on: new messages start another).
        in_flight_.push_back(std::move(impl_.async_queue.front()));
        impl_.async_queue.pop_front();
        in_flight_.back().first_sent = DeadlineClock::now();
        next = &in_flight_.back();  // deque: stays valid while the reader pops the front
      }
      // The reader cannot touch `next` before the broker has read all of it.
      if (!stream->Write(next->req)) broken = true;
    }
    stream->WritesDone();
    reader.join();
    return stream->Finish();
  }

  // A stream that ended with publishes unanswered: fail what the broker
  // refused, give up on what waited past call_timeout (or everything when the
  // client closes), else back off and resend.
  void AfterBrokenStream(const grpc::Status& s, int* attempt) {
    const std::string what =
        "async publish (bus " + impl_.address + ", agent " + impl_.cred.agent + ")";
    const Status err = s.ok() ? Unavailable(what + ": the stream ended with publishes unanswered")
                              : FromGrpc(s, what);
    if (!s.ok() && !Retryable(s.error_code())) {
      // The broker refused the first unanswered entry; the rest are resent.
      // UNAUTHENTICATED refuses everything sent with this credential.
      FailFrontEntries(s.error_code() == grpc::StatusCode::UNAUTHENTICATED ? SIZE_MAX : 1, err);
      return;
    }
    DeadlineClock::time_point oldest;
    bool stopping = false;
    {
      std::lock_guard<std::mutex> lock(impl_.async_mu);
      oldest = in_flight_.empty() ? DeadlineClock::now() : in_flight_.front().first_sent;
      stopping = impl_.async_stop;
    }
    if (stopping) {  // the client is being destroyed: no more retries
      Results dropped;
      {
        std::lock_guard<std::mutex> lock(impl_.async_mu);
        for (auto& batch : impl_.async_queue) {
          for (auto& e : batch.entries) dropped.emplace_back(std::move(e.on_ack), err);
        }
        impl_.async_queue.clear();
      }
      FailFrontEntries(SIZE_MAX, err.WithContext("client closing"));
      Complete(dropped);
      return;
    }
    if (DeadlineClock::now() - oldest > impl_.options.call_timeout) {
      FailFrontEntries(SIZE_MAX, err.WithContext("gave up after call_timeout"));
      *attempt = 0;
      return;
    }
    impl_.Pause(impl_.Backoff((*attempt)++));
  }

  Impl& impl_;
  std::deque<AsyncBatch> in_flight_;  // guarded by async_mu once the reader runs
};

void BusClient::Impl::RunAsyncPublisher() { AsyncPublisher(*this).Run(); }

}  // namespace agentrt
