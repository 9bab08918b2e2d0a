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
//   4. multi-agent worlds (pursuit): the other seats are played by the latest
//      policy snapshots of the agents holding them, received from the bus
//      topics policies/<agent>; rank 0 publishes its own snapshot every
//      `snapshot_every` updates and its match results on `results`. Without a
//      bus (no AGENTRT_BUS, or not reachable) it trains against random play and
//      says so in the log;
//   5. at the step budget: a last checkpoint, pursuit predators evaluate their
//      capture rate against the newest prey snapshot vs random predators
//      (reported as metrics and on `results`), exit 0. On a stop request
//      (SIGTERM): a checkpoint, exit 0. Errors: a message on stderr, exit 1.
#pragma once

namespace agentrt::worker {

int WorkerMain();

}  // namespace agentrt::worker
