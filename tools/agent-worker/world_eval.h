// Evaluation of pursuit predators: how often a team of predators catches the
// prey, for the demo's acceptance test ("predators trained against the
// prey's snapshots capture at least 3x as often as uniformly random predators
// against the same prey"). Both figures come from the same episode seeds.
#pragma once

#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <span>

#include "common/status.h"
#include "envs/rng.h"
#include "learners/policy_snapshot.h"

namespace agentrt::worker {

// Picks an action for a seat; returns the action index.
using SeatPolicy = std::function<int(int seat, std::span<const float> obs, Rng& rng)>;

struct CaptureStats {
  int episodes = 0;
  int captures = 0;  // prey caught, over all episodes
  double captures_per_episode = 0;
  double mean_length = 0;
};

// Plays `episodes` episodes of pursuit with `world_args` (reset seeds
// seed, seed+1, ...), every seat acting through `policy`.
Result<CaptureStats> PlayPursuit(const nlohmann::json& world_args, int episodes, uint64_t seed,
                                 const SeatPolicy& policy);

}  // namespace agentrt::worker
