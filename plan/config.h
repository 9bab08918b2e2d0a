// The agents.yaml model: every setting of a run, declared once with its type,
// default and a one-line doc (the AGENTRT_*_SETTINGS lists below), then loaded
// from YAML by scheduler/loader.h. Values here are already validated and
// expanded: agent replicas are separate AgentConfig entries (`predator-0`,
// `predator-1`), hostlists are expanded, channel patterns are resolved to agent
// names, and defaults are merged into every agent.
//
// Plain data, no behaviour: copy freely; not synchronised.
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "common/group_backend.h"

namespace agentrt {

// Declares one field of a settings struct from a settings list entry.
#define AGENTRT_DECLARE_SETTING(type, name, default_value, doc) type name = default_value;

// X(type, name, default, doc) — `run:`
#define AGENTRT_RUN_SETTINGS(X)                                                                    \
  X(std::string, name, "agentrt", "run name; `agentctl run` creates <dir>/<name>-<UTC timestamp>") \
  X(std::string, dir, "runs",                                                                      \
    "parent directory of run directories (relative to the working directory)")

// `cluster: ports:` — every agent gets its own block of `per_agent` ports out of
// [first, last] on each of its nodes; the bus takes the first block of the
// first node when `bus.port` is auto.
#define AGENTRT_PORT_SETTINGS(X)                                           \
  X(int, first, 20000, "first port of the range handed out on every node") \
  X(int, last, 29999, "last port (inclusive) of the range")                \
  X(int, per_agent, 16, "ports in one agent's block; the first is MASTER_PORT")

// `cluster.links:` — the bus bandwidth (nccl-tests busbw) each link class is
// expected to reach, GB/s: what `agentctl check` compares its sweep with.
#define AGENTRT_LINK_SETTINGS(X)                                                      \
  X(double, nvlink_gbps, 300.0, "GPUs of one node in one NVLink domain")              \
  X(double, pcie_gbps, 24.0, "GPUs of one node across NVLink domains (PCIe 4.0 x16)") \
  X(double, network_gbps, 12.5, "ranks on several nodes (100 Gb/s InfiniBand/RoCE)")  \
  X(double, shm_gbps, 5.0, "CPU ranks of one node (MPI over shared memory)")

// `cluster.peak:` — the theoretical peak an agent's efficiency is measured
// against (status: achieved FLOP/s / peak, when the agent declares its FLOPs
// per sample).
#define AGENTRT_PEAK_SETTINGS(X)                                                                 \
  X(double, gpu_tflops, 0.0,                                                                     \
    "peak TFLOP/s of one GPU; 0 = by gpu_type (h100/h200 989, b200 2250, a100 312 bf16 dense), " \
    "else 989")                                                                                  \
  X(double, cpu_rank_gflops, 50.0, "peak GFLOP/s of one CPU rank (one core, fp32 SIMD)")

// `preflight:` — `agentctl check` and `agentctl run --preflight`.
#define AGENTRT_PREFLIGHT_SETTINGS(X)                                                   \
  X(double, min_efficiency, 0.7,                                                        \
    "largest-size busbw / expected below this: warning (--strict: error)")              \
  X(std::int64_t, max_bytes, 67108864, "largest collective buffer of the sweep, bytes") \
  X(std::int64_t, checkpoint_probe_bytes, 16777216,                                     \
    "bytes written + fsynced to probe each checkpoint dir")                             \
  X(double, checkpoint_bytes, 0,                                                        \
    "checkpoint size to sustain every checkpoint.interval_s; 0 = only measure")

// `slurm:` — used by the SLURM launch backends and `agentctl sbatch`.
#define AGENTRT_SLURM_SETTINGS(X)                                                                  \
  X(std::string, partition, "", "sbatch --partition; empty = the cluster's default")               \
  X(std::string, account, "", "sbatch --account; empty = the user's default")                      \
  X(std::string, qos, "", "sbatch --qos; empty = none")                                            \
  X(std::string, time, "24:00:00", "sbatch --time wall-clock limit ([D-]HH:MM:SS)")                \
  X(std::string, constraint, "", "sbatch --constraint feature expression; empty = none")           \
  X(int, signal_grace_s, 120, "seconds before the time limit at which SLURM signals a checkpoint") \
  X(int, spare_nodes, 0, "extra nodes in the allocation; an agent on a failed node moves to one")  \
  X(bool, trust_slurm_binding, false,                                                              \
    "ranks keep SLURM's CUDA_VISIBLE_DEVICES (ConstrainDevices clusters), not the plan's GPU ids") \
  X(std::vector<std::string>, extra_args, {}, "extra sbatch arguments, passed verbatim")           \
  X(std::string, steps, "agent",                                                                   \
    "agent: a job step per agent | node: one step per node for its single-node agents")

// `bus:` — the gRPC message bus.
#define AGENTRT_BUS_SETTINGS(X)                                                                 \
  X(int, port, 0, "bus port; `auto` (0) = first port of the first node's range")                \
  X(std::int64_t, max_message_bytes, 4194304, "largest accepted message payload, bytes")        \
  X(std::int64_t, retention, 100000, "messages kept per topic before the oldest expire")        \
  X(std::int64_t, retention_bytes, 1073741824,                                                  \
    "payload bytes kept per topic before the oldest expire")                                    \
  X(double, retention_age_s, 0.0, "messages older than this expire; 0 = no age limit")          \
  X(std::string, durability, "batch",                                                           \
    "memory (no files) | batch (fsync every fsync_interval_ms) | always (fsync, then ack)")     \
  X(int, fsync_interval_ms, 200, "batch: the longest a stored message waits for fsync")         \
  X(std::int64_t, segment_bytes, 67108864, "the durable log starts a new file past this")       \
  X(double, call_timeout_s, 30.0, "deadline of every bus call, seconds")                        \
  X(std::string, tls, "auto",                                                                   \
    "on | off | auto (on when the bus is reachable beyond loopback: a run across nodes); "      \
    "without cert_file the run makes its own CA")                                               \
  X(std::string, cert_file, "",                                                                 \
    "PEM certificate of the bus server; empty = the run's CA signs one")                        \
  X(std::string, key_file, "", "PEM private key of cert_file")                                  \
  X(std::string, ca_file, "", "PEM CA bundle clients use to verify the bus; empty = cert_file") \
  X(bool, mtls, false,                                                                          \
    "every client also shows a certificate the run's CA signed for it, naming the agent its "   \
    "token is for (turns tls on; needs the run's CA)")

// `restart:` under `defaults:` or an agent.
#define AGENTRT_RESTART_SETTINGS(X)                                                             \
  X(int, max_restarts, 3, "restarts of a failed agent before the run gives up on it")           \
  X(double, backoff_s, 2.0,                                                                     \
    "wait before the first restart of a failed agent; doubles with each failure in a row, "     \
    "seconds")                                                                                  \
  X(double, backoff_max_s, 60.0,                                                                \
    "the longest wait before a restart; an incarnation that ran this long starts the doubling " \
    "again, seconds")                                                                           \
  X(int, crash_loop_after, 3,                                                                   \
    "this many failures in a row at start-up with the same exit and last log line fail the "    \
    "agent (a crash loop); 0 = never")                                                          \
  X(double, heartbeat_timeout_s, 60.0, "a rank silent for this long is declared dead, seconds") \
  X(double, grace_s, 10.0, "SIGTERM-to-SIGKILL grace when tearing an agent down, seconds")      \
  X(double, progress_timeout_s, 0.0,                                                            \
    "no reported step for this long is a hang (restart); 0 = not watched, seconds")

// `group:` under `defaults:` or an agent: its collectives (agent_runtime/group.h).
#define AGENTRT_GROUP_SETTINGS(X)                                                  \
  X(double, collective_timeout_s, 300.0,                                           \
    "a collective some rank waits in this long while a peer never entered it, or " \
    "that every rank waits in, is a hang: dump and restart; 0 = not watched, seconds")

// `checkpoint:` under `defaults:` or an agent.
#define AGENTRT_CHECKPOINT_SETTINGS(X)                                                       \
  X(double, interval_s, 1800.0, "wall time between checkpoints, seconds")                    \
  X(int, keep_last, 3, "newest checkpoints kept per agent")                                  \
  X(std::string, snapshot, "copy",                                                           \
    "how an async save takes host memory: copy (the loop waits for a copy of the state) or " \
    "fork (it waits for a fork only; pages it writes while the save runs are copied then)")

// `league:` — a population matched against itself and its past by the
// controller's league service (scheduler/league.h).
#define AGENTRT_LEAGUE_SETTINGS(X)                                                               \
  X(int, keep_snapshots, 8, "frozen snapshots kept per agent in the catalogue (oldest dropped)") \
  X(std::int64_t, freeze_every_steps, 20000,                                                     \
    "an agent's newest snapshot is frozen into the catalogue every this many of its env steps")  \
  X(double, elo_k, 16.0,                                                                         \
    "Elo K factor: the most rating points one match (a report of games) moves")                  \
  X(double, initial_rating, 1000.0, "Elo rating every member starts with")                       \
  X(std::int64_t, seed, 1, "matchmaking random seed")

// `pbt:` entries — population-based training (scheduler/pbt.h).
#define AGENTRT_PBT_SETTINGS(X)                                                                 \
  X(std::int64_t, interval_steps, 50000, "a member is judged every this many of its env steps") \
  X(std::string, metric, "episode_return_mean",                                                 \
    "higher is better: a metric the agents report, or `rating` (the league's Elo)")             \
  X(double, fraction, 0.25, "truncation selection: bottom and top fraction of the population")  \
  X(double, resample_probability, 0.25,                                                         \
    "explore: chance a hyperparameter is drawn anew from its range instead of perturbed")       \
  X(std::int64_t, seed, 1, "random seed of donor choice and exploration")                       \
  X(double, checkpoint_wait_s, 60.0,                                                            \
    "how long the controller waits for the donor's fresh checkpoint before using its newest one")

struct RunConfig {
  AGENTRT_RUN_SETTINGS(AGENTRT_DECLARE_SETTING)
};

struct PortConfig {
  AGENTRT_PORT_SETTINGS(AGENTRT_DECLARE_SETTING)
  // Blocks that fit in the range: (last - first + 1) / per_agent.
  int BlockCount() const { return per_agent > 0 ? (last - first + 1) / per_agent : 0; }
};

struct SlurmConfig {
  AGENTRT_SLURM_SETTINGS(AGENTRT_DECLARE_SETTING)
};

// The values of `bus.tls` (the config also takes true and false for on and off).
inline constexpr std::string_view kBusTlsOn = "on";
inline constexpr std::string_view kBusTlsOff = "off";
inline constexpr std::string_view kBusTlsAuto = "auto";

struct BusConfig {
  AGENTRT_BUS_SETTINGS(AGENTRT_DECLARE_SETTING)
  // The CA bundle every client of this bus verifies it with (agents get it as
  // AGENTRT_BUS_CA): "" unless tls is on (the run decides `auto` when its bus
  // starts, comms/run_ca.h); else ca_file, or cert_file (a
  // self-signed certificate is its own CA).
  std::string ClientCaFile() const {
    if (tls != kBusTlsOn) return "";
    return ca_file.empty() ? cert_file : ca_file;
  }
};

struct RestartPolicy {
  AGENTRT_RESTART_SETTINGS(AGENTRT_DECLARE_SETTING)
  // restart.elastic.min_ranks: when a node of the agent dies and no spare
  // fits, it goes on at the ranks its other nodes hold, if at least this many
  // (scheduler/node_failover.h); 0: not elastic (the allocation requeues).
  int elastic_min_ranks = 0;
};

struct CheckpointPolicy {
  AGENTRT_CHECKPOINT_SETTINGS(AGENTRT_DECLARE_SETTING)
};

struct GroupPolicy {
  AGENTRT_GROUP_SETTINGS(AGENTRT_DECLARE_SETTING)
};

// One machine, after hostlist expansion (`gpu[01-02]` is two NodeSpecs).
struct NodeSpec {
  std::string name;
  int gpus = 0;
  int cpus = 0;  // CPU slots (one per rank); 0 = not stated, not limited
  // Disjoint sets of GPU ids that together cover 0..gpus-1. The loader fills in
  // one domain holding every GPU when the config gives none.
  std::vector<std::vector<int>> nvlink_domains;
  std::string addr;      // how other nodes reach it (SLURM's NodeAddr); empty: by name
  std::string gpu_type;  // e.g. "h100" (SLURM's gres gpu:h100:8); empty: not stated

