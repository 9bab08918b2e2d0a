// agent-worker: the default agent `command`. One process per rank;
// started by `agentctl run` with the agent environment (plan/agent_env.h). What one rank does:
//
//   1. reads its agent's entry from RUN_DIR/plan.json (args, checkpoint policy)
//      and builds agentrt::Runtime, the agent's Group (single / MPI / NCCL by
//      the plan's backend), `num_envs` env copies in an EnvPool, and a PPO
//      learner optimised with ShardedAdam over the group;
//   2. resumes from the agent's newest valid checkpoint: learner state
//      (parameters, normaliser, RNG, optimiser shard), env-step count, bus offsets;
//   3. trains: rollout, Update (collective), all-reduced episode statistics,
//      metrics through Runtime::Report (rank 0), checkpoints on the wall-clock
//      schedule (all ranks agree through an all-reduced flag);
//   4. multi-agent worlds of sides (envs/world_sides.h; pursuit): seated by
//      role (SeatWorld, or SeatLeague for a league member); the other seats are played by the
//      latest policy snapshots of the agents holding them, received from the bus topics
//      weights/<agent>; rank 0 publishes its own snapshot every `snapshot_every` updates and its
//      match results on `results`. Without a bus (no AGENTRT_BUS, or not reachable) it trains
//      against random play and says so in the log;
//   5. at the step budget: a last checkpoint; an agent of the world's scoring
//      side evaluates its score per episode against the other sides' newest
//      snapshots vs its whole side playing at random (pursuit predators: the
//      capture rate; metrics eval_<score>_rate, eval_random_<score>_rate,
//      eval_<score>_ratio, eval_<role>_snapshot, also on `results`), exit 0. On a stop request
//      (SIGTERM): a checkpoint, exit 0. Errors: a message on stderr, exit 1.
#pragma once

namespace agentrt::worker {

int WorkerMain();

}  // namespace agentrt::worker
