// libFuzzer target: arbitrary bytes as bus requests through the broker's
// request validation and, when valid, the broker itself (auth, ACL, dedup,
// retention, inbox, reads, packed batches), and as a plan's JSON through
// its ACL. Built only with clang (tests/comms/bus.cmake).
//
//   build-clang/tests/bus_validate_fuzz -max_total_time=60 CORPUS_DIR tests/comms/fuzz/corpus
//
// The first byte picks the request type; the rest is its serialized protobuf.
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "comms/auth.h"
#include "comms/broker.h"
#include "comms/bus_validate.h"
#include "plan/plan.h"

namespace {

namespace v1 = agentrt::bus::v1;

agentrt::Broker& FuzzBroker() {
  static agentrt::Broker* broker = [] {
    agentrt::BrokerOptions opts;
    opts.limits.max_message_bytes = 1024;
    opts.retention_messages = 64;
    opts.retention_bytes = 16 << 10;
    agentrt::BusAcl acl;
    acl.agents = {"a", "b"};
    acl.channels = {{"t*", {"a"}, {"a", "b"}}};
    return new agentrt::Broker(opts, acl, "fuzz-secret", 1);
  }();
  return *broker;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const uint8_t kind = data[0];
  const char* body = reinterpret_cast<const char*>(data + 1);
  const int len = static_cast<int>(size - 1);
  agentrt::Broker& broker = FuzzBroker();
  const agentrt::BusLimits& limits = broker.options().limits;
  switch (kind % 8) {
    case 0: {
      v1::PublishRequest r;
      if (!r.ParseFromArray(body, len)) return 0;
      (void)agentrt::ValidatePublish(r, limits);
      v1::PublishResponse resp;
      (void)broker.Publish("a", r, &resp);
      break;
    }
    case 1: {
      // As the server hands a batch over: messages or packed entries, each
      // form validated by the broker itself.
      v1::PublishBatchRequest r;
      if (!r.ParseFromArray(body, len)) return 0;
      v1::PublishBatchResponse resp;
      (void)broker.PublishBatch("a", r, &resp);
      break;
    }
    case 2: {
      v1::SubscribeRequest r;
      if (!r.ParseFromArray(body, len)) return 0;
      v1::SubscribeResponse::Header h;
      auto reader = broker.OpenTopicReader("b", r, &h);
      if (!reader.ok()) return 0;
      v1::SubscribeResponse out;
      int64_t earliest = 0;
      (void)broker.Read(&reader.value(), std::chrono::milliseconds(0), &out, &earliest);
      break;
    }
    case 3: {
      v1::SendRequest r;
      if (!r.ParseFromArray(body, len)) return 0;
      v1::SendResponse resp;
      (void)broker.Send("b", r, &resp);
      break;
    }
    case 4: {
      v1::ReceiveRequest r;
      if (!r.ParseFromArray(body, len)) return 0;
      v1::SubscribeResponse::Header h;
      auto reader = broker.OpenInboxReader("a", r, &h);
      if (!reader.ok()) return 0;
      v1::SubscribeResponse out;
      int64_t earliest = 0;
      (void)broker.Read(&reader.value(), std::chrono::milliseconds(0), &out, &earliest);
      break;
    }
    case 5: {
      v1::ReplyRequest r;
      if (!r.ParseFromArray(body, len)) return 0;
      (void)broker.Reply("a", r);
      break;
    }
    case 6: {
      const std::string_view s(body, static_cast<size_t>(len));
      (void)agentrt::ValidateTopic(s);
      (void)agentrt::ValidateAgentName(s);
      (void)broker.Authenticate(s, s);
      break;
    }
    case 7: {
      auto plan = agentrt::PlanFromJsonString(std::string_view(body, static_cast<size_t>(len)));
      if (plan.ok()) (void)agentrt::AclFromPlan(*plan);
      break;
    }
  }
  return 0;
}
