// Request and Reply: a request goes to its addressee's inbox and waits in the
// RequestTable for the Reply that names it.
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
  AGENTRT_RETURN_IF_ERROR(CheckValid(ValidateRequest(req, options_.limits),
                                     [&] { return "request from agent " + agent; }));
  if (!access_.acl().IsAgent(req.to())) {
    return NotFound("request from agent " + agent + ": no agent \"" + req.to() + "\" in this run");
  }
  const RequestTable::Ticket ticket = requests_.Open(req.to());
  const uint64_t id = ticket.id;
  v1::Message msg;
  msg.set_publisher(agent);
  msg.set_request_id(id);
  msg.set_content_type(std::move(*req.mutable_content_type()));
  msg.set_payload(std::move(*req.mutable_payload()));
  if (Stored st = Append(GetLog(InboxName(req.to()), true), std::move(msg)); !st.status.ok()) {
    requests_.Forget(id);
    return st.status.WithContext("request to agent " + req.to());
  }
  switch (requests_.Wait(
      ticket, deadline, [this] { return shutting_down(); }, cancelled, resp)) {
    case RequestTable::End::kReplied:
      return Status::Ok();
    case RequestTable::End::kDeadline:
      return DeadlineExceeded("request " + std::to_string(id) + " from agent " + agent +
                              " to agent " + req.to() + ": no reply before the deadline");
    case RequestTable::End::kShutdown:
      return Unavailable("the bus broker is shutting down");
    case RequestTable::End::kCancelled:
      break;
  }
  return Status(StatusCode::kCancelled,
                "request " + std::to_string(id) + " cancelled by the caller");
}

Status Broker::Reply(const std::string& agent, v1::ReplyRequest& req) {
  AGENTRT_RETURN_IF_ERROR(
      CheckValid(ValidateReply(req, options_.limits), [&] { return "reply from agent " + agent; }));
  Status answered = requests_.Answer(req.request_id(), agent, req);
  if (answered.code() == StatusCode::kPermissionDenied) return Deny(answered.message());
  if (!answered.ok()) return answered.WithContext("reply from agent " + agent);
  return answered;
}

}  // namespace agentrt
