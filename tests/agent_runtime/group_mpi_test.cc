// Runs under `mpirun -np N` (N = 2, 3, 4): every rank executes the same test
// cases in the same order, so each collective below meets its peers.
#include <catch2/catch.hpp>
#include <cstdint>
#include <memory>
#include <numeric>
#include <vector>

#include "agent_runtime/group.h"
#include "agent_runtime/group_half.h"
#include "agent_runtime/mpi_group.h"
#include "tests/agent_runtime/group_test_util.h"

namespace agentrt {
namespace {

constexpr Timeout kTimeout = std::chrono::seconds(60);

Group& World() { return MpiWorld("mpi-test"); }

TEST_CASE("mpi group has every rank of the world") {
  Group& g = World();
  CHECK(g.backend() == "mpi");
  CHECK_FALSE(g.device_buffers());
  CHECK(g.size() >= 2);
  int64_t ranks[2] = {g.rank(), 1};
  REQUIRE(g.AllReduce(ranks, 2, DataType::kInt64, ReduceOp::kSum, kTimeout).ok());
  CHECK(ranks[0] == int64_t{g.size()} * (g.size() - 1) / 2);
  CHECK(ranks[1] == g.size());
}

TEST_CASE("mpi allreduce sums, averages and maxes float32 and int64") {
  Group& g = World();
  const int n = g.size();
  const int r = g.rank();
  const size_t count = 1000;
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax}) {
    std::vector<float> f(count);
    std::vector<int64_t> i64(count);
    for (size_t i = 0; i < count; ++i) {
      f[i] = static_cast<float>((r + 1) * static_cast<int>(i % 7));
      i64[i] = (int64_t{1} << 40) * (r + 1) + static_cast<int64_t>(i);
    }
    REQUIRE(g.AllReduce(f.data(), count, DataType::kFloat32, op, kTimeout).ok());
    REQUIRE(g.AllReduce(i64.data(), count, DataType::kInt64, op, kTimeout).ok());
    const int64_t rank_sum = int64_t{n} * (n + 1) / 2;
    for (size_t i = 0; i < count; ++i) {
      const float base = static_cast<float>(i % 7);
      const int64_t ibase = static_cast<int64_t>(i);
      switch (op) {
        case ReduceOp::kSum:
          REQUIRE(f[i] == Approx(base * static_cast<float>(rank_sum)));
          REQUIRE(i64[i] == (int64_t{1} << 40) * rank_sum + ibase * n);
          break;
        case ReduceOp::kAvg:
          REQUIRE(f[i] == Approx(base * static_cast<float>(rank_sum) / static_cast<float>(n)));
          REQUIRE(i64[i] == ((int64_t{1} << 40) * rank_sum + ibase * n) / n);
          break;
        case ReduceOp::kMax:
          REQUIRE(f[i] == base * static_cast<float>(n));
          REQUIRE(i64[i] == (int64_t{1} << 40) * n + ibase);
          break;
      }
    }
  }
}

TEST_CASE("mpi allreduce reduces bfloat16 and float16") {
  Group& g = World();
  const int n = g.size();
  std::vector<uint16_t> bf(64);
  std::vector<uint16_t> hf(64);
  for (size_t i = 0; i < bf.size(); ++i) {
    const float x = 0.25f * static_cast<float>(i) * static_cast<float>(g.rank() + 1);
    bf[i] = internal::FloatToBF16(x);
    hf[i] = internal::FloatToF16(x);
  }
  std::vector<uint16_t> bf_max = bf;
  REQUIRE(g.AllReduce(bf.data(), bf.size(), DataType::kBFloat16, ReduceOp::kSum, kTimeout).ok());
  REQUIRE(g.AllReduce(hf.data(), hf.size(), DataType::kFloat16, ReduceOp::kAvg, kTimeout).ok());
  REQUIRE(g.AllReduce(bf_max.data(), bf_max.size(), DataType::kBFloat16, ReduceOp::kMax, kTimeout)
              .ok());
  const float rank_sum = static_cast<float>(n * (n + 1) / 2);
  for (size_t i = 0; i < bf.size(); ++i) {
    const float base = 0.25f * static_cast<float>(i);
    CHECK(internal::BF16ToFloat(bf[i]) == Approx(base * rank_sum).epsilon(0.02));
    CHECK(internal::F16ToFloat(hf[i]) ==
          Approx(base * rank_sum / static_cast<float>(n)).epsilon(0.005));
    CHECK(internal::BF16ToFloat(bf_max[i]) == Approx(base * static_cast<float>(n)).epsilon(0.01));
  }
}

TEST_CASE("mpi reduce-scatter gives rank r the reduced block r") {
  Group& g = World();
  const size_t block = 513;
  const size_t n = static_cast<size_t>(g.size());
  std::vector<float> send(block * n);
  for (size_t i = 0; i < send.size(); ++i)
    send[i] = static_cast<float>(i) + static_cast<float>(g.rank());
  std::vector<float> recv(block, -1.0f);
  REQUIRE(
      g.ReduceScatter(send.data(), recv.data(), block, DataType::kFloat32, ReduceOp::kSum, kTimeout)
          .ok());
  const float rank_sum = static_cast<float>(n * (n - 1) / 2);
  for (size_t i = 0; i < block; ++i) {
    const size_t global = static_cast<size_t>(g.rank()) * block + i;
    REQUIRE(recv[i] == static_cast<float>(n) * static_cast<float>(global) + rank_sum);
  }
  REQUIRE(
      g.ReduceScatter(send.data(), recv.data(), block, DataType::kFloat32, ReduceOp::kAvg, kTimeout)
          .ok());
  const size_t global0 = static_cast<size_t>(g.rank()) * block;
  CHECK(recv[0] == Approx(static_cast<float>(global0) + rank_sum / static_cast<float>(n)));
}

