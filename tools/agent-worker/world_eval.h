// Evaluation in a multi-agent world of sides: what the scoring side scores
// (MultiAgentEnv::episode_score; pursuit: prey caught) with one set of seat
// policies, for the demo's acceptance test ("predators trained against the
// prey's snapshots capture at least 3x as often as uniformly random predators
// against the same prey"). Figures compared come from the same episode seeds.
#pragma once

#include <functional>
#include <nlohmann/json.hpp>
#include <span>
#include <string>

#include "common/status.h"
#include "envs/rng.h"

namespace agentrt::worker {

// Picks an action for a seat; returns the action index.
using SeatPolicy = std::function<int(int seat, std::span<const float> obs, Rng& rng)>;

struct ScoreStats {
  int episodes = 0;
  double score = 0;  // the scoring side's, over all episodes
  double score_per_episode = 0;
  double mean_length = 0;
};

// Plays `episodes` episodes of multi-agent env `env` with `world_args` (reset
// seeds seed, seed+1, ...), every seat acting through `policy`.
Result<ScoreStats> PlayWorld(const std::string& env, const nlohmann::json& world_args, int episodes,
                             uint64_t seed, const SeatPolicy& policy);

}  // namespace agentrt::worker
