// agent-worker's settings: the agent's `args` from the plan, read
// by name with defaults, unknown keys refused (a typo fails at start-up).
//
//   args: {env: pursuit, role: predator, algo: ppo, steps: 20000, lr: 0.0003,
//          env_args: {width: 7}, snapshot_every: 2, eval_episodes: 200, ...}
//
// The trainer's keys are PpoTrainerConfig's (learners/ppo_trainer.h: env,
// env_args, env_threads, episode_window and every PpoConfig key; `steps` is
// the env-step budget of the whole group). The worker's own:
//   algo             "ppo" (the only one so far)
//   role             multi-agent worlds: the side this agent plays (pursuit:
//                    "predator" or "prey")
//   snapshot_every   publish the policy on weights/<agent> every K updates
//   eval_episodes    the scoring side of a multi-agent world (pursuit
//                    predators): evaluation episodes at the end (0: none)
//   report_every     report metrics every N updates
// The checkpoint cadence is the plan's (`checkpoint:` in agents.yaml).
#pragma once

#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/status.h"
#include "envs/params.h"
#include "envs/world_sides.h"
#include "learners/ppo_config.h"
#include "plan/plan.h"

namespace agentrt::worker {

#define AGENTRT_WORKER_SETTINGS(X)                                                               \
  X(std::string, algo, "ppo", "the algorithm")                                                   \
  X(std::string, role, "", "the side played in a multi-agent world (pursuit: predator or prey)") \
  X(int, snapshot_every, 2, "updates between policy snapshots")                                  \
  X(int, eval_episodes, 200, "a world's scoring side: evaluation episodes at the end")           \
  X(int, report_every, 1, "updates between metric reports")                                      \
  X(int, match_every, 4, "league members: updates per match (a new opponent each)")

struct WorkerSettings {
  PpoTrainerConfig trainer;
  AGENTRT_WORKER_SETTINGS(AGENTRT_PARAM_FIELD)

  // `owner` prefixes messages ("agent predator-0 args").
  static Result<WorkerSettings> FromArgs(const nlohmann::json& args, const std::string& owner);
};

// The problem agent-worker would stop at with these args, as (key, message) —
// key "" when it is not about one key — or nullopt. What `agentctl validate`
// asks (the same declarations as start-up).
std::optional<std::pair<std::string, std::string>> CheckArgs(const nlohmann::json& args);

// Who plays which seat of a multi-agent world of sides (envs/world_sides.h;
// pursuit: predators, then prey). Agents of the plan whose args say the same
// env take the seats in plan order, by role: the first side's agents its
// seats, then the next side's. A seat nobody has is played uniformly at random.
struct Seating {
  WorldSides sides;
  int side = 0;                       // the side this agent plays (sides.roles[side])
  int control = 0;                    // this agent's seat
  std::vector<int> first, count;      // each side's first seat and number of seats
  std::map<int, std::string> others;  // seat -> agent playing it (weights/<agent>)
  nlohmann::json world_args;          // env_args with the sides' sizes and control filled in

  // The side seat `seat` belongs to.
  int SideOfSeat(int seat) const;
};

// A league member's world (plan.league): one seat per side (WorldSides::one_each),
// this agent's seat by its role; the other seat is played by whatever the
// league matches it with (others[seat] = kLeagueServiceName).
Result<Seating> SeatLeague(const std::string& me, const WorkerSettings& settings);

// The world sized for the plan's agents of each role (WorldSides::sized)
// unless env_args says.
Result<Seating> SeatWorld(const Plan& plan, const std::string& me, const WorkerSettings& settings);

}  // namespace agentrt::worker
