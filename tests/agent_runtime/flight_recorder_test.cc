// FlightRecorder (agent_runtime/flight_recorder.h) and the nccl-tests bandwidth
// formulas (agent_runtime/bandwidth.h). This binary replaces operator new to
// count allocations: recording a collective allocates nothing.
#include "agent_runtime/flight_recorder.h"

#include <atomic>
#include <catch2/catch.hpp>
#include <cstdlib>
#include <new>

#include "agent_runtime/bandwidth.h"
#include "tests/common/counting_new.h"

namespace agentrt {

TEST_CASE("the recorder numbers collectives, says which one runs, and keeps the newest") {
  FlightRecorder rec;
  CHECK(rec.Snapshot().seq == 0);
  CHECK_FALSE(rec.Snapshot().in);
  for (int i = 0; i < 100; ++i) {
    const uint64_t seq = rec.Begin(CollectiveOp::kAllReduce, 4096, DataType::kFloat32);
    CHECK(seq == static_cast<uint64_t>(i + 1));
    rec.End(seq, true);
  }
  const uint64_t running = rec.Begin(CollectiveOp::kBarrier, 0, DataType::kFloat32);
  const CollectiveSnapshot s = rec.Snapshot(16);
  CHECK(s.seq == 101);
  CHECK(s.in);
  CHECK(s.op == "barrier");
  // Time inside, by the steady clock (a wall-clock step does not change it).
  CHECK(s.in_for_s >= 0);
  CHECK(s.in_for_s < 60);
  CHECK(s.busy_s >= 0);
  REQUIRE(s.recent.size() == 16);
  CHECK(s.recent.front().seq == 86);  // oldest first
  CHECK(s.recent.back().seq == 101);
  CHECK(s.recent.back().state == "running");
  CHECK(s.recent[0].state == "done");
  CHECK(s.recent[0].bytes == 4096);
  CHECK(s.recent[0].dtype == "float32");
  // What a heartbeat carries reads back as it was.
  CHECK(CollectiveSnapshot::FromJson(s.ToJson())->ToJson() == s.ToJson());
  rec.End(running, false);
  CHECK_FALSE(rec.Snapshot().in);
  CHECK(rec.Snapshot().in_for_s == -1);  // not inside one: not sent
  CHECK_FALSE(rec.Snapshot().ToJson().contains("in_for_s"));
  CHECK(rec.Snapshot(200).recent.size() == FlightRecorder::kCapacity);
  CHECK(rec.Snapshot(1).recent[0].state == "failed");
}

TEST_CASE("a recorded group records every call, and recording allocates nothing") {
  FlightRecorder rec;
  auto group = RecordCollectives(MakeSingleRankGroup("a"), &rec);
  float buf[8] = {};
  REQUIRE(group->AllReduce(buf, 8, DataType::kFloat32, ReduceOp::kSum).ok());  // warm-up
  const long before = agentrt::testing::AllocationCount();
  for (int i = 0; i < 1000; ++i) {
    REQUIRE(group->AllReduce(buf, 8, DataType::kFloat32, ReduceOp::kSum).ok());
    REQUIRE(group->Barrier().ok());
  }
  CHECK(agentrt::testing::AllocationCount() - before == 0);
  const CollectiveSnapshot s = rec.Snapshot(2);
  CHECK(s.seq == 2001);
  CHECK(s.recent[0].op == "all_reduce");
  CHECK(s.recent[0].bytes == 32);
  CHECK(s.recent[1].op == "barrier");
  // The counter does see allocations (the check above can fail).
  const long counted = agentrt::testing::AllocationCount();
  auto* p = new int(3);
  CHECK(agentrt::testing::AllocationCount() - counted == 1);
  delete p;
}

TEST_CASE("bus bandwidth factors are nccl-tests'") {
  CHECK(BusBandwidthFactor(CollectiveOp::kAllReduce, 2) == 1.0);
  CHECK(BusBandwidthFactor(CollectiveOp::kAllReduce, 4) == 1.5);
  CHECK(BusBandwidthFactor(CollectiveOp::kAllReduce, 8) == 1.75);
  CHECK(BusBandwidthFactor(CollectiveOp::kReduceScatter, 4) == 0.75);
  CHECK(BusBandwidthFactor(CollectiveOp::kAllGather, 8) == 0.875);
  CHECK(BusBandwidthFactor(CollectiveOp::kBroadcast, 8) == 1.0);
  CHECK(BusBandwidthFactor(CollectiveOp::kAllReduce, 1) == 0.0);
  CHECK(AlgBandwidthGBps(2e9, 0.5) == 4.0);
}

}  // namespace agentrt
