// Runs under `mpirun -np N` (N = 2, 3, 4): N ranks of ShardedAdam against a
// single-process AdamW on the summed gradients, which every rank recomputes.
#include <catch2/catch.hpp>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "agent_runtime/adamw.h"
#include "agent_runtime/group.h"
#include "agent_runtime/sharded_adam.h"
#include "tests/agent_runtime/group_test_util.h"

namespace agentrt {
namespace {

Group& World() { return MpiWorld("adam-test"); }

std::vector<float> RankGrad(size_t n, int rank, int step) {
  return RandomVector(n, 1000u * static_cast<uint32_t>(step) + static_cast<uint32_t>(rank), 0.3f);
}

// Runs `steps` steps of ShardedAdam on every rank and of AdamW on the summed
// (or averaged) gradients, and compares the parameters.
void CheckEquivalence(size_t n, AdamWOptions o, int steps) {
  Group& g = World();
  const int world = g.size();
  ShardedAdam sharded(g, n, o);
  AdamW reference(n, o);
  std::vector<float> params = RandomVector(n, 7, 1.0f);
  std::vector<float> ref_params = params;
  for (int step = 0; step < steps; ++step) {
    std::vector<float> summed(n, 0.0f);
    for (int r = 0; r < world; ++r) {
      const std::vector<float> gr = RankGrad(n, r, step);
      for (size_t i = 0; i < n; ++i) summed[i] += gr[i];
    }
    if (o.average_grads) {
      for (float& x : summed) x /= static_cast<float>(world);
    }
    const float ref_norm = reference.Step(ref_params.data(), summed.data());
    std::vector<float> grads = RankGrad(n, g.rank(), step);
    float norm = -1.0f;
    REQUIRE(sharded.Step(params.data(), grads.data(), &norm).ok());
    REQUIRE(norm == Approx(ref_norm).epsilon(1e-4));
  }
  for (size_t i = 0; i < n; ++i) {
    INFO("parameter " << i << " of " << n << " on rank " << g.rank());
    REQUIRE(params[i] == Approx(ref_params[i]).epsilon(1e-4).margin(1e-5));
  }
}

TEST_CASE("ShardedAdam over N ranks equals AdamW on the summed gradients") {
  AdamWOptions o;
  o.lr = 1e-2f;
  o.weight_decay = 0.01f;
  SECTION("even size, no clipping") { CheckEquivalence(1200, o, 8); }
  SECTION("uneven size, clipping active") {
    o.max_grad_norm = 1.0f;
    CheckEquivalence(1001, o, 8);
  }
  SECTION("averaged gradients") {
    o.average_grads = true;
    o.max_grad_norm = 0.5f;
    CheckEquivalence(4099, o, 5);
  }
  SECTION("fewer parameters than ranks") { CheckEquivalence(2, o, 3); }
}

TEST_CASE("ShardedAdam state is 1/N of the unsharded state and covers every parameter once") {
  Group& g = World();
  const size_t world = static_cast<size_t>(g.size());
  for (size_t n : {size_t{1000}, size_t{1001}, size_t{3}, size_t{4099}, size_t{1} << 20}) {
    ShardedAdam opt(g, n, AdamWOptions{});
    const size_t unsharded = AdamW(n, AdamWOptions{}).state_bytes();
    CHECK(opt.shard_size() == n / world);
    CHECK(opt.tail_size() == n % world);
    CHECK(opt.shard_offset() == static_cast<size_t>(g.rank()) * (n / world));
    CHECK(opt.state_bytes() == 2 * (opt.shard_size() + opt.tail_size()) * sizeof(float));
    // 1/N of the unsharded state, plus the tail (fewer than N parameters).
    CHECK(opt.state_bytes() <= unsharded / world + 2 * world * sizeof(float));
    if (n % world == 0) CHECK(opt.state_bytes() * world == unsharded);
    // The shards tile [0, n - tail) without overlap: their sizes and offsets add up.
    int64_t covered[2] = {static_cast<int64_t>(opt.shard_size()),
                          static_cast<int64_t>(opt.shard_offset())};
    REQUIRE(g.AllReduce(covered, 2, DataType::kInt64, ReduceOp::kSum).ok());
    CHECK(covered[0] + static_cast<int64_t>(opt.tail_size()) == static_cast<int64_t>(n));
    const int64_t w = static_cast<int64_t>(world);
    CHECK(covered[1] == static_cast<int64_t>(n / world) * w * (w - 1) / 2);
  }
}

TEST_CASE("ShardedAdam shard state restores bit-exactly on every rank") {
  Group& g = World();
  const size_t n = 777;
  AdamWOptions o;
  o.max_grad_norm = 2.0f;
  ShardedAdam a(g, n, o);
  std::vector<float> params = RandomVector(n, 3, 1.0f);
  for (int step = 0; step < 4; ++step) {
    std::vector<float> grads = RankGrad(n, g.rank(), step);
    REQUIRE(a.Step(params.data(), grads.data()).ok());
  }
  const std::vector<uint8_t> saved = a.SaveState();
  ShardedAdam b(g, n, o);
  REQUIRE(b.LoadState(saved).ok());
  CHECK(b.SaveState() == saved);
  std::vector<float> pa = params;
  std::vector<float> pb = params;
  std::vector<float> ga = RankGrad(n, g.rank(), 99);
  std::vector<float> gb = ga;
  REQUIRE(a.Step(pa.data(), ga.data()).ok());
  REQUIRE(b.Step(pb.data(), gb.data()).ok());
  CHECK(pa == pb);
  // Another rank's shard is refused.
  if (g.size() > 1) {
    std::vector<uint8_t> foreign = saved;
    const int32_t other = (g.rank() + 1) % g.size();
    std::memcpy(foreign.data() + 16, &other, sizeof(other));  // StateHeader::rank
    CHECK(b.LoadState(foreign).code() == StatusCode::kFailedPrecondition);
  }
}

}  // namespace
}  // namespace agentrt
