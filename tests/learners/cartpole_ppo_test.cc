// Acceptance: PPO solves cartpole — mean return >= 475 over the last 20
// episodes within 150,000 env steps (the whole group's), with fixed seeds.
// Runs as one process (single-rank group) or under `mpirun -np 2` (MPI group:
// each rank steps its own envs, gradients are averaged over the two).
#include <catch2/catch.hpp>
#include <cstdio>
#include <cstdlib>

#include "agent_runtime/group.h"
#include "learners/ppo_trainer.h"

namespace {

std::unique_ptr<agentrt::Group> MakeTestGroup() {
  if (std::getenv("OMPI_COMM_WORLD_SIZE") == nullptr)
    return agentrt::MakeSingleRankGroup("cartpole");
  agentrt::GroupOptions o;
  o.backend = agentrt::GroupBackend::kMpi;
  o.agent = "cartpole";
  auto g = agentrt::MakeGroup(o);
  if (!g.ok()) FAIL(g.status().ToString());
  return std::move(g).value();
}

}  // namespace

TEST_CASE("ppo reaches a mean return of 475 on cartpole within 150k env steps") {
  std::unique_ptr<agentrt::Group> group = MakeTestGroup();
  // The args a plan would give agent-worker. Every rank runs its own 8 envs,
  // so an update of N ranks learns from N x 1024 samples; N x 4 minibatches
  // keep the group's minibatch at 256 samples, as with one rank.
  const nlohmann::json args = {{"env", "cartpole"},    {"seed", 3},
                               {"steps", 150000},      {"num_envs", 8},
                               {"rollout_steps", 128}, {"minibatches", 4 * group->size()}};
  auto config = agentrt::PpoTrainerConfig::FromJson(args);
  REQUIRE(config.ok());
  auto trainer = agentrt::PpoTrainer::Make(*config, *group);
  REQUIRE(trainer.ok());

  agentrt::TrainerMetrics m;
  bool solved = false;
  const int64_t per_iteration = int64_t{128} * config->ppo.num_envs * group->size();
  while ((*trainer)->env_steps() + per_iteration <= 150000) {
    const agentrt::Status s = (*trainer)->Iterate(&m);
    REQUIRE(s.ok());
    if (group->rank() == 0 && m.ppo.updates % 10 == 0) {
      std::printf("steps %lld return %.1f len %.1f entropy %.3f kl %.4f ev %.2f sps %.0f\n",
                  static_cast<long long>(m.env_steps), m.episode_return_mean, m.episode_length_mean,
                  m.ppo.entropy, m.ppo.approx_kl, m.ppo.explained_variance, m.steps_per_s);
    }
    if (m.window_episodes >= 20 && m.episode_return_mean >= 475.0f) {
      solved = true;
      break;
    }
  }
  std::printf("rank %d: %s at %lld env steps, mean return %.1f over the last 20 episodes\n",
              group->rank(), solved ? "solved" : "NOT solved", static_cast<long long>(m.env_steps),
              m.episode_return_mean);
  CHECK(solved);
  CHECK(m.env_steps <= 150000);
}
