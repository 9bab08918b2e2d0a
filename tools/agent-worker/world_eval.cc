#include "tools/agent-worker/world_eval.h"

#include <vector>

#include "envs/registry.h"

namespace agentrt::worker {

Result<ScoreStats> PlayWorld(const std::string& env, const nlohmann::json& world_args, int episodes,
                             uint64_t seed, const SeatPolicy& policy) {
  nlohmann::json params = world_args;
  if (params.is_object()) params.erase("control");
  AGENTRT_ASSIGN_OR_RETURN(auto world, GlobalEnvRegistry().MakeMultiAgentEnv(env, params));
  const int n = world->num_agents();
  const size_t obs_size = world->observation_space().size();
  std::vector<float> obs(obs_size * static_cast<size_t>(n)), actions(static_cast<size_t>(n)),
      rewards(static_cast<size_t>(n));
  Rng rng(seed ^ 0x5eedULL);
  ScoreStats stats;
  int64_t steps = 0;
  for (int e = 0; e < episodes; ++e) {
    world->Reset(seed + static_cast<uint64_t>(e), obs);
    for (bool done = false; !done;) {
      for (int a = 0; a < n; ++a) {
        actions[static_cast<size_t>(a)] =
            world->active(a) ? static_cast<float>(policy(
                                   a, {&obs[obs_size * static_cast<size_t>(a)], obs_size}, rng))
                             : 0.0f;
      }
      const auto outcome = world->Step(actions, obs, rewards);
      ++steps;
      done = outcome.terminated || outcome.truncated;
    }
    stats.score += world->episode_score();
    ++stats.episodes;
  }
  if (stats.episodes > 0) {
    stats.score_per_episode = stats.score / stats.episodes;
    stats.mean_length = static_cast<double>(steps) / stats.episodes;
  }
  return stats;
}

}  // namespace agentrt::worker
