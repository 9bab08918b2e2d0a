// AdoptCheckpoint (agent_runtime/checkpointer.h): PBT's exploit, one agent's
// newest verified checkpoint becoming another's.
#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "agent_runtime/checkpointer.h"
#include "tests/agent_runtime/checkpoint_test_util.h"
#include "tests/common/temp_dir.h"

namespace agentrt {
namespace {

namespace fs = std::filesystem;

CheckpointOptions Options(const std::string& dir, const std::string& agent, int rank = 0,
                          int world = 1) {
  CheckpointOptions o{.dir = dir,
                      .agent = agent,
                      .rank = rank,
                      .world_size = world,
                      .interval_s = 0,
                      .keep_last = 5};
  return o;
}

// Saves `step` on every rank of a `world`-rank agent: each rank's weights are step*100 + rank.
void SaveAll(const std::string& dir, const std::string& agent, int world, int64_t step,
             const nlohmann::json& metadata) {
  std::vector<std::unique_ptr<Checkpointer>> ranks;
  for (int r = 0; r < world; ++r) {
    auto c = Checkpointer::Create(Options(dir, agent, r, world));
    REQUIRE(c.ok());
    ranks.push_back(std::move(*c));
  }
  std::vector<std::vector<float>> weights(static_cast<size_t>(world));
  // Rank 0 commits once every shard is durable: save the others first.
  for (int r = world - 1; r >= 0; --r) {
    weights[static_cast<size_t>(r)].assign(256, static_cast<float>(step * 100 + r));
    CheckpointState s;
    s.AddArray("w", weights[static_cast<size_t>(r)].data(), "float32", {256}, sizeof(float));
    s.metadata = metadata;
    REQUIRE(ranks[static_cast<size_t>(r)]->SaveAsync(step, s).ok());
  }
  for (auto& c : ranks) REQUIRE(c->Wait().ok());
}

AdoptOptions Adopt(const std::string& from, const std::string& from_agent, const std::string& to,
                   const std::string& to_agent, int world_size = 1) {
  AdoptOptions o;
  o.from_dir = from;
  o.from_agent = from_agent;
  o.to_dir = to;
  o.to_agent = to_agent;
  o.world_size = world_size;
  return o;
}

TEST_CASE("the donor's newest checkpoint becomes the recipient's; its own move aside") {
  testing::TempDir tmp("agentrt-adopt");
  const std::string donor = tmp.Path("donor");
  const std::string recipient = tmp.Path("recipient");
  SaveAll(donor, "cart-0", 2, 100, {{"bus_offsets", {{"t", 1}}}, {"updates", 7}});
  SaveAll(donor, "cart-0", 2, 200, {{"bus_offsets", {{"t", 2}}}, {"updates", 9}});
  SaveAll(recipient, "slow", 2, 300, {{"bus_offsets", {{"t", 42}}}, {"bus_incarnation", 5}});

  Result<AdoptResult> adopted = AdoptCheckpoint(Adopt(donor, "cart-0", recipient, "slow", 2));
  REQUIRE(adopted.ok());
  CHECK(adopted->step == 200);
  CHECK(adopted->skipped.empty());
  // The recipient's own step 300 is kept, out of Restore's way.
  REQUIRE_FALSE(adopted->archived.empty());
  CHECK(fs::exists(adopted->archived + "/step-300/manifest.json"));
  CHECK_FALSE(fs::exists(recipient + "/step-300"));

  // Every rank of the recipient restores the donor's weights of step 200, with
  // its own bus offsets and the lineage in the metadata.
  for (int r = 0; r < 2; ++r) {
    auto c = Checkpointer::Create(Options(recipient, "slow", r, 2));
    REQUIRE(c.ok());
    auto restored = (*c)->Restore();
    REQUIRE(restored.ok());
    REQUIRE(restored->restored());
    CHECK(restored->step == 200);
    std::vector<float> w(256);
    REQUIRE(restored->shard.CopyTo("w", w.data(), w.size() * sizeof(float)).ok());
    CHECK(w[0] == static_cast<float>(200 * 100 + r));
    CHECK(restored->metadata["updates"] == 9);
    CHECK(restored->metadata["bus_offsets"]["t"] == 42);
    CHECK(restored->metadata["bus_incarnation"] == 5);
    CHECK(restored->metadata["adopted_from"]["agent"] == "cart-0");
    CHECK(restored->metadata["adopted_from"]["step"] == 200);
  }
  // The donor's directory is untouched.
  CHECK(fs::exists(donor + "/step-100/manifest.json"));
  CHECK(fs::exists(donor + "/step-200/manifest.json"));
}

TEST_CASE("a donor checkpoint that does not verify is passed over for an older one") {
  testing::TempDir tmp("agentrt-adopt");
  const std::string donor = tmp.Path("donor");
  const std::string recipient = tmp.Path("recipient");
  SaveAll(donor, "a", 1, 10, {});
  SaveAll(donor, "a", 1, 20, {});
  {
    // Flip a byte of the newest shard.
    std::fstream f(donor + "/step-20/rank-0.shard",
                   std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(5);
    f.put('\x7f');
  }
  Result<AdoptResult> adopted = AdoptCheckpoint(Adopt(donor, "a", recipient, "b"));
  REQUIRE(adopted.ok());
  CHECK(adopted->step == 10);
  REQUIRE(adopted->skipped.size() == 1);
  CHECK(adopted->skipped[0].step == 20);
  CHECK_THAT(adopted->skipped[0].reason, Catch::Matchers::Contains("checksum mismatch"));
  CHECK(adopted->archived.empty());  // the recipient had nothing
  CHECK_FALSE(fs::exists(recipient + "/step-20.tmp"));
  auto c = Checkpointer::Create(Options(recipient, "b"));
  REQUIRE(c.ok());
  auto restored = (*c)->Restore();
  REQUIRE(restored.ok());
  CHECK(restored->step == 10);
}

TEST_CASE("no checkpoint to adopt, or another world size, is an error and changes nothing") {
  testing::TempDir tmp("agentrt-adopt");
  const std::string donor = tmp.Path("donor");
  const std::string recipient = tmp.Path("recipient");
  fs::create_directories(donor);
  SaveAll(recipient, "b", 1, 5, {});
  const AdoptOptions o = Adopt(donor, "a", recipient, "b");
  Result<AdoptResult> none = AdoptCheckpoint(o);
  REQUIRE_FALSE(none.ok());
  CHECK_THAT(none.status().message(), Catch::Matchers::Contains("a has no committed checkpoint"));
  SaveAll(donor, "a", 2, 7, {});
  Result<AdoptResult> wider = AdoptCheckpoint(o);
  REQUIRE_FALSE(wider.ok());
  CHECK_THAT(wider.status().message(), Catch::Matchers::Contains("saved by 2 ranks"));
  CHECK(fs::exists(recipient + "/step-5/manifest.json"));
  CHECK_FALSE(fs::exists(recipient + "/replaced"));
}

TEST_CASE("a checkpoint of global slices is adopted by a member of another rank count") {
  testing::TempDir dir;
  const std::string donor = dir.path + "/donor", recipient = dir.path + "/recipient";
  const uint64_t n = 5000;
  testing::SaveGlobal(donor, 2, 40, n);
  auto adopted = AdoptCheckpoint(Adopt(donor, "donor", recipient, "recipient", 3));
  REQUIRE(adopted.ok());
  CHECK(adopted->step == 40);
  testing::RestoreGlobal(recipient, 3, 40, n);  // each of 3 ranks reads its block

  // One rank's own entries cannot be split: such a donor is refused, and why.
  SaveAll(dir.path + "/local", "local", 2, 7, {});
  auto refused = AdoptCheckpoint(Adopt(dir.path + "/local", "local", recipient, "recipient", 3));
  REQUIRE_FALSE(refused.ok());
  CHECK(refused.status().message().find("saved by 2 ranks but this run has 3") !=
        std::string::npos);
}

}  // namespace
}  // namespace agentrt
