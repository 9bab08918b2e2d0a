// How the agents of a plan play a multi-agent world: its sides (roles), in
// seat order, and the rules a trainer needs to seat agents, match them and
// score them without knowing the world (pursuit: predators, then prey).
// A multi-agent env registers one beside its factory (envs/registry.h); a
// world without sides registers none.
#pragma once

#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/status.h"

namespace agentrt {

struct WorldSides {
  // One per side, in seat order: the seats of roles[0] come first.
  std::vector<std::string> roles;
  // The world's parameters when players[i] agents play roles[i]: the user's
  // `params` with each side's size filled in where they left it out.
  std::function<nlohmann::json(nlohmann::json params, const std::vector<int>& players)> sized;
  // The parameters of a world of one seat per side (a league match); an
  // error names the parameter of `params` that says otherwise.
  std::function<Result<nlohmann::json>(nlohmann::json params)> one_each;
  // The side whose goal MultiAgentEnv::episode_score() counts, and which has
  // won an episode that terminates (pursuit: the predators, by catching).
  int scoring_side = 0;
  // What episode_score() counts, one of them ("capture"): metric names and
  // messages say "<score>s/episode".
  std::string score = "point";

  // The index of `role` in roles; -1 when it is none of them.
  int SideOf(const std::string& role) const {
    for (size_t i = 0; i < roles.size(); ++i) {
      if (roles[i] == role) return static_cast<int>(i);
    }
    return -1;
  }
};

}  // namespace agentrt
