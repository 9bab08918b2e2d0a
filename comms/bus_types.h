// Types of the message bus that the client, the broker and the server share
// (and embedders see through comms/bus_client.h), without the broker itself.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace agentrt {

// Every counter Stats reports, declared once as X(type, name): BusStats below,
// and StatsResponse in comms/proto/bus.proto has a field of each name (the
// server and the client convert through this list).
#define AGENTRT_BUS_STATS(X)                                                   \
  X(uint64_t, incarnation)                                                     \
  X(int64_t, topics)                                                           \
  X(int64_t, messages_published)                                               \
  X(int64_t, duplicates_dropped)                                               \
  X(int64_t, messages_delivered)                                               \
  X(int64_t, messages_expired)                                                 \
  X(int64_t, retained_bytes)                                                   \
  X(int64_t, active_streams)                                                   \
  X(int64_t, rejected_unauthenticated)                                         \
  X(int64_t, rejected_permission)                                              \
  X(int64_t, rejected_invalid)                                                 \
  X(int64_t, log_sync_errors) /* the durable log's failed background fsyncs */ \
  X(int64_t, large_adopted)   /* payloads stored from the spool */             \
  X(int64_t, large_streamed)  /* large payloads stored from chunks */

// Counters reported by Stats (a snapshot).
struct BusStats {
#define AGENTRT_BUS_STAT_FIELD(type, name) type name = 0;
  AGENTRT_BUS_STATS(AGENTRT_BUS_STAT_FIELD)
#undef AGENTRT_BUS_STAT_FIELD
};

// Broker incarnations are random, non-zero and never this value, which stands
// for "subscriptions read from more than one incarnation" (a restore from it
// is told the broker restarted).
inline constexpr uint64_t kMixedIncarnation = ~uint64_t{0};

// The log name of `agent`'s inbox: "@inbox/<agent>" (a name no topic can have).
std::string InboxName(std::string_view agent);

}  // namespace agentrt
