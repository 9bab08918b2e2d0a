// League: agent-worker's side of the bus in a multi-agent world. It subscribes
// to the weight stream (`weights/<agent>`) of every agent that plays a seat of
// this agent's world,
// keeps the newest snapshot received per seat (decoded on the bus thread), and
// hands them to the training loop, which installs them between env steps. It
// publishes this agent's own snapshots and match results (`results`).
//
// Resume: SubscriptionOffsets() goes into the checkpoint; a restored League
// re-reads from one message before each saved offset, so the snapshot the
// agent was playing against when it saved comes back first.
//
// Thread-safety: the subscription callbacks run on the bus client's threads;
// every public method may be called from the training thread concurrently.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>

#include "common/status.h"
#include "comms/bus_client.h"
#include "learners/policy_snapshot.h"
#include "tools/agent-worker/league_play.h"

namespace agentrt::worker {

inline constexpr char kResultsTopic[] = "results";

class League {
 public:
  // `seats`: seat -> agent whose snapshots play it. `offsets` (topic -> next
  // offset) and the broker `incarnation` they were read from, from a
  // checkpoint; empty to read each topic from its start.
  static Result<std::unique_ptr<League>> Start(std::unique_ptr<BusClient> bus,
                                               const std::map<int, std::string>& seats,
                                               const std::map<std::string, int64_t>& offsets,
                                               uint64_t incarnation);
  ~League();

  // Moves the snapshots received since the last call into `out` (seat -> newest).
  void TakeNew(std::map<int, PolicySnapshot>& out);

  // Safety net against a subscription stream that stalls: at most every
  // `period`, compares each topic's end offset (ListTopics) with what the
  // stream delivered; a topic that is behind and quiet for `period` has its
  // newest message fetched directly (counted in stream_stalls()). Called by
  // the training thread; costs one RPC per period when the streams are healthy.
  void CatchUp(std::chrono::milliseconds period = std::chrono::seconds(2));

  // Publishes asynchronously (acknowledged in the background; failures are
  // counted and logged, training does not wait on the bus). A snapshot is a
  // version of this agent's weight stream, published from restart
  // `incarnation`; small, it goes as one message, not through a stream's slots.
  void PublishSnapshot(const PolicySnapshot& snapshot, int64_t incarnation);
  void PublishResult(const nlohmann::json& result);

  std::map<std::string, int64_t> SubscriptionOffsets() const { return bus_->SubscriptionOffsets(); }
  uint64_t SubscriptionIncarnation() const { return bus_->SubscriptionIncarnation(); }
  BusClient& bus() { return *bus_; }

  // This agent's newest snapshot the broker has acknowledged (none yet: empty).
  std::optional<SnapshotRef> newest_published() const;

  int64_t snapshots_received() const { return received_.load(); }
  int64_t snapshots_rejected() const { return rejected_.load(); }
  int64_t published() const { return published_.load(); }
  int64_t publish_failures() const { return publish_failures_.load(); }
  int64_t stream_stalls() const { return stalls_.load(); }

 private:
  explicit League(std::unique_ptr<BusClient> bus) : bus_(std::move(bus)) {}
  void OnMessage(int seat, const BusMessage& message);
  // A snapshot's publish acknowledged (or failed): the newest published moves.
  void OnPublished(const std::string& topic, int64_t step, const Result<PublishAck>& ack);

  std::unique_ptr<BusClient> bus_;
  mutable std::mutex mu_;
  std::map<int, PolicySnapshot> fresh_;          // guarded by mu_
  std::optional<SnapshotRef> newest_published_;  // guarded by mu_
  struct SeatState {
    int64_t offset = -1;  // newest message taken
    std::chrono::steady_clock::time_point received;
  };
  std::map<int, SeatState> seat_state_;  // guarded by mu_
  std::map<std::string, int>
      seat_of_topic_;  // filled before the first subscription; read-only after
  std::chrono::steady_clock::time_point last_check_{};
  std::atomic<int64_t> stalls_{0};
  std::atomic<int64_t> received_{0};
  std::atomic<int64_t> rejected_{0};
  std::atomic<int64_t> published_{0};
  std::atomic<int64_t> publish_failures_{0};
};

}  // namespace agentrt::worker
