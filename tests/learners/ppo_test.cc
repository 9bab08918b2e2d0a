// The PPO learner's contract: hyperparameters by name, learning on the dummy
// env, state save/load that restores everything a resume needs.
#include <catch2/catch.hpp>
#include <vector>

#include "agent_runtime/group.h"
#include "envs/registry.h"
#include "learners/ppo_trainer.h"

using agentrt::PpoTrainer;
using agentrt::PpoTrainerConfig;

namespace {

std::unique_ptr<PpoTrainer> MakeTrainer(const nlohmann::json& args, agentrt::Group& group) {
  auto config = PpoTrainerConfig::FromJson(args);
  REQUIRE(config.ok());
  auto trainer = PpoTrainer::Make(*config, group);
  REQUIRE(trainer.ok());
  return std::move(trainer).value();
}

std::vector<float> Params(PpoTrainer& t) {
  return {t.learner().parameters().begin(), t.learner().parameters().end()};
}

}  // namespace

TEST_CASE("ppo hyperparameters are read by name with defaults and checked") {
  auto c = PpoTrainerConfig::FromJson({{"env", "dummy"}, {"lr", 0.01}, {"epochs", 2}});
  REQUIRE(c.ok());
  CHECK(c->env == "dummy");
  CHECK(c->ppo.lr == Approx(0.01f));
  CHECK(c->ppo.epochs == 2);
  CHECK(c->ppo.num_envs == 8);  // default
  CHECK(c->ppo.ToJson()["epochs"] == 2);

  auto typo = PpoTrainerConfig::FromJson({{"learning_rate", 0.01}});
  REQUIRE_FALSE(typo.ok());
  CHECK_THAT(typo.status().message(), Catch::Contains("unknown parameter 'learning_rate'"));
  auto range = PpoTrainerConfig::FromJson({{"minibatches", 0}});
  REQUIRE_FALSE(range.ok());
  CHECK_THAT(range.status().message(), Catch::Contains("'minibatches'"));
  auto type = agentrt::PpoConfig::FromJson({{"gamma", "high"}});
  REQUIRE_FALSE(type.ok());
  CHECK_THAT(type.status().message(), Catch::Contains("'gamma' must be a number"));
}

TEST_CASE("ppo refuses continuous actions with a message that says why") {
  auto group = agentrt::MakeSingleRankGroup("t");
  const agentrt::Space box = agentrt::Space::Box({2}, -1.0f, 1.0f);
  auto learner = agentrt::PpoLearner::Make({}, box, box, *group);
  REQUIRE_FALSE(learner.ok());
  CHECK(learner.status().code() == agentrt::StatusCode::kUnimplemented);
  CHECK_THAT(learner.status().message(), Catch::Contains("Discrete"));
}

TEST_CASE("ppo learns the dummy env: name the lit light") {
  auto group = agentrt::MakeSingleRankGroup("t");
  auto t = MakeTrainer({{"env", "dummy"},
                        {"env_args", {{"n", 4}, {"length", 16}}},
                        {"num_envs", 4},
                        {"rollout_steps", 32},
                        {"anneal_lr", false},
                        {"gamma", 0.0}},
                       *group);
  agentrt::TrainerMetrics m;
  for (int i = 0; i < 40; ++i) REQUIRE(t->Iterate(&m).ok());
  // Random play earns 4 of 16; a learned policy nearly all 16.
  CHECK(m.episode_return_mean > 15.0f);
  CHECK(m.ppo.entropy < 0.5f);
  // Deterministic play with the learned policy picks the lit index.
  agentrt::Rng rng(0);
  std::vector<float> obs = {0, 0, 1, 0, 0, 1, 0, 0};
  std::vector<float> actions(2);
  t->learner().Act(obs, 2, actions, true, rng);
  CHECK(actions[0] == 2.0f);
  CHECK(actions[1] == 1.0f);
}

