#include "comms/publisher_window.h"

#include <algorithm>

namespace agentrt {

bool PublisherWindow::Seen(uint64_t seq, int64_t* offset) const {
  if (highest_ >= kWindow && seq <= highest_ - kWindow) {
    *offset = -1;
    return true;
  }
  const Slot& s = ring_[seq % kWindow];
  if (s.sequence != seq) return false;
  *offset = s.offset;
  return true;
}

void PublisherWindow::Record(uint64_t seq, int64_t offset) {
  ring_[seq % kWindow] = Slot{seq, offset};
  highest_ = std::max(highest_, seq);
}

void PublisherWindow::Forget(uint64_t seq, int64_t end) {
  Slot& s = ring_[seq % kWindow];
  if (s.sequence == seq && s.offset >= end) s = Slot{};
}

std::shared_ptr<PublisherWindow> PublisherTable::Get(const std::string& agent,
                                                     uint64_t publisher_id) {
  std::lock_guard<std::mutex> lock(mu_);
  Key key(agent, publisher_id);
  auto it = windows_.find(key);
  if (it != windows_.end()) return it->second;
  if (windows_.size() >= capacity_) {
    windows_.erase(order_.front());
    order_.pop_front();
  }
  auto window = std::make_shared<PublisherWindow>();
  windows_.emplace(key, window);
  order_.push_back(std::move(key));
  return window;
}

size_t PublisherTable::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return windows_.size();
}

}  // namespace agentrt
