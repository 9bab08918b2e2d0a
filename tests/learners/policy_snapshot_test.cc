// Policy snapshots, the one format of a frozen policy: what an agent publishes
// for the others to play against, and the player that acts with one.
#include "learners/policy_snapshot.h"

#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "agent_runtime/group.h"
#include "envs/env_pool.h"
#include "envs/registry.h"
#include "envs/single_agent_view.h"
#include "learners/ppo.h"
#include "learners/ppo_trainer.h"

using namespace agentrt;

namespace {

struct LearnerFixture {
  std::unique_ptr<Group> group = MakeSingleRankGroup("unit");
  std::unique_ptr<PpoLearner> learner;
  explicit LearnerFixture(const std::string& env = "cartpole", nlohmann::json env_args = nullptr) {
    auto made = GlobalEnvRegistry().MakeEnv(env, env_args);
    REQUIRE(made.ok());
    PpoConfig config;
    config.num_envs = 2;
    config.rollout_steps = 8;
    config.hidden = 16;
    auto l =
        PpoLearner::Make(config, (*made)->observation_space(), (*made)->action_space(), *group);
    REQUIRE(l.ok());
    learner = std::move(*l);
  }
};

// A snapshot as the bus delivers it: a message of its agent's weight stream.
BusMessage AsMessage(const std::string& payload, const std::string& publisher, int64_t offset = 0) {
  BusMessage m;
  m.set_topic(WeightStreamTopic(publisher));
  m.set_publisher(publisher);
  m.set_offset(offset);
  m.set_payload(payload);
  return m;
}

}  // namespace

TEST_CASE("a policy snapshot survives the wire bit for bit, as a weight-stream version") {
  LearnerFixture f;
  const PolicySnapshot s = SnapshotOf(*f.learner, "predator-0", 4096);
  REQUIRE(s.policy_params.size() == f.learner->network().policy().num_params());
  const BusMessage m = AsMessage(EncodeSnapshot(s, /*incarnation=*/3), "predator-0", 6);
  auto version = WeightSet::FromMessage(m, 7);
  REQUIRE(version.ok());
  CHECK((*version)->step() == 4096);
  CHECK((*version)->incarnation() == 3);
  CHECK((*version)->stream() == "predator-0");
  const WeightSet::Entry* policy = (*version)->Find("policy");
  REQUIRE(policy != nullptr);
  CHECK(policy->dtype == "float32");
  CHECK(policy->shape == std::vector<int64_t>{static_cast<int64_t>(s.policy_params.size())});
  CHECK((*version)->Find("snapshot") != nullptr);
  auto back = DecodeSnapshot(m);
  REQUIRE(back.ok());
  CHECK(back->agent == "predator-0");
  CHECK(back->env_steps == 4096);
  CHECK(back->obs_size == 4);
  CHECK(back->num_actions == 2);
  CHECK(back->policy_params == s.policy_params);
  CHECK(back->obs_mean == s.obs_mean);
  CHECK(back->obs_var == s.obs_var);
}

TEST_CASE("a damaged policy snapshot is refused with the reason") {
  LearnerFixture f;
  const PolicySnapshot s = SnapshotOf(*f.learner, "prey-0", 0);
  const std::string wire = EncodeSnapshot(s);
  auto truncated = DecodeSnapshot(AsMessage(wire.substr(0, wire.size() - 3), "prey-0"));
  REQUIRE_FALSE(truncated.ok());
  CHECK_THAT(truncated.status().message(), Catch::Contains("outside the payload"));
  auto no_weights = DecodeSnapshot(AsMessage("no header here", "prey-0"));
  REQUIRE_FALSE(no_weights.ok());
  CHECK_THAT(no_weights.status().message(), Catch::Contains("AGRTWTS1"));
  // A version of other tensors (a PyTorch agent's state_dict) is not a snapshot.
  const float w[4] = {1, 2, 3, 4};
  auto other = DecodeSnapshot(AsMessage(
      EncodeWeights("prey-0", "prey-0", 0, 0, {{"fc.weight", "float32", {4}, w, 16}}), "prey-0"));
  REQUIRE_FALSE(other.ok());
  CHECK_THAT(other.status().message(), Catch::Contains("no \"snapshot\" tensor"));
  PolicySnapshot short_policy = s;
  short_policy.policy_params.pop_back();
  auto bad = DecodeSnapshot(AsMessage(EncodeSnapshot(short_policy), "prey-0"));
  REQUIRE_FALSE(bad.ok());
  CHECK_THAT(bad.status().message(), Catch::Contains("prey-0") && Catch::Contains("shape needs"));
  PolicySnapshot no_mean = s;
  no_mean.norm_obs = true;
  no_mean.obs_mean.clear();
  no_mean.obs_var.assign(static_cast<size_t>(s.obs_size), 1.0);
  auto missing = DecodeSnapshot(AsMessage(EncodeSnapshot(no_mean), "prey-0"));
  REQUIRE_FALSE(missing.ok());
  CHECK_THAT(missing.status().message(), Catch::Contains("\"obs_mean\""));
  // A snapshot is its own agent's: another publisher's claim is refused.
  auto forged = DecodeSnapshot(AsMessage(wire, "predator-0"));
  REQUIRE_FALSE(forged.ok());
  CHECK_THAT(forged.status().message(), Catch::Contains("published by agent predator-0"));
}

