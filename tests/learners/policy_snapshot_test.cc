// Policy snapshots: what an agent publishes for the others to play against.
#include "learners/policy_snapshot.h"

#include <catch2/catch.hpp>
#include <vector>

#include "agent_runtime/group.h"
#include "envs/env_pool.h"
#include "envs/pursuit.h"
#include "envs/registry.h"
#include "learners/ppo_trainer.h"

TEST_CASE("a policy snapshot plays exactly like the learner it was taken from") {
  auto group = agentrt::MakeSingleRankGroup("t");
  auto config = agentrt::PpoTrainerConfig::FromJson(
      {{"env", "cartpole"}, {"num_envs", 4}, {"rollout_steps", 64}});
  REQUIRE(config.ok());
  auto trainer = agentrt::PpoTrainer::Make(*config, *group);
  REQUIRE(trainer.ok());
  for (int i = 0; i < 3; ++i) REQUIRE((*trainer)->Iterate(nullptr).ok());
  agentrt::PpoLearner& learner = (*trainer)->learner();
  auto snap = agentrt::PolicySnapshot::FromBytes(learner.SnapshotPolicy());
  REQUIRE(snap.ok());
  CHECK((*snap)->updates() == 3);
  CHECK((*snap)->num_actions() == 2);

  agentrt::Rng data(5), r1(1), r2(1);
  int agree = 0, both_stochastic_agree = 0;
  for (int i = 0; i < 500; ++i) {
    std::vector<float> obs(4);
    for (auto& x : obs) x = static_cast<float>(data.Normal() * 0.5);
    float a = -1.0f, b = -1.0f;
    learner.Act(obs, 1, {&a, 1}, true, r1);
    (*snap)->Act(obs, {&b, 1}, r2, true);
    agree += a == b;
    learner.Act(obs, 1, {&a, 1}, false, r1);
    (*snap)->Act(obs, {&b, 1}, r2, false);  // same RNG stream, same probabilities
    both_stochastic_agree += a == b;
  }
  CHECK(agree == 500);
  CHECK(both_stochastic_agree >= 495);  // float rounding may flip a draw on a boundary
}

TEST_CASE("a policy snapshot drives the other agents of pursuit from pool threads") {
  auto group = agentrt::MakeSingleRankGroup("t");
  const nlohmann::json world = {{"predators", 2}, {"prey", 1}, {"control", "prey_0"}};
  auto config = agentrt::PpoTrainerConfig::FromJson(
      {{"env", "pursuit"}, {"env_args", world}, {"num_envs", 2}, {"rollout_steps", 16}});
  REQUIRE(config.ok());
  auto other = agentrt::PpoTrainer::Make(*config, *group);
  REQUIRE(other.ok());  // any policy over pursuit observations can play the others
  REQUIRE((*other)->Iterate(nullptr).ok());
  auto snap = agentrt::PolicySnapshot::FromBytes((*other)->learner().SnapshotPolicy());
  REQUIRE(snap.ok());

  auto pool = agentrt::EnvPool::Make(
      [&]() -> agentrt::Result<std::unique_ptr<agentrt::Env>> {
        auto env = agentrt::GlobalEnvRegistry().MakeEnv("pursuit", world);
        if (!env.ok()) return env.status();
        dynamic_cast<agentrt::SingleAgentView&>(**env).set_others_policy(
            agentrt::PolicySnapshot::AsOthersPolicy(*snap));
        return env;
      },
      {.num_envs = 8, .num_threads = 2, .seed = 4});
  REQUIRE(pool.ok());
  (*pool)->Reset();
  int episodes = 0;
  for (int t = 0; t < 300; ++t) {
    for (int i = 0; i < 8; ++i) (*pool)->actions()[i] = static_cast<float>((t + i) % 5);
    (*pool)->Step();
    for (int i = 0; i < 8; ++i) episodes += (*pool)->terminated()[i] || (*pool)->truncated()[i];
  }
  CHECK(episodes > 8);
}

TEST_CASE("a malformed policy snapshot is refused") {
  CHECK(agentrt::PolicySnapshot::FromBytes(std::vector<uint8_t>(10, 0)).status().code() ==
        agentrt::StatusCode::kDataLoss);
  auto group = agentrt::MakeSingleRankGroup("t");
  auto config = agentrt::PpoConfig::FromJson({{"num_envs", 1}, {"rollout_steps", 4}});
  REQUIRE(config.ok());
  auto learner = agentrt::PpoLearner::Make(*config, agentrt::Space::Box({3}, -1.0f, 1.0f),
                                           agentrt::Space::Discrete(3), *group);
  REQUIRE(learner.ok());
  std::vector<uint8_t> bytes = (*learner)->SnapshotPolicy();
  bytes.pop_back();
  auto cut = agentrt::PolicySnapshot::FromBytes(bytes);
  REQUIRE_FALSE(cut.ok());
  CHECK_THAT(cut.status().message(), Catch::Contains("expected"));
}