TEST_CASE("mpi reduce-scatter maxes int64 and sums bfloat16") {
  Group& g = World();
  const size_t block = 37;
  const size_t n = static_cast<size_t>(g.size());
  std::vector<int64_t> send(block * n);
  std::vector<uint16_t> half(block * n);
  for (size_t i = 0; i < send.size(); ++i) {
    send[i] = static_cast<int64_t>(i) * (g.rank() == 1 ? 3 : 1);
    half[i] = internal::FloatToBF16(static_cast<float>(g.rank() + 1));
  }
  std::vector<int64_t> recv(block, -1);
  std::vector<uint16_t> half_recv(block, 0);
  REQUIRE(
      g.ReduceScatter(send.data(), recv.data(), block, DataType::kInt64, ReduceOp::kMax, kTimeout)
          .ok());
  REQUIRE(g.ReduceScatter(half.data(), half_recv.data(), block, DataType::kBFloat16, ReduceOp::kSum,
                          kTimeout)
              .ok());
  const float rank_sum = static_cast<float>(n * (n + 1) / 2);
  for (size_t i = 0; i < block; ++i) {
    const int64_t global = static_cast<int64_t>(static_cast<size_t>(g.rank()) * block + i);
    REQUIRE(recv[i] == global * 3);
    REQUIRE(internal::BF16ToFloat(half_recv[i]) == rank_sum);
  }
}

TEST_CASE("mpi all-gather collects every rank's block, also in place") {
  Group& g = World();
  const size_t block = 1000;
  const size_t n = static_cast<size_t>(g.size());
  std::vector<int64_t> mine(block);
  std::iota(mine.begin(), mine.end(), int64_t{g.rank()} * 1000000);
  std::vector<int64_t> all(block * n, -1);
  REQUIRE(g.AllGather(mine.data(), all.data(), block, DataType::kInt64, kTimeout).ok());
  for (size_t r = 0; r < n; ++r) {
    REQUIRE(all[r * block] == static_cast<int64_t>(r) * 1000000);
    REQUIRE(all[r * block + block - 1] ==
            static_cast<int64_t>(r) * 1000000 + static_cast<int64_t>(block) - 1);
  }
  std::vector<int64_t> in_place(block * n, -1);
  std::copy(mine.begin(), mine.end(), in_place.begin() + static_cast<ptrdiff_t>(g.rank() * block));
  REQUIRE(g.AllGather(in_place.data() + g.rank() * block, in_place.data(), block, DataType::kInt64,
                      kTimeout)
              .ok());
  CHECK(in_place == all);
}

TEST_CASE("mpi broadcast copies the root's buffer to every rank") {
  Group& g = World();
  const int root = g.size() - 1;
  std::vector<float> buf(4096, static_cast<float>(g.rank()));
  if (g.rank() == root) buf[17] = 42.0f;
  REQUIRE(g.Broadcast(buf.data(), buf.size(), DataType::kFloat32, root, kTimeout).ok());
  CHECK(buf[0] == static_cast<float>(root));
  CHECK(buf[17] == 42.0f);
  CHECK(g.Broadcast(buf.data(), buf.size(), DataType::kFloat32, g.size(), kTimeout).code() ==
        StatusCode::kInvalidArgument);
  REQUIRE(g.Barrier(kTimeout).ok());
}

TEST_CASE("mpi allreduce of a large buffer is exact") {
  Group& g = World();
  const size_t count = size_t{3} << 20;  // 12 MiB of float32
  std::vector<float> buf(count, static_cast<float>(g.rank() + 1));
  REQUIRE(g.AllReduce(buf.data(), count, DataType::kFloat32, ReduceOp::kSum, kTimeout).ok());
  const float expect = static_cast<float>(g.size() * (g.size() + 1) / 2);
  CHECK(buf.front() == expect);
  CHECK(buf[count / 2] == expect);
  CHECK(buf.back() == expect);
}

TEST_CASE("a second mpi group of the same process is its own communicator") {
  GroupOptions o;
  o.backend = GroupBackend::kMpi;
  o.agent = "mpi-test-2";
  auto second = MakeGroup(o);
  REQUIRE(second.ok());
  Group& g = World();
  float a = 1.0f;
  float b = 10.0f;
  REQUIRE((*second)->AllReduce(&b, 1, DataType::kFloat32, ReduceOp::kSum, kTimeout).ok());
  REQUIRE(g.AllReduce(&a, 1, DataType::kFloat32, ReduceOp::kSum, kTimeout).ok());
  CHECK(a == static_cast<float>(g.size()));
  CHECK(b == 10.0f * static_cast<float>(g.size()));
}

TEST_CASE("mpi group refuses a WORLD_SIZE that disagrees with mpirun") {
  GroupOptions o;
  o.backend = GroupBackend::kMpi;
  o.agent = "mismatch";
  o.world_size = World().size() + 1;
  o.rank = World().rank();
  auto g = MakeGroup(o);
  REQUIRE_FALSE(g.ok());
  CHECK(g.status().code() == StatusCode::kFailedPrecondition);
  CHECK_THAT(g.status().message(),
             Catch::Contains("agent mismatch") && Catch::Contains("WORLD_SIZE"));
}

}  // namespace
}  // namespace agentrt
