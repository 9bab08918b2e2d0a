// Pursuit's reward shaping makes learning quick: a PPO predator trained for a
// few tens of thousands of steps catches a randomly moving prey far more often
// than a uniformly random predator does (same seeds, same episode budget).
#include <catch2/catch.hpp>
#include <cstdio>
#include <vector>

#include "agent_runtime/group.h"
#include "envs/registry.h"
#include "learners/ppo_trainer.h"

namespace {

const nlohmann::json kWorld = {{"width", 7},     {"predators", 1},  {"prey", 1},
                               {"capture_k", 1}, {"max_steps", 15}, {"control", "predator_0"}};

// Fraction of `episodes` episodes that end in a capture; `learner` null plays uniformly.
double CaptureRate(agentrt::PpoLearner* learner, int episodes) {
  auto env = agentrt::GlobalEnvRegistry().MakeEnv("pursuit", kWorld);
  REQUIRE(env.ok());
  std::vector<float> obs((*env)->observation_space().size());
  agentrt::Rng rng(99);
  int captures = 0;
  for (int e = 0; e < episodes; ++e) {
    (*env)->Reset(10000 + static_cast<uint64_t>(e), obs);
    for (;;) {
      float action = static_cast<float>(rng.Below(5));
      if (learner != nullptr) learner->Act(obs, 1, {&action, 1}, false, rng);
      const agentrt::StepResult r = (*env)->Step({&action, 1}, obs);
      if (r.terminated) ++captures;
      if (r.terminated || r.truncated) break;
    }
  }
  return static_cast<double>(captures) / episodes;
}

}  // namespace

TEST_CASE("a ppo predator learns to catch a random prey in pursuit") {
  auto group = agentrt::MakeSingleRankGroup("predator");
  nlohmann::json args = {
      {"env", "pursuit"}, {"env_args", kWorld}, {"steps", 40000}, {"seed", 2}, {"ent_coef", 0.01}};
  auto config = agentrt::PpoTrainerConfig::FromJson(args);
  REQUIRE(config.ok());
  auto trainer = agentrt::PpoTrainer::Make(*config, *group);
  REQUIRE(trainer.ok());
  const double random_rate = CaptureRate(nullptr, 300);
  agentrt::TrainerMetrics m;
  while ((*trainer)->env_steps() < 40000) REQUIRE((*trainer)->Iterate(&m).ok());
  const double learned_rate = CaptureRate(&(*trainer)->learner(), 300);
  std::printf("capture rate: random %.3f, ppo %.3f after %lld steps (return %.2f, length %.1f)\n",
              random_rate, learned_rate, static_cast<long long>(m.env_steps), m.episode_return_mean,
              m.episode_length_mean);
  CHECK(learned_rate >= 2.0 * random_rate);
  CHECK(learned_rate >= 0.8);
}
