// FlightRecorder: the last collectives of one rank's Group, for hang reports.
//
// Every collective a Group runs is recorded when it starts (op, sequence
// number from 1, bytes, dtype, start time) and when it ends (end time, done or
// failed), in a fixed ring of kCapacity records: nothing is allocated per
// call. The rank's heartbeats carry Current() and the newest records
// (Runtime), so the controller sees which collective each rank is in, and for
// how long, and can tell a rank that never entered a collective its peers wait
// in (comms/telemetry.h, "collective"; scheduler/run_controller.h).
//
// Thread-safe: the training thread records while the heartbeat thread reads
// (a mutex held for a few stores; never across the collective itself).
#pragma once

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string_view>

#include "agent_runtime/group.h"
#include "plan/records.h"

namespace agentrt {

struct CollectiveRecord {
  enum class State : uint8_t { kRunning, kDone, kFailed };
  uint64_t seq = 0;  // 0: an empty slot
  CollectiveOp op = CollectiveOp::kAllReduce;
  DataType dtype = DataType::kFloat32;
  uint64_t bytes = 0;
  double start_unix_s = 0;
  double end_unix_s = 0;  // 0 while running
  // Its start by the steady clock: durations (time inside, busy time) come
  // from it, so a step of the node's wall clock does not make a collective
  // look hung (or hide a hang); the wall times are for people.
  std::chrono::steady_clock::time_point start_steady{};
  State state = State::kRunning;
};

class FlightRecorder {
 public:
  static constexpr size_t kCapacity = 64;

  // A collective starts; returns its sequence number.
  uint64_t Begin(CollectiveOp op, uint64_t bytes, DataType dtype);
  // Collective `seq` ended.
  void End(uint64_t seq, bool ok);

  // The last collective started, whether the rank is inside it, and the
  // `recent` newest calls, oldest first (plan/records.h). Allocates: for the
  // heartbeat thread, never the training loop.
  CollectiveSnapshot Snapshot(size_t recent = 16) const;

 private:
  mutable std::mutex mu_;
  std::array<CollectiveRecord, kCapacity> ring_{};
  uint64_t last_seq_ = 0;
  double busy_s_ = 0;  // seconds spent in finished collectives, in all
};

// `group` with every collective recorded in `recorder` (which must outlive it).
std::unique_ptr<Group> RecordCollectives(std::unique_ptr<Group> group, FlightRecorder* recorder);

}  // namespace agentrt
