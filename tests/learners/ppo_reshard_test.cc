// Runs twice under mpirun, at two world sizes (learners.cmake): with
// AGENTRT_TEST_PHASE=save, N ranks of a PPO trainer (agent-worker's) train a
// few updates on cartpole and save PpoTrainer::AddTo into AGENTRT_TEST_DIR;
// with AGENTRT_TEST_PHASE=resume, M ranks restore it re-sharded and must hold
// the saved parameters, counters and (ranks that existed) episode windows,
// then train on.
#include <catch2/catch.hpp>
#include <cstdlib>
#include <string>
#include <vector>

#include "agent_runtime/checkpointer.h"
#include "agent_runtime/group.h"
#include "learners/ppo_trainer.h"
#include "tests/agent_runtime/group_test_util.h"

namespace agentrt {
namespace {

std::string Env(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr ? v : "";
}

TEST_CASE("a PPO trainer's checkpoint restores at another world size") {
  const std::string phase = Env("AGENTRT_TEST_PHASE");
  REQUIRE((phase == "save" || phase == "resume"));
  Group& g = MpiWorld("ppo-reshard");
  const nlohmann::json args = {{"env", "cartpole"},   {"seed", 5},        {"num_envs", 4},
                               {"rollout_steps", 64}, {"minibatches", 2}, {"episode_window", 10}};
  auto config = PpoTrainerConfig::FromJson(args);
  REQUIRE(config.ok());
  auto trainer = PpoTrainer::Make(*config, g);
  REQUIRE(trainer.ok());
  auto checkpointer = Checkpointer::Create({.dir = Env("AGENTRT_TEST_DIR"),
                                            .agent = "ppo-reshard",
                                            .rank = g.rank(),
                                            .world_size = g.size(),
                                            .interval_s = 0});
  REQUIRE(checkpointer.ok());
  TrainerMetrics m;
  if (phase == "save") {
    for (int i = 0; i < 3; ++i) REQUIRE((*trainer)->Iterate(&m).ok());
    REQUIRE((*trainer)->WindowMetrics().window_episodes > 0);
    CheckpointState state;
    (*trainer)->AddTo(state);
    state.metadata["world_size"] = g.size();
    REQUIRE((*checkpointer)->Save((*trainer)->env_steps(), state).ok());
    REQUIRE(g.Barrier().ok());
    return;
  }

  auto restored = (*checkpointer)->Restore();
  REQUIRE(restored.ok());
  REQUIRE(restored->restored());
  const int saved_world = restored->world_size;
  REQUIRE(saved_world != g.size());
  const SavedStep& saved = *restored->saved;
  REQUIRE(PpoTrainer::SavedIn(saved));
  REQUIRE((*trainer)->LoadFrom(saved).ok());

  // The same parameters on every rank, bitwise the saved ones; the group's counters.
  const auto params = (*trainer)->learner().parameters();
  std::vector<float> expected(params.size());
  REQUIRE(saved.Read("ppo.params", 0, expected.size(), expected.data()).ok());
  CHECK(std::equal(params.begin(), params.end(), expected.begin()));
  CHECK((*trainer)->env_steps() == restored->step);
  CHECK((*trainer)->env_steps() == int64_t{3} * 4 * 64 * saved_world);
  CHECK((*trainer)->learner().updates() == 3);
  // A rank that existed keeps its episode window; a new one starts empty.
  const int window = (*trainer)->WindowMetrics().window_episodes;
  if (g.rank() < saved_world) {
    CHECK(window > 0);
  } else {
    CHECK(window == 0);
  }

  REQUIRE((*trainer)->Iterate(&m).ok());
  CHECK((*trainer)->learner().updates() == 4);
  CHECK(m.env_steps == restored->step + int64_t{4} * 64 * g.size());
  CHECK_FALSE(std::equal(params.begin(), params.end(), expected.begin()));  // it learned on
}

}  // namespace
}  // namespace agentrt
