// The broker's duplicate suppression, a part of its own: which sequences of
// one publisher (agent, publisher_id) were stored, and at which offset, so a
// retried publish is answered with its first offset instead of stored twice.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace agentrt {

// The recent sequences of one publisher: a ring indexed by sequence, so a
// check is O(1) and memory is fixed. Callers hold `mu` across a check and the
// store it guards, so two retries of one sequence cannot both be stored.
class PublisherWindow {
 public:
  static constexpr uint64_t kWindow = 16384;

  // True when `seq` was stored: *offset is where (-1 for a sequence older than
  // the window: a late retry, by contract a duplicate whose offset is gone).
  bool Seen(uint64_t seq, int64_t* offset) const;
  // `seq` was stored at `offset`.
  void Record(uint64_t seq, int64_t offset);
  // Un-records `seq` when its offset is at or past `end` (it was not stored
  // after all: the log rolled back a write that failed).
  void Forget(uint64_t seq, int64_t end);

  std::mutex mu;

 private:
  struct Slot {
    uint64_t sequence = 0;
    int64_t offset = -1;
  };
  std::vector<Slot> ring_ = std::vector<Slot>(kWindow);
  uint64_t highest_ = 0;
};

// Every publisher's window, at most `capacity` of them: past that the oldest
// publisher is forgotten (its late retries could be stored again). Thread-safe.
class PublisherTable {
 public:
  explicit PublisherTable(size_t capacity) : capacity_(capacity) {}

  // The window of (agent, publisher_id), made on first use.
  std::shared_ptr<PublisherWindow> Get(const std::string& agent, uint64_t publisher_id);
  size_t size() const;

 private:
  using Key = std::pair<std::string, uint64_t>;
  const size_t capacity_;
  mutable std::mutex mu_;
  std::map<Key, std::shared_ptr<PublisherWindow>> windows_;
  std::deque<Key> order_;  // creation order, for eviction
};

}  // namespace agentrt
