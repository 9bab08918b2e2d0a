#include "agent_runtime/sharded_adam.h"

#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "agent_runtime/adamw.h"
#include "agent_runtime/group.h"
#include "tests/agent_runtime/group_test_util.h"

namespace agentrt {
namespace {

TEST_CASE("AdamW matches a hand-computed first step") {
  AdamWOptions o;
  o.lr = 0.1f;
  o.weight_decay = 0.5f;
  AdamW opt(2, o);
  std::vector<float> p = {1.0f, -1.0f};
  const std::vector<float> g = {0.5f, -2.0f};
  const float norm = opt.Step(p.data(), g.data());
  CHECK(norm == Approx(std::sqrt(0.25f + 4.0f)));
  // Step 1: m_hat = g, v_hat = g^2, update = lr * g / (|g| + eps) = lr * sign(g).
  CHECK(p[0] == Approx(1.0f * (1 - 0.05f) - 0.1f).epsilon(1e-6));
  CHECK(p[1] == Approx(-1.0f * (1 - 0.05f) + 0.1f).epsilon(1e-6));
  CHECK(opt.step_count() == 1);
  CHECK(opt.state_bytes() == 4 * sizeof(float));
}

TEST_CASE("AdamW clips by the global gradient norm") {
  AdamWOptions o;
  o.max_grad_norm = 1.0f;
  AdamWScalars s = MakeAdamWScalars(o, 1, ClipScale(o.max_grad_norm, 4.0f));
  CHECK(s.grad_scale == Approx(0.25f).epsilon(1e-5));
  CHECK(ClipScale(1.0f, 0.5f) == 1.0f);
  CHECK(ClipScale(0.0f, 100.0f) == 1.0f);
}

TEST_CASE("ShardedAdam on one rank equals AdamW, with clipping and weight decay") {
  const size_t n = 1001;
  AdamWOptions o;
  o.lr = 1e-2f;
  o.weight_decay = 0.01f;
  o.max_grad_norm = 5.0f;
  auto group = MakeSingleRankGroup("solo");
  ShardedAdam sharded(*group, n, o);
  AdamW ref(n, o);
  std::vector<float> p = RandomVector(n, 1, 1.0f);
  std::vector<float> p_ref = p;
  for (int step = 0; step < 20; ++step) {
    std::vector<float> g = RandomVector(n, 100 + static_cast<uint32_t>(step), 0.5f);
    const float ref_norm = ref.Step(p_ref.data(), g.data());
    float norm = 0;
    REQUIRE(sharded.Step(p.data(), g.data(), &norm).ok());
    CHECK(norm == Approx(ref_norm).epsilon(1e-5));
  }
  for (size_t i = 0; i < n; ++i) REQUIRE(p[i] == Approx(p_ref[i]).epsilon(1e-5).margin(1e-6));
  CHECK(sharded.shard_offset() == 0);
  CHECK(sharded.shard_size() == n);
  CHECK(sharded.state_bytes() == ref.state_bytes());
  CHECK(sharded.step_count() == 20);
}

TEST_CASE("ShardedAdam state round-trips bit-exactly and refuses a foreign state") {
  const size_t n = 257;
  AdamWOptions o;
  auto group = MakeSingleRankGroup("solo");
  ShardedAdam a(*group, n, o);
  std::vector<float> p = RandomVector(n, 2, 1.0f);
  for (int step = 0; step < 3; ++step) {
    std::vector<float> g = RandomVector(n, 10 + static_cast<uint32_t>(step), 1.0f);
    REQUIRE(a.Step(p.data(), g.data()).ok());
  }
  const std::vector<uint8_t> saved = a.SaveState();
  REQUIRE_FALSE(saved.empty());

  ShardedAdam b(*group, n, o);
  REQUIRE(b.LoadState(saved).ok());
  CHECK(b.step_count() == 3);
  CHECK(b.SaveState() == saved);

  // The next step from the restored state is the same, bit for bit.
  std::vector<float> pa = p;
  std::vector<float> pb = p;
  std::vector<float> ga = RandomVector(n, 99, 1.0f);
  std::vector<float> gb = ga;
  REQUIRE(a.Step(pa.data(), ga.data()).ok());
  REQUIRE(b.Step(pb.data(), gb.data()).ok());
  CHECK(pa == pb);

  ShardedAdam other(*group, n + 1, o);
  Status s = other.LoadState(saved);
  CHECK(s.code() == StatusCode::kFailedPrecondition);
  CHECK_THAT(s.message(), Catch::Contains("257 parameters"));
  std::vector<uint8_t> truncated(saved.begin(), saved.end() - 4);
  CHECK(b.LoadState(truncated).code() == StatusCode::kDataLoss);
  CHECK(b.LoadState(std::span<const uint8_t>()).code() == StatusCode::kDataLoss);
}

}  // namespace
}  // namespace agentrt
