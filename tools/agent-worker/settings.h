// agent-worker's settings: the agent's `args` from the plan (DESIGN §5), read
// by name with defaults, unknown keys refused (a typo fails at start-up).
//
//   args: {env: pursuit, role: predator, algo: ppo, steps: 20000, lr: 0.0003,
//          env_args: {width: 7}, snapshot_every: 2, eval_episodes: 200, ...}
//
// Keys of the worker itself (PPO's hyperparameters are PpoConfig's, by the
// same names; `steps` is the env-step budget of the whole group):
//   env              registry name (envs/registry.h): cartpole, dummy, pursuit, ...
//   env_args         parameters of the env
//   algo             "ppo" (the only one so far)
//   role             pursuit: "predator" or "prey" (which side this agent plays)
//   snapshot_every   publish the policy on policies/<agent> every K updates
//   eval_episodes    pursuit predators: evaluation episodes at the end (0: none)
//   checkpoint_interval_s  overrides the plan's checkpoint.interval_s
//   env_threads      EnvPool threads per rank
//   report_every     report metrics every N updates
#pragma once

#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"
#include "learners/ppo.h"

namespace agentrt::worker {

struct WorkerSettings {
  std::string env = "cartpole";
  nlohmann::json env_args = nlohmann::json::object();
  std::string algo = "ppo";
  std::string role;
  PpoConfig ppo;
  int snapshot_every = 2;
  int eval_episodes = 200;
  double checkpoint_interval_s = -1;  // < 0: the plan's
  int env_threads = 1;
  int report_every = 1;

  // `owner` prefixes messages ("agent predator-0 args").
  static Result<WorkerSettings> FromArgs(const nlohmann::json& args, const std::string& owner);
};

// Who plays which seat of a multi-agent world (pursuit). Agents of the plan
// whose args say env: pursuit take the seats in plan order, by role:
// predators the predator seats 0..P-1, prey the prey seats P..P+Q-1. A seat
// nobody has is played uniformly at random.
struct Seating {
  int control = 0;                             // this agent's seat
  int predators = 0;                           // seats of each side in the world
  int prey = 0;
  std::map<int, std::string> others;           // seat -> agent playing it (policies/<agent>)
  nlohmann::json world_args;                   // env_args with predators/prey/control filled in
};

// What agent-worker reads of RUN_DIR/plan.json (DESIGN §6; the scheduler's
// Plan model is not linked here: the JSON is the contract).
struct PlanAgentArgs {
  std::string name;
  int ranks = 1;
  std::string backend;               // "single", "mpi", "nccl" (empty: not given)
  nlohmann::json args = nlohmann::json::object();
  double checkpoint_interval_s = -1;  // < 0: not given
  int checkpoint_keep_last = 0;       // 0: not given
};

// The agents of a plan file, in plan order. Errors name the file and the key.
Result<std::vector<PlanAgentArgs>> ReadPlanAgents(const std::string& path);

// `agents` in plan order. The world size defaults to the number of agents of
// each role (at least 1 prey and `capture_k` (default 2) predators) unless
// env_args sets "predators"/"prey".
Result<Seating> SeatPursuit(const std::vector<PlanAgentArgs>& agents, const std::string& me,
                            const WorkerSettings& settings);

}  // namespace agentrt::worker
