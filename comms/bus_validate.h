// Validation of bus requests, before the broker touches its state. Pure
// functions of the request and the limits: no I/O, no allocation beyond the
// error message, safe from any thread. Fuzzed by tests/comms/fuzz.
#pragma once

#include <cstdint>
#include <string_view>

#include "common/status.h"
#include "comms/proto/bus.pb.h"

namespace agentrt {

// Limits the broker enforces on every request.
struct BusLimits {
  int64_t max_message_bytes = 4 << 20;  // payload cap (RESOURCE_EXHAUSTED above it)
  int max_batch_messages = 4096;        // entries per PublishBatch / per stream response
};

// The most payload bytes one call carries (Publish, PublishBatch entries,
// Send, Request, Reply). A topic message above it travels as PublishLarge
// chunks of kChunkBytes (the agentrt client chooses by itself), up to
// max_message_bytes, which is at most kMaxMessageBytesCeiling.
inline constexpr int64_t kMaxInlineBytes = 4 << 20;
inline constexpr int64_t kChunkBytes = 2 << 20;
inline constexpr int64_t kMaxMessageBytesCeiling = int64_t{1} << 30;

inline constexpr size_t kMaxTopicBytes = 255;
inline constexpr size_t kMaxAgentNameBytes = 255;
inline constexpr size_t kMaxContentTypeBytes = 255;

// A topic is 1..255 bytes of [A-Za-z0-9._:/@-] and does not start with '@'
// (reserved for inboxes). INVALID_ARGUMENT names the offending byte.
Status ValidateTopic(std::string_view topic);

// `s` safe to print: bytes outside printable ASCII as \xNN, cut after
// `max_bytes` ("..."). Peer bytes never reach a terminal raw.
std::string Printable(std::string_view s, size_t max_bytes = 64);
// Agent names: 1..255 bytes of [A-Za-z0-9._:-].
Status ValidateAgentName(std::string_view agent);

Status ValidateStartAt(const bus::v1::StartAt& start);
Status ValidatePublish(const bus::v1::PublishRequest& req, const BusLimits& limits);
// A PublishBatch/PublishStream entry: as ValidatePublish, or a spooled one
// (spooled_name and spooled_size > 0, no payload).
Status ValidateBatchEntry(const bus::v1::PublishRequest& req, const BusLimits& limits);
inline bool IsSpooledEntry(const bus::v1::PublishRequest& req) {
  return !req.spooled_name().empty() || req.spooled_size() != 0;
}
// The first chunk of a PublishLarge: its head as a publish without payload,
// and a size within max_message_bytes.
Status ValidatePublishHead(const bus::v1::PublishChunk& first, const BusLimits& limits);
// Packed entries (bus.proto): a topic and content type as a publish's,
// count in [1, max_batch_messages], sequences that do not overflow, exactly
// `count` well-formed entries and nothing after them, each payload within
// the limits. *first_bad (when given): the entries before the one the error
// is about (count when none; 0 when it concerns them all).
Status ValidatePackedEntries(const bus::v1::PackedEntries& packed, const BusLimits& limits,
                             int* first_bad = nullptr);
// Its messages (each as ValidateBatchEntry), or its packed entries (not both).
Status ValidatePublishBatch(const bus::v1::PublishBatchRequest& req, const BusLimits& limits);
Status ValidateSubscribe(const bus::v1::SubscribeRequest& req, const BusLimits& limits);
Status ValidateReceive(const bus::v1::ReceiveRequest& req, const BusLimits& limits);
Status ValidateSend(const bus::v1::SendRequest& req, const BusLimits& limits);
Status ValidateRequest(const bus::v1::RequestRequest& req, const BusLimits& limits);
Status ValidateReply(const bus::v1::ReplyRequest& req, const BusLimits& limits);

}  // namespace agentrt
