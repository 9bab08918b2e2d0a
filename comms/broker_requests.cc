// The broker's request table: Request waits for the Reply that names it.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>

#include "common/crc32c.h"
#include "common/file_util.h"
#include "comms/broker_internal.h"
#include "fmt/format.h"
#include "plan/run_dir.h"

namespace agentrt {

using namespace broker_internal;  // NOLINT(google-build-using-namespace): its own insides

Status Broker::Request(const std::string& agent, v1::RequestRequest& req,
                       std::chrono::system_clock::time_point deadline,
                       const std::function<bool()>& cancelled, v1::RequestResponse* resp) {
  if (Status s = ValidateRequest(req, options_.limits); !s.ok()) {
    CountInvalid();
    return s.WithContext("request from agent " + agent);
  }
  if (!acl_.IsAgent(req.to())) {
    return NotFound("request from agent " + agent + ": no agent \"" + req.to() + "\" in this run");
  }
  auto pending = std::make_shared<PendingRequest>();
  pending->to = req.to();
  const uint64_t id = next_request_id_.fetch_add(1, std::memory_order_relaxed);
  {
    std::lock_guard<std::mutex> lock(requests_mu_);
    requests_.emplace(id, pending);
  }
  auto forget = [&] {
    std::lock_guard<std::mutex> lock(requests_mu_);
    requests_.erase(id);
  };
  v1::Message msg;
  msg.set_publisher(agent);
  msg.set_request_id(id);
  msg.set_content_type(std::move(*req.mutable_content_type()));
  msg.set_payload(std::move(*req.mutable_payload()));
  if (Stored st = Append(GetLog(InboxName(req.to()), true), std::move(msg)); !st.status.ok()) {
    forget();
    return st.status.WithContext("request to agent " + req.to());
  }

  std::unique_lock<std::mutex> lock(pending->mu);
  while (!pending->done) {
    const auto now = std::chrono::system_clock::now();
    if (now >= deadline) {
      lock.unlock();
      forget();
      return DeadlineExceeded("request " + std::to_string(id) + " from agent " + agent +
                              " to agent " + req.to() + ": no reply before the deadline");
    }
    if (shutting_down()) {
      lock.unlock();
      forget();
      return Unavailable("the bus broker is shutting down");
    }
    if (cancelled && cancelled()) {
      lock.unlock();
      forget();
      return Status(StatusCode::kCancelled,
                    "request " + std::to_string(id) + " cancelled by the caller");
    }
    pending->cv.wait_for(lock, std::min<std::chrono::system_clock::duration>(
                                   deadline - now, std::chrono::milliseconds(50)));
  }
  *resp = std::move(pending->response);
  return Status::Ok();
}

Status Broker::Reply(const std::string& agent, v1::ReplyRequest& req) {
  if (Status s = ValidateReply(req, options_.limits); !s.ok()) {
    CountInvalid();
    return s.WithContext("reply from agent " + agent);
  }
  std::shared_ptr<PendingRequest> pending;
  {
    std::lock_guard<std::mutex> lock(requests_mu_);
    auto it = requests_.find(req.request_id());
    if (it == requests_.end()) {
      return NotFound("reply from agent " + agent + ": request " +
                      std::to_string(req.request_id()) +
                      " is unknown or no longer waiting (its deadline passed?)");
    }
    if (it->second->to != agent) {
      return Deny("agent " + agent + " cannot answer request " + std::to_string(req.request_id()) +
                  ", which was addressed to agent " + it->second->to);
    }
    pending = it->second;
    requests_.erase(it);
  }
  {
    std::lock_guard<std::mutex> lock(pending->mu);
    pending->response.set_payload(std::move(*req.mutable_payload()));
    pending->response.set_content_type(std::move(*req.mutable_content_type()));
    pending->response.set_replier(agent);
    pending->done = true;
  }
  pending->cv.notify_all();
  return Status::Ok();
}

}  // namespace agentrt
