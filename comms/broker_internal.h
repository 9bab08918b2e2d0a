// The broker's insides, shared by its files: broker.cc (logs, storage,
// publishing, ACL, recovery, stats), broker_large.cc (the payload store of
// large messages), broker_read.cc (readers and their waits) and
// broker_requests.cc (the request table of Request/Reply). Not installed.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "comms/broker.h"

namespace agentrt {

namespace v1 = bus::v1;

namespace broker_internal {
// A log's retained messages: a deque that keeps its storage (a power-of-two
// ring growing by doubling), so a log at its retention bound appends and
// expires without allocating (std::deque frees and allocates a block every
// few dozen messages).
template <typename T>
class Ring {
 public:
  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  T& operator[](size_t i) { return slots_[(head_ + i) & (slots_.size() - 1)]; }
  const T& operator[](size_t i) const { return slots_[(head_ + i) & (slots_.size() - 1)]; }
  T& front() { return (*this)[0]; }
  T& back() { return (*this)[size_ - 1]; }
  void push_back(T v) {
    if (size_ == slots_.size()) Grow();
    (*this)[size_++] = std::move(v);
  }
  // Moves the oldest out (its slot is left empty).
  T take_front() {
    T v = std::move(front());
    front() = T();
    head_ = (head_ + 1) & (slots_.size() - 1);
    --size_;
    return v;
  }
  void pop_front() { (void)take_front(); }
  void pop_back() {
    back() = T();
    --size_;
  }

 private:
  void Grow() {
    std::vector<T> bigger(std::max<size_t>(16, slots_.size() * 2));
    for (size_t i = 0; i < size_; ++i) bigger[i] = std::move((*this)[i]);
    slots_.swap(bigger);
    head_ = 0;
  }
  std::vector<T> slots_;  // size a power of two
  size_t head_ = 0, size_ = 0;
};
}  // namespace broker_internal

struct Broker::Log {
  explicit Log(std::string n) : name(std::move(n)) {}
  const std::string name;
  std::mutex mu;
  std::condition_variable cv;
  broker_internal::Ring<std::shared_ptr<const v1::Message>>
      msgs;  // offsets [base, base + msgs.size())
  // Messages retention dropped that no reader held any more, kept for reuse
  // with their strings' storage (so a log at its bound does not allocate).
  std::vector<std::shared_ptr<v1::Message>> spare;
  size_t spare_bytes = 0;  // payload capacity held by `spare`
  int64_t base = 0;
  int64_t bytes = 0;
  int64_t keep_last = -1;  // its channel's keep_last (0: none; -1: not asked yet)
  int waiters = 0;
  std::unique_ptr<SegmentLog> files;  // the durable log (opened at the first append)
  std::unordered_map<int64_t, std::shared_ptr<Blob>> blobs;  // offset -> large payload
};

struct Broker::Blob {
  // `open` counts the broker's live blobs (shared: a reader may hold one
  // after the broker is gone).
  Blob(std::string p, int f, int64_t s, std::shared_ptr<std::atomic<int64_t>> open)
      : path(std::move(p)), fd(f), size(s), open_(std::move(open)) {
    open_->fetch_add(1);
  }
  ~Blob() {
    if (fd >= 0) ::close(fd);
    if (!stored.load()) Unlink();
    open_->fetch_sub(1);
  }
  Blob(const Blob&) = delete;
  Blob& operator=(const Blob&) = delete;
  // Removes the file's name at once (retention, or a message not stored):
  // readers still sending it keep reading through `fd`. Names go in offset
  // order, so recovery can tell retention's doing from a lost file.
  void Unlink() {
    if (!unlinked.exchange(true)) ::unlink(path.c_str());
  }
  const std::string path;
  const int fd;  // open for reading (and writing while uploading)
  const int64_t size;
  std::atomic<bool> stored{false};  // false: an upload that did not become a message
  std::atomic<bool> unlinked{false};

 private:
  const std::shared_ptr<std::atomic<int64_t>> open_;
};

struct Broker::Upload {
  std::shared_ptr<Log> log;
  v1::Message msg;  // every field but the payload
  std::shared_ptr<Blob> blob;
  uint32_t expected_crc = 0;
  uint32_t crc = 0;
  int64_t written = 0;
  bool adopted = false;  // from the spool (AdoptLarge), not received in chunks
};

namespace broker_internal {
inline constexpr size_t kMaxPublishers = 1024;
inline constexpr size_t kMaxSpare =
    4096;  // per log: a batch's worth (BusLimits::max_batch_messages)
inline constexpr size_t kMaxSpareBytes = 1 << 20;  // per log: payload storage kept in spares
inline constexpr size_t kMaxCacheEntries = 4096;

// What a publish the bus could not store gets (the client retries UNAVAILABLE).
inline Status NotStored(const Status& why) {
  return Status(StatusCode::kUnavailable,
                why.message() + " (not stored; retry when the bus's disk has room)");
}

// The payload bytes a message stands for (a large one's are in its file).
inline int64_t PayloadBytes(const v1::Message& m) {
  return static_cast<int64_t>(m.payload().size()) + m.chunked_size();
}

inline int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// A stored message's fields but its payload, into `m` (a reused one keeps
// its strings' storage): stamped with the authenticated agent, not large.
inline void FillStoredFields(const std::string& agent, uint64_t publisher_id, uint64_t sequence,
                             const std::string& content_type, v1::Message* m) {
  m->set_publisher(agent);
  m->set_publisher_id(publisher_id);
  m->set_sequence(sequence);
  m->set_content_type(content_type);
  m->set_request_id(0);
  m->set_chunked_size(0);
  m->set_chunked_crc32c(0);
  m->clear_chunked_file();
}

// A stored message from a publish, into `m`: the payload is swapped, so the
// request keeps a buffer to parse the next one into.
inline void FillMessage(const std::string& agent, v1::PublishRequest& req, v1::Message* m) {
  FillStoredFields(agent, req.publisher_id(), req.sequence(), req.content_type(), m);
  m->mutable_payload()->swap(*req.mutable_payload());
}

inline v1::Message ToMessage(const std::string& agent, v1::PublishRequest& req) {
  v1::Message msg;
  FillMessage(agent, req, &msg);
  return msg;
}
}  // namespace broker_internal

}  // namespace agentrt