TEST_CASE("a snapshot player acts like the learner it was taken from") {
  LearnerFixture f;
  PolicyPlayer player;
  CHECK_FALSE(player.loaded());
  auto decoded = DecodeSnapshot(AsMessage(EncodeSnapshot(SnapshotOf(*f.learner, "me", 0)), "me"));
  REQUIRE(decoded.ok());
  REQUIRE(player.Load(*decoded).ok());
  Rng obs_rng(7), rng_a(1), rng_b(1);
  std::vector<float> obs(4), action(1);
  int agree = 0;
  for (int i = 0; i < 200; ++i) {
    for (auto& x : obs) x = static_cast<float>(obs_rng.Normal());
    f.learner->Act(obs, 1, action, /*deterministic=*/true, rng_a);
    agree += player.Act(obs, rng_b, /*deterministic=*/true) == static_cast<int>(action[0]);
  }
  CHECK(agree == 200);
  // Sampling with the same random stream draws the same actions too.
  Rng s1(3), s2(3);
  for (int i = 0; i < 100; ++i) {
    for (auto& x : obs) x = static_cast<float>(obs_rng.Normal());
    f.learner->Act(obs, 1, action, /*deterministic=*/false, s1);
    CHECK(player.Act(obs, s2) == static_cast<int>(action[0]));
  }
}

TEST_CASE(
    "snapshots drive the other agents of pursuit from pool threads, one player per env copy") {
  auto group = MakeSingleRankGroup("t");
  const nlohmann::json world = {{"predators", 2}, {"prey", 1}, {"control", "prey_0"}};
  auto config = PpoTrainerConfig::FromJson(
      {{"env", "pursuit"}, {"env_args", world}, {"num_envs", 2}, {"rollout_steps", 16}});
  REQUIRE(config.ok());
  auto other = PpoTrainer::Make(*config, *group);
  REQUIRE(other.ok());  // any policy over pursuit observations can play the others
  REQUIRE((*other)->Iterate(nullptr).ok());
  auto snap = DecodeSnapshot(
      AsMessage(EncodeSnapshot(SnapshotOf((*other)->learner(), "predator-0", 0)), "predator-0"));
  REQUIRE(snap.ok());

  std::vector<std::unique_ptr<PolicyPlayer>> players;
  auto pool = EnvPool::Make(
      [&]() -> Result<std::unique_ptr<Env>> {
        auto env = GlobalEnvRegistry().MakeEnv("pursuit", world);
        if (!env.ok()) return env.status();
        players.push_back(std::make_unique<PolicyPlayer>());
        PolicyPlayer* player = players.back().get();
        if (Status s = player->Load(*snap); !s.ok()) return s;
        dynamic_cast<SingleAgentView&>(**env).set_others_policy(
            [player](int, std::span<const float> obs, std::span<float> action, Rng& rng) {
              action[0] = static_cast<float>(player->Act(obs, rng));
            });
        return env;
      },
      {.num_envs = 8, .num_threads = 2, .seed = 4});
  REQUIRE(pool.ok());
  (*pool)->Reset();
  int episodes = 0;
  for (int t = 0; t < 300; ++t) {
    for (int i = 0; i < 8; ++i)
      (*pool)->actions()[static_cast<size_t>(i)] = static_cast<float>((t + i) % 5);
    (*pool)->Step();
    for (int i = 0; i < 8; ++i) {
      episodes += (*pool)->terminated()[static_cast<size_t>(i)] ||
                  (*pool)->truncated()[static_cast<size_t>(i)];
    }
  }
  CHECK(episodes > 8);
}