  // How other nodes reach it: its NodeAddr, else its name.
  const std::string& Address() const { return addr.empty() ? name : addr; }
};

struct LinkConfig {
  AGENTRT_LINK_SETTINGS(AGENTRT_DECLARE_SETTING)
};

struct PeakConfig {
  AGENTRT_PEAK_SETTINGS(AGENTRT_DECLARE_SETTING)
};

struct PreflightConfig {
  AGENTRT_PREFLIGHT_SETTINGS(AGENTRT_DECLARE_SETTING)
};

struct ClusterConfig {
  std::vector<NodeSpec> nodes;  // empty = not described (local: detected; SLURM: scontrol)
  PortConfig ports;
  LinkConfig links;
  PeakConfig peak;
};

// How an agent's ranks talk to each other: GroupBackend (common/group_backend.h).
// The one rule, used by the loader, the planner, the plan reader and
// MakeGroup: auto → nccl when the agent has GPUs (one rank or many: a GPU
// agent never gets a host-only group), else single for one rank and mpi for
// more. An explicit backend stands.
GroupBackend ResolveGroupBackend(GroupBackend requested, int gpus, int ranks);
// Why `requested` cannot run `ranks` ranks on `gpus` GPUs, or "" when it can:
// nccl needs GPUs and at most one rank per GPU; single is one rank. An explicit
// host backend (single, mpi) on a GPU agent keeps its GPUs reserved and trains
// on the host.
std::string GroupBackendProblem(GroupBackend requested, int gpus, int ranks);
// Whether an agent's ranks start under mpirun (locally) or srun --mpi=pmix
// (SLURM): the mpi backend with more than one rank, with or without GPUs.
bool LaunchesThroughMpi(GroupBackend resolved, int ranks);

// `defaults:` — inherited by every agent that does not override them.
struct AgentDefaults {
  RestartPolicy restart;
  CheckpointPolicy checkpoint;
  GroupPolicy group;
  std::vector<std::string> command = {"agent-worker"};  // program and its arguments
  std::map<std::string, std::string> env;               // merged under each agent's env
};

// One agent after replica expansion.
struct AgentConfig {
  std::string name;                        // `predator-1` (replicas) or `prey` (no replicas: key)
  std::string base_name;                   // `predator`, as written in the file
  int replica = 0;                         // 0..replicas-1
  int index = 0;                           // position in Config::agents
  int gpus = 0;                            // GPUs of the whole agent; 0 = CPU agent
  int ranks = 1;                           // processes; defaults to gpus (one rank per GPU), else 1
  std::vector<std::string> command;        // argv; a bare first word is looked up on PATH,
                                           // relative paths are resolved at load time
  std::string workdir;                     // absolute; empty = RUN_DIR/agents/<name>
  std::map<std::string, std::string> env;  // defaults.env overlaid with the agent's env
  nlohmann::json args = nlohmann::json::object();  // arbitrary YAML map, passed to the agent
  RestartPolicy restart;
  CheckpointPolicy checkpoint;
  GroupPolicy group;
  std::vector<std::string> nodes;  // pin list (expanded hostnames); empty = anywhere
  GroupBackend backend = GroupBackend::kAuto;
  std::string gpu_type;  // only nodes whose GPUs are of this type; empty = any
  int line = 0;          // 1-based position of the agent entry in the file, for messages
  int column = 0;
};

// One topic after expansion. A topic containing `{agent}` in the file becomes
// one channel per matching publisher (e.g. `weights/{agent}`).
struct ChannelConfig {
  std::string topic;
  std::vector<std::string> publisher_patterns;  // globs as written (`predator-*`)
  std::vector<std::string> subscriber_patterns;
  std::vector<std::string> publishers;  // expanded agent names, in agent order
  std::vector<std::string> subscribers;
  int64_t keep_last = 0;  // messages its topic keeps (0: bus.retention's)
};

// The league roles (AlphaStar's): a role gives a member its default
// matchmaking; an anchor never trains (a fixed yardstick).
inline const std::vector<std::string>& LeagueRoles() {
  static const std::vector<std::string> roles = {"main", "main_exploiter", "league_exploiter",
                                                 "anchor"};
  return roles;
}
// Matchmaking: `self` the opponents' newest snapshot; `uniform` any frozen
// snapshot of an opponent; `pfsp` frozen snapshots weighted by (1 - p)^2, p
// the member's win rate against each (prioritized fictitious self-play).
inline const std::vector<std::string>& LeagueMatchmakings() {
  static const std::vector<std::string> kinds = {"self", "uniform", "pfsp"};
  return kinds;
}

// One agent of the league, after pattern expansion.
struct LeagueMember {
  std::string agent;
  std::string role;                    // one of LeagueRoles()
  std::string matchmaking;             // one of LeagueMatchmakings()
  double newest_share = 0.0;           // share of matches against an opponent's newest snapshot
  std::vector<std::string> opponents;  // agent names it may be matched against
};

// The bus identity of the controller's league service (scheduler/
// league_service.h): a valid bus name (the broker allows ':') but not a valid
// agent name, so no agent can take it.
inline constexpr char kLeagueServiceName[] = "agentrt:league";

struct LeagueConfig {
  AGENTRT_LEAGUE_SETTINGS(AGENTRT_DECLARE_SETTING)
  std::vector<LeagueMember> members;  // empty: no league
  bool enabled() const { return !members.empty(); }
  const LeagueMember* FindMember(std::string_view agent) const;  // nullptr when absent
};

// One tuned hyperparameter: an agent arg (args.<name>), a number.
struct PbtHyperparameter {
  std::string name;
  double min = 0;
  double max = 0;
  std::vector<double> perturb = {0.8, 1.2};  // explore: multiply by one of these
  bool log_scale = false;                    // resample log-uniformly (min > 0)
  bool integer = false;  // every member starts with an integer: new values are rounded
};

// One PBT population, after pattern expansion.
struct PbtPopulation {
  AGENTRT_PBT_SETTINGS(AGENTRT_DECLARE_SETTING)
  std::string name;
  std::vector<std::string> agents;
  std::vector<PbtHyperparameter> hyperparameters;
};

struct Config {
  std::string source;  // file the config was loaded from ("<string>" when none)
  RunConfig run;
  ClusterConfig cluster;
  SlurmConfig slurm;
  BusConfig bus;
  PreflightConfig preflight;
  AgentDefaults defaults;
  std::vector<AgentConfig> agents;
  std::vector<ChannelConfig> channels;
  LeagueConfig league;
  std::vector<PbtPopulation> pbt;

  int TotalGpus() const;
  int TotalRanks() const;
  const AgentConfig* FindAgent(std::string_view name) const;  // nullptr when absent
};

// What a user should know before running `config` though it is valid: an
// agent-worker agent that asks for GPUs (it trains on the CPU). `agentctl
// validate` prints these; the planner copies them into the plan's warnings.
std::vector<std::string> ConfigWarnings(const Config& config);

}  // namespace agentrt
