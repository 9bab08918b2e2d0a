#include "comms/request_table.h"

#include <algorithm>
#include <utility>

namespace agentrt {

struct RequestTable::Pending {
  std::string to;
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  bus::v1::RequestResponse response;
};

RequestTable::Ticket RequestTable::Open(std::string to) {
  auto pending = std::make_shared<Pending>();
  pending->to = std::move(to);
  std::lock_guard<std::mutex> lock(mu_);
  const uint64_t id = next_id_++;
  pending_.emplace(id, pending);
  return Ticket{id, std::move(pending)};
}

void RequestTable::Forget(uint64_t id) {
  std::lock_guard<std::mutex> lock(mu_);
  pending_.erase(id);
}

RequestTable::End RequestTable::Wait(const Ticket& ticket, TimePoint deadline,
                                     const std::function<bool()>& shutting_down,
                                     const std::function<bool()>& cancelled,
                                     bus::v1::RequestResponse* out) {
  Pending& p = *ticket.pending;
  // Timed on the steady clock from here: a step of the wall clock (NTP) must
  // neither end the wait at once nor stretch it.
  const auto until =
      std::chrono::steady_clock::now() + (deadline - std::chrono::system_clock::now());
  std::unique_lock<std::mutex> lock(p.mu);
  while (!p.done) {
    const auto now = std::chrono::steady_clock::now();
    End end = End::kReplied;
    if (now >= until) {
      end = End::kDeadline;
    } else if (shutting_down && shutting_down()) {
      end = End::kShutdown;
    } else if (cancelled && cancelled()) {
      end = End::kCancelled;
    }
    if (end != End::kReplied) {
      lock.unlock();
      Forget(ticket.id);
      return end;
    }
    p.cv.wait_for(lock, std::min<std::chrono::steady_clock::duration>(
                            until - now, std::chrono::milliseconds(50)));
  }
  *out = std::move(p.response);
  return End::kReplied;
}

Status RequestTable::Answer(uint64_t id, const std::string& agent, bus::v1::ReplyRequest& reply) {
  std::shared_ptr<Pending> pending;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = pending_.find(id);
    if (it == pending_.end()) {
      return NotFound("request " + std::to_string(id) +
                      " is unknown or no longer waiting (its deadline passed?)");
    }
    if (it->second->to != agent) {
      return PermissionDenied("agent " + agent + " cannot answer request " + std::to_string(id) +
                              ", which was addressed to agent " + it->second->to);
    }
    pending = std::move(it->second);
    pending_.erase(it);
  }
  {
    std::lock_guard<std::mutex> lock(pending->mu);
    pending->response.set_payload(std::move(*reply.mutable_payload()));
    pending->response.set_content_type(std::move(*reply.mutable_content_type()));
    pending->response.set_replier(agent);
    pending->done = true;
  }
  pending->cv.notify_all();
  return Status::Ok();
}

void RequestTable::WakeAll() {
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& [id, p] : pending_) {
    std::lock_guard<std::mutex> plock(p->mu);
    p->cv.notify_all();
  }
}

size_t RequestTable::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return pending_.size();
}

}  // namespace agentrt
