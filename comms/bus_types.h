// Types of the message bus that the client, the broker and the server share
// (and embedders see through comms/bus_client.h), without the broker itself.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace agentrt {

// Counters reported by Stats (a snapshot).
struct BusStats {
  uint64_t incarnation = 0;
  int64_t topics = 0;
  int64_t messages_published = 0;
  int64_t duplicates_dropped = 0;
  int64_t messages_delivered = 0;
  int64_t messages_expired = 0;
  int64_t retained_bytes = 0;
  int64_t active_streams = 0;
  int64_t rejected_unauthenticated = 0;
  int64_t rejected_permission = 0;
  int64_t rejected_invalid = 0;
  int64_t log_sync_errors = 0;  // the durable log's failed background fsyncs
};

// Broker incarnations are random, non-zero and never this value, which stands
// for "subscriptions read from more than one incarnation" (a restore from it
// is told the broker restarted).
inline constexpr uint64_t kMixedIncarnation = ~uint64_t{0};

// The log name of `agent`'s inbox: "@inbox/<agent>" (a name no topic can have).
std::string InboxName(std::string_view agent);

}  // namespace agentrt
