#include "comms/bus_validate.h"

#include <cstdint>
#include <cstdio>
#include <string>

#include "comms/packed_entries.h"

namespace agentrt {
namespace {

bool NameByte(char c, bool allow_slash_at) {
  if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9')) return true;
  if (c == '.' || c == '_' || c == '-' || c == ':') return true;
  return allow_slash_at && (c == '/' || c == '@');
}

Status CheckName(std::string_view what, std::string_view s, size_t max, bool topic) {
  if (s.empty()) return InvalidArgument(std::string(what) + " is empty");
  if (s.size() > max) {
    return InvalidArgument(std::string(what) + " \"" + Printable(s) + "\" is " +
                           std::to_string(s.size()) + " bytes; at most " + std::to_string(max) +
                           " are allowed");
  }
  for (size_t i = 0; i < s.size(); ++i) {
    if (!NameByte(s[i], topic)) {
      return InvalidArgument(std::string(what) + " \"" + Printable(s) +
                             "\" has a byte not allowed at position " + std::to_string(i) +
                             " (allowed: letters, digits and ._-:" + (topic ? "/@" : "") + ")");
    }
  }
  return Status::Ok();
}

Status OverLimit(int64_t payload, const BusLimits& limits) {
  if (payload <= limits.max_message_bytes) return Status::Ok();
  return ResourceExhausted(
      "payload of " + std::to_string(payload) + " bytes exceeds the bus limit of " +
      std::to_string(limits.max_message_bytes) + " bytes (bus.max_message_bytes)");
}

Status CheckPayload(size_t payload, size_t content_type, const BusLimits& limits) {
  AGENTRT_RETURN_IF_ERROR(OverLimit(static_cast<int64_t>(payload), limits));
  if (static_cast<int64_t>(payload) > kMaxInlineBytes) {
    return ResourceExhausted("payload of " + std::to_string(payload) +
                             " bytes is more than one call carries (" +
                             std::to_string(kMaxInlineBytes) +
                             " bytes): publish it to a topic, in chunks (PublishLarge; the agentrt "
                             "client does so by itself)");
  }
  if (content_type > kMaxContentTypeBytes) {
    return InvalidArgument("content_type is " + std::to_string(content_type) + " bytes; at most " +
                           std::to_string(kMaxContentTypeBytes) + " are allowed");
  }
  return Status::Ok();
}

Status CheckSequence(uint64_t publisher_id, uint64_t sequence) {
  if (publisher_id != 0 && sequence == 0) {
    return InvalidArgument("sequence must be > 0 when publisher_id is set (publisher_id " +
                           std::to_string(publisher_id) + ")");
  }
  return Status::Ok();
}

Status CheckBatch(int32_t max_batch_messages, const BusLimits& limits) {
  if (max_batch_messages < 0 || max_batch_messages > limits.max_batch_messages) {
    return InvalidArgument("max_batch_messages " + std::to_string(max_batch_messages) +
                           " is outside [0, " + std::to_string(limits.max_batch_messages) + "]");
  }
  return Status::Ok();
}

}  // namespace

std::string Printable(std::string_view s, size_t max_bytes) {
  std::string out;
  for (char c : s.substr(0, max_bytes)) {
    if (c >= 0x20 && c < 0x7f) {
      out.push_back(c);
    } else {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", static_cast<unsigned char>(c));
      out += buf;
    }
  }
  if (s.size() > max_bytes) out += "...";
  return out;
}

Status ValidateTopic(std::string_view topic) {
  AGENTRT_RETURN_IF_ERROR(CheckName("topic", topic, kMaxTopicBytes, /*topic=*/true));
  if (topic.front() == '@') {
    return InvalidArgument("topic \"" + Printable(topic) +
                           "\" starts with '@', which is reserved for inboxes");
  }
  return Status::Ok();
}

Status ValidateAgentName(std::string_view agent) {
  return CheckName("agent name", agent, kMaxAgentNameBytes, /*topic=*/false);
}

Status ValidateStartAt(const bus::v1::StartAt& start) {
  switch (start.position_case()) {
    case bus::v1::StartAt::kOffset:
      if (start.offset() < 0)
        return InvalidArgument("start offset " + std::to_string(start.offset()) + " is negative");
      return Status::Ok();
    case bus::v1::StartAt::kEarliest:
    case bus::v1::StartAt::kLatest:
    case bus::v1::StartAt::POSITION_NOT_SET:
      return Status::Ok();
  }
  return InvalidArgument("unknown start position");
}

Status ValidatePublish(const bus::v1::PublishRequest& req, const BusLimits& limits) {
  if (IsSpooledEntry(req)) {
    return InvalidArgument(
        "spooled_name and spooled_size belong to entries of PublishBatch and PublishStream");
  }
  AGENTRT_RETURN_IF_ERROR(ValidateTopic(req.topic()));
  AGENTRT_RETURN_IF_ERROR(CheckPayload(req.payload().size(), req.content_type().size(), limits));
  if (!req.publisher().empty()) AGENTRT_RETURN_IF_ERROR(ValidateAgentName(req.publisher()));
  return CheckSequence(req.publisher_id(), req.sequence());
}

Status ValidatePublishHead(const bus::v1::PublishChunk& first, const BusLimits& limits) {
  if (!first.has_head()) return InvalidArgument("the first chunk of a large publish has no head");
  if (!first.head().payload().empty())
    return InvalidArgument("the head of a large publish carries a payload (send it as data)");
  AGENTRT_RETURN_IF_ERROR(ValidatePublish(first.head(), limits));
  if (first.size() <= 0) {
    return InvalidArgument("a large publish of " + std::to_string(first.size()) +
                           " bytes (size must be > 0)");
  }
  return OverLimit(first.size(), limits);
}

Status ValidateBatchEntry(const bus::v1::PublishRequest& req, const BusLimits& limits) {
  if (!IsSpooledEntry(req)) return ValidatePublish(req, limits);
  if (!req.payload().empty())
    return InvalidArgument("a spooled entry carries a payload (its bytes are the spool file's)");
  if (req.spooled_name().empty() || req.spooled_size() <= 0) {
    return InvalidArgument("a spooled entry needs both spooled_name and spooled_size > 0 (size " +
                           std::to_string(req.spooled_size()) + ")");
  }
  bus::v1::PublishRequest head = req;
  head.clear_spooled_name();
  head.clear_spooled_size();
  head.clear_spooled_crc32c();
  AGENTRT_RETURN_IF_ERROR(ValidatePublish(head, limits));
  return OverLimit(req.spooled_size(), limits);
}

Status ValidatePackedEntries(const bus::v1::PackedEntries& packed, const BusLimits& limits,
                             int* first_bad) {
  if (first_bad != nullptr) *first_bad = 0;  // what concerns them all: no entry is good
  AGENTRT_RETURN_IF_ERROR(ValidateTopic(packed.topic()));
  if (packed.count() <= 0 || packed.count() > limits.max_batch_messages) {
    return InvalidArgument("packed entries: count " + std::to_string(packed.count()) +
                           " is outside [1, " + std::to_string(limits.max_batch_messages) + "]");
  }
  AGENTRT_RETURN_IF_ERROR(CheckPayload(0, packed.content_type().size(), limits));
  AGENTRT_RETURN_IF_ERROR(CheckSequence(packed.publisher_id(), packed.first_sequence()));
  if (packed.first_sequence() > UINT64_MAX - static_cast<uint64_t>(packed.count() - 1)) {
    return InvalidArgument("packed entries: first_sequence " +
                           std::to_string(packed.first_sequence()) + " + count overflows");
  }
  // The framing first (a torn field stores nothing), then the first entry
  // whose payload is refused (those before it are good).
  PackedEntryReader reader(packed.payloads());
  std::string_view payload;
  int n = 0, bad = -1;
  Status refused;
  while (n < packed.count() && reader.Next(&payload)) {
    if (bad < 0) {
      refused = CheckPayload(payload.size(), packed.content_type().size(), limits);
      if (!refused.ok()) bad = n;
    }
    ++n;
  }
  if (reader.malformed() || n != packed.count() || reader.remaining() != 0) {
    std::string what = "packed entries: count says " + std::to_string(packed.count()) +
                       ", payloads hold " + std::to_string(n) + " well-formed entries";
    if (reader.malformed()) {
      what += " and then a torn one";
    } else if (reader.remaining() != 0) {
      what += " and " + std::to_string(reader.remaining()) + " bytes more";
    }
    return InvalidArgument(what);
  }
  if (bad >= 0) {
    if (first_bad != nullptr) *first_bad = bad;
    return refused.WithContext("packed entry " + std::to_string(bad));
  }
  if (first_bad != nullptr) *first_bad = packed.count();
  return Status::Ok();
}

Status ValidatePublishBatch(const bus::v1::PublishBatchRequest& req, const BusLimits& limits) {
  if (req.has_packed()) {
    if (req.messages_size() != 0) {
      return InvalidArgument(
          "PublishBatch carries both messages and packed entries (one or the "
          "other)");
    }
    return ValidatePackedEntries(req.packed(), limits);
  }
  if (req.messages_size() == 0) return InvalidArgument("PublishBatch has no messages");
  if (req.messages_size() > limits.max_batch_messages) {
    return InvalidArgument("PublishBatch has " + std::to_string(req.messages_size()) +
                           " messages; at most " + std::to_string(limits.max_batch_messages) +
                           " are allowed");
  }
  for (int i = 0; i < req.messages_size(); ++i) {
    Status s = ValidateBatchEntry(req.messages(i), limits);
    if (!s.ok()) return s.WithContext("messages[" + std::to_string(i) + "]");
  }
  return Status::Ok();
}

Status ValidateSubscribe(const bus::v1::SubscribeRequest& req, const BusLimits& limits) {
  AGENTRT_RETURN_IF_ERROR(ValidateTopic(req.topic()));
  AGENTRT_RETURN_IF_ERROR(ValidateStartAt(req.start()));
  return CheckBatch(req.max_batch_messages(), limits);
}

Status ValidateReceive(const bus::v1::ReceiveRequest& req, const BusLimits& limits) {
  AGENTRT_RETURN_IF_ERROR(ValidateStartAt(req.start()));
  return CheckBatch(req.max_batch_messages(), limits);
}

Status ValidateSend(const bus::v1::SendRequest& req, const BusLimits& limits) {
  AGENTRT_RETURN_IF_ERROR(ValidateAgentName(req.to()).WithContext("to"));
  AGENTRT_RETURN_IF_ERROR(CheckPayload(req.payload().size(), req.content_type().size(), limits));
  return CheckSequence(req.publisher_id(), req.sequence());
}

Status ValidateRequest(const bus::v1::RequestRequest& req, const BusLimits& limits) {
  AGENTRT_RETURN_IF_ERROR(ValidateAgentName(req.to()).WithContext("to"));
  return CheckPayload(req.payload().size(), req.content_type().size(), limits);
}

Status ValidateReply(const bus::v1::ReplyRequest& req, const BusLimits& limits) {
  if (req.request_id() == 0) return InvalidArgument("reply has request_id 0");
  return CheckPayload(req.payload().size(), req.content_type().size(), limits);
}

}  // namespace agentrt