TEST_CASE("ppo state restores parameters, optimizer, normaliser and RNG exactly") {
  auto group = agentrt::MakeSingleRankGroup("t");
  const nlohmann::json args = {{"env", "cartpole"}, {"num_envs", 2}, {"rollout_steps", 32}};
  auto a = MakeTrainer(args, *group);
  for (int i = 0; i < 2; ++i) REQUIRE(a->Iterate(nullptr).ok());
  const std::vector<uint8_t> saved = a->SaveState();
  const std::vector<float> saved_params = Params(*a);
  REQUIRE(a->Iterate(nullptr).ok());
  REQUIRE(Params(*a) != saved_params);  // training moved on

  // A fresh trainer (a restarted process) resumes from the bytes...
  auto b = MakeTrainer(args, *group);
  REQUIRE(b->LoadState(saved).ok());
  CHECK(Params(*b) == saved_params);
  CHECK(b->env_steps() == 2 * 2 * 32);
  CHECK(b->learner().updates() == 2);
  CHECK(b->learner().normalizer().mean() != a->learner().normalizer().mean());
  // ...and from there it trains exactly as the original does from the same bytes.
  REQUIRE(a->LoadState(saved).ok());
  CHECK(b->learner().normalizer().mean() == a->learner().normalizer().mean());
  REQUIRE(a->Iterate(nullptr).ok());
  REQUIRE(b->Iterate(nullptr).ok());
  CHECK(Params(*a) == Params(*b));
}

TEST_CASE("ppo state from another network or garbage is refused") {
  auto group = agentrt::MakeSingleRankGroup("t");
  auto a = MakeTrainer({{"env", "cartpole"}, {"num_envs", 2}, {"rollout_steps", 8}}, *group);
  const std::vector<uint8_t> saved = a->SaveState();
  auto wider = MakeTrainer(
      {{"env", "cartpole"}, {"num_envs", 2}, {"rollout_steps", 8}, {"hidden", 32}}, *group);
  const agentrt::Status s = wider->LoadState(saved);
  REQUIRE_FALSE(s.ok());
  CHECK_THAT(s.message(), Catch::Contains("parameters"));
  std::vector<uint8_t> cut(saved.begin(), saved.begin() + static_cast<long>(saved.size() / 2));
  CHECK(a->LoadState(cut).code() == agentrt::StatusCode::kDataLoss);
  CHECK(a->LoadState(std::vector<uint8_t>(64, 7)).code() == agentrt::StatusCode::kDataLoss);
}

TEST_CASE("gae matches a hand computation across an episode boundary") {
  // 3 steps x 2 envs, [t][env]. Env 0 ends its episode at t = 1; env 1 runs on.
  const std::vector<float> rewards = {1, 0, 2, 0, 3, 1};
  const std::vector<float> values = {0.5f, 0.1f, 0.4f, 0.2f, 0.3f, 0.3f};
  const std::vector<float> dones = {0, 0, 1, 0, 0, 0};
  const std::vector<float> last = {0.6f, 0.7f};
  const float g = 0.9f, l = 0.8f;
  std::vector<float> adv(6), ret(6);
  agentrt::ComputeGae(rewards, values, dones, last, g, l, adv, ret);
  // env 0: t=2: d = 3 + .9*.6 - .3 = 3.24; t=1 (done): d = 2 - .4 = 1.6, A = 1.6;
  //        t=0: d = 1 + .9*.4 - .5 = .86, A = .86 + .72*1.6 = 2.012
  CHECK(adv[4] == Approx(3.24f));
  CHECK(adv[2] == Approx(1.6f));
  CHECK(adv[0] == Approx(2.012f));
  // env 1: t=2: d = 1 + .9*.7 - .3 = 1.33; t=1: d = 0 + .9*.3 - .2 = .07, A = .07 + .72*1.33
  //        = 1.0276; t=0: d = 0 + .9*.2 - .1 = .08, A = .08 + .72*1.0276 = .819872
  CHECK(adv[5] == Approx(1.33f));
  CHECK(adv[3] == Approx(1.0276f));
  CHECK(adv[1] == Approx(0.819872f));
  for (size_t k = 0; k < 6; ++k) CHECK(ret[k] == Approx(adv[k] + values[k]));
}
