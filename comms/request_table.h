// The broker's request/reply table, a part of its own: a Request waits here
// until the Reply that names its id, its deadline, its caller's cancel or the
// broker's shutdown. Thread-safe.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

#include "common/status.h"
#include "comms/proto/bus.pb.h"

namespace agentrt {

class RequestTable {
 public:
  using TimePoint = std::chrono::system_clock::time_point;

  // Ids count up from `first_id` (the broker starts at a random odd number, so
  // a reply meant for an earlier broker's request is not taken for a new one).
  explicit RequestTable(uint64_t first_id) : next_id_(first_id) {}

  struct Pending;
  struct Ticket {
    uint64_t id = 0;
    std::shared_ptr<Pending> pending;
  };
  // A request addressed to agent `to`, now waiting; its id goes in the inbox message.
  Ticket Open(std::string to);
  // Drops a request that will get no answer (its inbox message was not stored).
  void Forget(uint64_t id);

  enum class End { kReplied, kDeadline, kCancelled, kShutdown };
  // Waits for the reply to `ticket` and moves it into *out. Any other end
  // forgets the request. `shutting_down` and `cancelled` (may be empty) are
  // asked at least every 50 ms.
  End Wait(const Ticket& ticket, TimePoint deadline, const std::function<bool()>& shutting_down,
           const std::function<bool()>& cancelled, bus::v1::RequestResponse* out);

  // Answers request `id` on behalf of `agent` with the reply's payload:
  // NotFound when it is not waiting, PermissionDenied when it was addressed to
  // another agent.
  Status Answer(uint64_t id, const std::string& agent, bus::v1::ReplyRequest& reply);

  // Wakes every waiter, so that each sees the broker shutting down.
  void WakeAll();
  size_t size() const;

 private:
  mutable std::mutex mu_;
  std::unordered_map<uint64_t, std::shared_ptr<Pending>> pending_;
  uint64_t next_id_;
};

}  // namespace agentrt
