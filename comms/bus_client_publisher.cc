// BusClient::PublishAsync and Flush, and the loop that sends their batches.
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <deque>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "comms/bus_client_internal.h"
#include "comms/packed_entries.h"

namespace agentrt {

using namespace bus_client_internal;  // NOLINT(google-build-using-namespace): its own insides

namespace {
// The client (its Impl) whose PublishAsync callbacks this thread is running,
// if any: a PublishAsync of that client from one of them does not wait for
// spool room, which only this thread's answers free.
thread_local const void* t_answering_for = nullptr;
}  // namespace

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
  // On the broker's node a payload of 256 KiB or more goes into a spool file
  // now (the caller's one copy), and only its name through the socket; while
  // the spooled ones waiting for their answers fill the room (SpoolRoom), it
  // waits for room, up to its timeout.
  std::unique_ptr<SpooledPayload> spooled;
  if (payload.size() >= kSpoolAsyncMinBytes) {
    // The first such payload asks whether the spool is there (once, here, so
    // that a burst right after connecting is spooled too: one call to the
    // broker; the sending thread asks again when a stream broke), and so
    // does the first after a refused file's wait (SpoolAskDue).
    if (impl_->SpoolAskDue()) (void)impl_->OnBrokerNode();
    const std::chrono::milliseconds wait = t_answering_for == impl_.get()
                                               ? std::chrono::milliseconds(0)
                                               : opts.timeout.value_or(impl_->options.call_timeout);
    spooled = impl_->SpoolPayload(payload, wait);
  }
  // Counted in its batch's bytes even when spooled: a batch resent inline
  // (BeforeResend) stays within what one call carries.
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
  // A batch is packed while its entries are uniform (one topic and content
  // type, consecutive sequences, none spooled): one field for all of them.
  // The first entry that is not turns it into messages.
  v1::PackedEntries* packed = nullptr;
  if (batch.entries.empty()) {
    if (spooled || !impl_->async_packs) {
      batch.req.clear_packed();
    } else {
      packed = batch.req.mutable_packed();  // a reused one keeps its storage
      packed->set_topic(topic.data(), topic.size());
      packed->set_content_type(opts.content_type);
      packed->set_publisher_id(impl_->publisher_id);
      packed->set_first_sequence(seq);
    }
  } else if (batch.req.has_packed()) {
    packed = batch.req.mutable_packed();
    if (spooled || packed->topic() != topic || packed->content_type() != opts.content_type ||
        seq != packed->first_sequence() + static_cast<uint64_t>(packed->count())) {
      UnpackEntries(&batch.req);
      packed = nullptr;
    }
  }
  if (packed != nullptr) {
    AppendPackedEntry(packed, payload);
  } else {
    // Into a reused request's own strings (no temporary copies).
    v1::PublishRequest* m = batch.req.add_messages();
    m->set_topic(topic.data(), topic.size());
    if (spooled) {
      m->set_spooled_name(spooled->name);
      m->set_spooled_size(static_cast<int64_t>(spooled->size));
      m->set_spooled_crc32c(spooled->crc);
    } else {
      m->set_payload(payload.data(), payload.size());
    }
    m->set_content_type(opts.content_type);
    m->set_publisher_id(impl_->publisher_id);
    m->set_sequence(seq);
  }
  batch.entries.push_back(AsyncBatch::Pending{seq, std::move(on_ack), std::move(spooled)});
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
    AsyncBatch& f = in_flight_.front();
    size_t kept = f.req.has_packed() ? f.req.packed().payloads().capacity() : 0;
    for (const auto& m : f.req.messages()) kept += m.payload().capacity();
    if (impl_.async_spare.size() < kMaxSpareBatches &&
        kept <= static_cast<size_t>(impl_.options.async_batch_bytes)) {
      f.entries.clear();
      // Keeps its requests and packed entries, cleared, with their strings'
      // storage (Clear() would free the packed ones).
      f.req.mutable_messages()->Clear();
      if (f.req.has_packed()) f.req.mutable_packed()->Clear();
      f.bytes = 0;
      impl_.async_spare.push_back(std::move(f));
    }
    in_flight_.pop_front();
  }

  // Takes the first n entries (answered or failed) out of a batch.
  static void DropFront(AsyncBatch& f, size_t n) {
    f.entries.erase(f.entries.begin(), f.entries.begin() + static_cast<std::ptrdiff_t>(n));
    if (f.req.has_packed()) {
      (void)DropPackedEntries(f.req.mutable_packed(), static_cast<int>(n));
    } else {
      f.req.mutable_messages()->DeleteSubrange(0, static_cast<int>(n));
    }
  }

  // Runs callbacks outside the lock and releases their backpressure.
  void Complete(Results& results) {
    const void* const outer = std::exchange(t_answering_for, &impl_);
    for (auto& [cb, r] : results) {
      if (cb) cb(r);
    }
    t_answering_for = outer;
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
        DropFront(f, n);
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
        if (resp.packed_entries()) {
          impl_.async_packs = true;
          packed_answered_ = true;
        }
        AsyncBatch& f = in_flight_.front();
        const size_t n =
            std::min<size_t>(static_cast<size_t>(AnsweredEntries(resp)), f.entries.size());
        for (size_t i = 0; i < n; ++i) {
          const EntryAnswer a = AnswerOf(resp, static_cast<int>(i));
          acked.emplace_back(std::move(f.entries[i].on_ack),
                             PublishAck{a.offset, a.duplicate, f.entries[i].sequence});
        }
        if (n == f.entries.size()) {
          RetireFront();
        } else {
          DropFront(f, n);
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
  // Reads a spooled entry's bytes back from its file (which holds them even
  // where a new spool removed its name) into its request, which then
  // carries them inline. False, and left as it was, if the read fails.
  static bool Inline(AsyncBatch& f, size_t k) {
    const std::unique_ptr<SpooledPayload>& sp = f.entries[k].spooled;
    v1::PublishRequest& m = *f.req.mutable_messages(static_cast<int>(k));
    std::string* payload = m.mutable_payload();
    payload->resize(sp->size);
    if (ReadAllAt(sp->fd, payload->data(), sp->size, 0) != static_cast<ssize_t>(sp->size)) {
      payload->clear();
      return false;
    }
    m.clear_spooled_name();
    m.clear_spooled_size();
    m.clear_spooled_crc32c();
    f.entries[k].spooled.reset();
    return true;
  }

  // Its spooled entries inline: all of them, or those whose file lost its
  // name (a broker that restarted made its spool anew; a durable one took
  // the bytes and removed the file). An entry whose file the broker renamed
  // into its store is resent as it is and answered as a duplicate.
  static void InlineSpooled(AsyncBatch& f, bool all) {
    for (size_t k = 0; k < f.entries.size(); ++k) {
      const std::unique_ptr<SpooledPayload>& sp = f.entries[k].spooled;
      if (!sp) continue;
      struct stat st {};
      if (all || ::fstat(sp->fd, &st) != 0 || st.st_nlink == 0) (void)Inline(f, k);
    }
  }

  // Before a stream that resends: the spool is asked about again (the broker
  // may have made it anew). If the broker refused a file of a spool that is
  // still the one proven, that spool is not used for spool_retry_after; a
  // refused entry goes inline, and so do all of them where no spool can be
  // used (for now), or those whose file is gone.
  void BeforeResend() {
    (void)impl_.OnBrokerNode(/*again=*/true);
    bool unusable = false;
    {
      std::lock_guard<std::mutex> lock(impl_.spool_mu);
      if (!refused_spool_.empty() && impl_.spool_state > 0 && impl_.spool_id == refused_spool_)
        impl_.RefuseSpoolLocked();
      unusable = impl_.spool_state < 0 || impl_.SpoolHeldOffLocked();
    }
    if (!refused_spool_.empty() && !in_flight_.empty() && !in_flight_.front().entries.empty() &&
        in_flight_.front().entries.front().spooled != nullptr && !Inline(in_flight_.front(), 0)) {
      // Its bytes cannot be read back: the entry fails (no resend loop).
      FailFrontEntries(1, Internal("async publish of a spooled payload: its file cannot be read "
                                   "back after the broker refused it"));
    }
    refused_spool_.clear();
    for (AsyncBatch& f : in_flight_) InlineSpooled(f, unusable);
    std::lock_guard<std::mutex> lock(impl_.async_mu);
    for (AsyncBatch& f : impl_.async_queue) InlineSpooled(f, unusable);
  }

  // The spool id of the first unanswered entry's file ("" when it has none).
  std::string FrontSpool() {
    std::lock_guard<std::mutex> lock(impl_.async_mu);
    if (in_flight_.empty() || in_flight_.front().entries.empty() ||
        in_flight_.front().entries.front().spooled == nullptr)
      return "";
    return in_flight_.front().entries.front().spooled->spool_id;
  }

  grpc::Status RunStream() {
    if (in_flight_.empty()) {
      (void)impl_.OnBrokerNode();
    } else {
      BeforeResend();
    }
    {
      // A broker not known to take packed entries gets messages.
      std::lock_guard<std::mutex> lock(impl_.async_mu);
      packed_answered_ = false;
      if (!impl_.async_packs) {
        for (std::deque<AsyncBatch>* batches : {&in_flight_, &impl_.async_queue}) {
          for (AsyncBatch& f : *batches) {
            if (f.req.has_packed()) UnpackEntries(&f.req);
          }
        }
      }
    }
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
    {
      std::lock_guard<std::mutex> lock(impl_.async_mu);
      impl_.async_packs = false;  // asked again: the next stream's broker may be another
      if (s.error_code() == grpc::StatusCode::INVALID_ARGUMENT && !packed_answered_ &&
          !in_flight_.empty() && in_flight_.front().req.has_packed()) {
        // A broker that never said it takes packed entries refused a packed
        // batch (an older one reads it as empty, after a stream that closed
        // idle met a broker replaced meanwhile): resent as messages, the
        // entries' own errors then as ever.
        return;
      }
    }
    if (s.error_code() == grpc::StatusCode::FAILED_PRECONDITION) {
      // The broker could not take the entry's file (its spool made anew by a
      // restart, or a folder it cannot use): resent inline at once.
      refused_spool_ = FrontSpool();
      if (!refused_spool_.empty()) return;
    }
    // CANCELLED comes from a broker that shut down with the stream open (this
    // client cancels nothing but at its end, handled below): resent.
    if (!s.ok() && !Retryable(s.error_code()) && s.error_code() != grpc::StatusCode::CANCELLED) {
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
  bool packed_answered_ = false;  // guarded by async_mu: this stream's broker said packed_entries
  std::string refused_spool_;     // the last stream ended on a file of this spool
};

void BusClient::Impl::RunAsyncPublisher() { AsyncPublisher(*this).Run(); }

}  // namespace agentrt
