#include <catch2/catch.hpp>
#include <cstdint>
#include <vector>

#include "agent_runtime/group.h"
#include "agent_runtime/group_half.h"

namespace agentrt {
namespace {

TEST_CASE("single-rank group is rank 0 of 1 on host buffers") {
  auto group = MakeSingleRankGroup("solo");
  CHECK(group->rank() == 0);
  CHECK(group->size() == 1);
  CHECK(group->backend() == "single");
  CHECK_FALSE(group->device_buffers());
}

TEST_CASE("single-rank collectives leave or copy the data unchanged") {
  auto group = MakeSingleRankGroup("solo");
  std::vector<float> x = {1.5f, -2.0f, 3.25f};
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax}) {
    REQUIRE(group->AllReduce(x.data(), x.size(), DataType::kFloat32, op).ok());
  }
  CHECK(x == std::vector<float>{1.5f, -2.0f, 3.25f});

  std::vector<int64_t> src = {7, 8, 9};
  std::vector<int64_t> dst(3, 0);
  REQUIRE(group->ReduceScatter(src.data(), dst.data(), 3, DataType::kInt64, ReduceOp::kSum).ok());
  CHECK(dst == src);
  std::vector<int64_t> gathered(3, 0);
  REQUIRE(group->AllGather(src.data(), gathered.data(), 3, DataType::kInt64).ok());
  CHECK(gathered == src);
  REQUIRE(group->Broadcast(x.data(), x.size(), DataType::kFloat32, 0).ok());
  REQUIRE(group->Barrier().ok());
}

TEST_CASE("single-rank group rejects a bad root and null buffers, naming the agent") {
  auto group = MakeSingleRankGroup("solo");
  float x = 1.0f;
  Status s = group->Broadcast(&x, 1, DataType::kFloat32, 1);
  CHECK(s.code() == StatusCode::kInvalidArgument);
  CHECK_THAT(s.message(), Catch::Contains("agent solo rank 0") && Catch::Contains("root 1"));
  s = group->AllReduce(nullptr, 4, DataType::kFloat32, ReduceOp::kSum);
  CHECK(s.code() == StatusCode::kInvalidArgument);
  CHECK_THAT(s.message(), Catch::Contains("allreduce"));
}

TEST_CASE("MakeGroup picks single for one CPU rank and refuses single for several") {
  GroupOptions o;
  o.agent = "a";
  auto g = MakeGroup(o);
  REQUIRE(g.ok());
  CHECK((*g)->backend() == "single");
  o.backend = GroupBackend::kSingle;
  o.world_size = 2;
  auto bad = MakeGroup(o);
  REQUIRE_FALSE(bad.ok());
  CHECK_THAT(bad.status().message(), Catch::Contains("WORLD_SIZE is 2"));
}

TEST_CASE("data type sizes and names") {
  CHECK(DataTypeSize(DataType::kFloat32) == 4);
  CHECK(DataTypeSize(DataType::kBFloat16) == 2);
  CHECK(DataTypeSize(DataType::kFloat16) == 2);
  CHECK(DataTypeSize(DataType::kInt64) == 8);
  CHECK(DataTypeName(DataType::kBFloat16) == "bfloat16");
  CHECK(ReduceOpName(ReduceOp::kAvg) == "avg");
}

TEST_CASE("half-precision conversions round to nearest even and keep exact values") {
  using internal::BF16ToFloat;
  using internal::F16ToFloat;
  using internal::FloatToBF16;
  using internal::FloatToF16;
  for (float f : {0.0f, 1.0f, -2.5f, 65504.0f, 0.099975586f}) {
    CHECK(F16ToFloat(FloatToF16(f)) == f);
  }
  CHECK(F16ToFloat(FloatToF16(1e6f)) == std::numeric_limits<float>::infinity());
  CHECK(F16ToFloat(FloatToF16(5.9604645e-08f)) == 5.9604645e-08f);  // smallest subnormal
  CHECK(BF16ToFloat(FloatToBF16(3.0f)) == 3.0f);
  CHECK(BF16ToFloat(FloatToBF16(1.00390625f)) == 1.0f);  // halfway: ties to even
  CHECK(BF16ToFloat(FloatToBF16(1.01171875f)) == 1.015625f);
}

}  // namespace
}  // namespace agentrt
