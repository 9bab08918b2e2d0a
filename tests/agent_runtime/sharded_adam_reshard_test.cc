// Runs twice under mpirun, at two world sizes (sharded_adam.cmake): with
// AGENTRT_TEST_PHASE=save, N ranks train ShardedAdam for kSteps steps and save
// parameters and optimizer state as global slices into AGENTRT_TEST_DIR; with
// AGENTRT_TEST_PHASE=resume, M ranks restore them (re-sharded), check that
// each rank's m and v are bitwise the saved global arrays at its new offsets,
// train kSteps more and compare the parameters with a single-process AdamW
// that ran all 2 * kSteps steps.
#include <catch2/catch.hpp>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "agent_runtime/adamw.h"
#include "agent_runtime/checkpointer.h"
#include "agent_runtime/group.h"
#include "agent_runtime/sharded_adam.h"
#include "tests/agent_runtime/group_test_util.h"

namespace agentrt {
namespace {

constexpr size_t kParams = 100003;  // no world size of the tests divides it
constexpr int kSteps = 4;

AdamWOptions Options() {
  AdamWOptions o;
  o.lr = 1e-2f;
  o.weight_decay = 0.01f;
  o.average_grads = true;  // every rank's gradient is the same: any world size sees it
  return o;
}

std::vector<float> Grad(int step) {
  return RandomVector(kParams, 500u + static_cast<uint32_t>(step), 0.3f);
}

std::string Env(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr ? v : "";
}

std::unique_ptr<Checkpointer> MakeCheckpointer(Group& g) {
  auto c = Checkpointer::Create({.dir = Env("AGENTRT_TEST_DIR"),
                                 .agent = "reshard",
                                 .rank = g.rank(),
                                 .world_size = g.size(),
                                 .interval_s = 0});
  REQUIRE(c.ok());
  return std::move(c).value();
}

TEST_CASE("ShardedAdam restores at another world size and trains on as if never stopped") {
  const std::string phase = Env("AGENTRT_TEST_PHASE");
  REQUIRE((phase == "save" || phase == "resume"));
  Group& g = MpiWorld("reshard");
  ShardedAdam adam(g, kParams, Options());
  std::vector<float> params = RandomVector(kParams, 7, 1.0f);
  auto checkpointer = MakeCheckpointer(g);
  if (phase == "save") {
    for (int step = 0; step < kSteps; ++step) {
      std::vector<float> grads = Grad(step);
      REQUIRE(adam.Step(params.data(), grads.data()).ok());
    }
    CheckpointState state;
    // The parameters are replicated: each rank saves its own block of them.
    const uint64_t count = adam.shard_size() + (g.rank() == g.size() - 1 ? adam.tail_size() : 0);
    state.AddSlice("params", params.data() + adam.shard_offset(), "float32", sizeof(float),
                   {static_cast<int64_t>(kParams)}, adam.shard_offset(), count);
    adam.AddTo(state, "adam.");
    REQUIRE(checkpointer->Save(kSteps, state).ok());
    REQUIRE(g.Barrier().ok());  // rank 0 has committed before anyone leaves
    return;
  }

  auto restored = checkpointer->Restore();
  REQUIRE(restored.ok());
  REQUIRE(restored->restored());
  REQUIRE(restored->world_size != g.size());  // it really is re-sharded
  const SavedStep& saved = *restored->saved;
  REQUIRE(saved.Read("params", 0, kParams, params.data()).ok());
  REQUIRE(adam.LoadFrom(saved, "adam.").ok());
  CHECK(adam.step_count() == kSteps);

  // m and v of this rank: its shard, then the tail, bitwise the saved arrays.
  const std::vector<uint8_t> mine = adam.SaveState();
  const size_t len = adam.shard_size() + adam.tail_size();
  REQUIRE(mine.size() >= 2 * len * sizeof(float));
  const uint8_t* m = mine.data() + mine.size() - 2 * len * sizeof(float);
  for (const char* name : {"adam.m", "adam.v"}) {
    std::vector<float> global(kParams);
    REQUIRE(saved.Read(name, 0, kParams, global.data()).ok());
    std::vector<float> expect(
        global.begin() + static_cast<std::ptrdiff_t>(adam.shard_offset()),
        global.begin() + static_cast<std::ptrdiff_t>(adam.shard_offset() + adam.shard_size()));
    expect.insert(expect.end(), global.end() - static_cast<std::ptrdiff_t>(adam.tail_size()),
                  global.end());
    INFO(name << " on rank " << g.rank() << " of " << g.size());
    CHECK(std::memcmp(m, expect.data(), len * sizeof(float)) == 0);
    m += len * sizeof(float);
  }

  for (int step = kSteps; step < 2 * kSteps; ++step) {
    std::vector<float> grads = Grad(step);
    REQUIRE(adam.Step(params.data(), grads.data()).ok());
  }
  AdamW reference(kParams, Options());
  std::vector<float> expected = RandomVector(kParams, 7, 1.0f);
  for (int step = 0; step < 2 * kSteps; ++step) {
    std::vector<float> grads = Grad(step);
    reference.Step(expected.data(), grads.data());
  }
  for (size_t i = 0; i < kParams; ++i) {
    INFO("parameter " << i << " on rank " << g.rank() << " of " << g.size());
    REQUIRE(params[i] == Approx(expected[i]).epsilon(1e-4).margin(1e-6));
  }
}

}  // namespace
}  // namespace agentrt
