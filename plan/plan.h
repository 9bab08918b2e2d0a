// The partition plan: which node, GPUs, ranks and ports every agent gets, where
// the bus listens and which agents use which topics. It is the contract between
// `agentctl plan`, the run controller (which writes RUN_DIR/plan.json), the
// launch backends, agent-worker and the standalone bus (which read it back).
//
// JSON shape (keys after `checkpoint_dir` and top-level `run_dir`,
// `channels`, `warnings` and the bus settings are additive):
//   {"run": "predator-prey", "run_dir": "runs/predator-prey-20260101T000000Z",
//    "bus": {"host": "node01", "port": 20000, "max_message_bytes": 4194304, ...},
//    "agents": [
//      {"name": "predator-0", "index": 0, "ranks": 2,
//       "placement": [{"node": "node01", "gpus": [0, 1], "ranks": [0, 1]}],
//       "ports": {"node": "node01", "first": 20016, "last": 20031},
//       "master_addr": "node01", "master_port": 20016,
//       "checkpoint_dir": "checkpoints/predator-0",
//       "gpus": 2, "backend": "nccl", "command": ["agent-worker"], "env": {...},
//       "args": {...}, "restart": {...}, "checkpoint": {...}, "group": {...}}],
//    "channels": [{"topic": "sightings", "publishers": ["predator-0"], "subscribers": [...]}],
//    "ports": {"first": 20000, "last": 29999, "per_agent": 16},
//    "warnings": ["..."]}
//
// Paths in the plan (checkpoint_dir) are relative to run_dir (RunDir::Resolve
// turns them into absolute ones), so the plan is made once, before the run
// directory exists. plan.json is written by the run controller and by
// `agentctl sbatch`, and read back through ReadPlanFile by everyone else: the
// launchers, the agent runtime, agent-worker, the standalone bus.
//
// Plain data; not synchronised.
#pragma once

#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "plan/config.h"

namespace agentrt {

// An agent's share of one node: GPU ids on that node and the agent-local ranks
// that run there (ranks[i] drives gpus[i * ranks_per_gpu ...] when it has GPUs).
struct Placement {
  std::string node;
  std::vector<int> gpus;   // empty for CPU agents
  std::vector<int> ranks;  // global ranks within the agent, ascending
};

// The agent's port block. The same [first, last] is reserved on every node of
// the agent; `node` is the first of them (where MASTER_ADDR lives).
struct PortBlock {
  std::string node;
  int first = 0;
  int last = 0;
};

struct AgentPlan {
  std::string name;
  int index = 0;
  int ranks = 0;
  std::vector<Placement> placement;  // one entry per node, in rank order
  PortBlock ports;
  std::string master_addr;
  int master_port = 0;
  std::string checkpoint_dir;  // relative to the run directory (or absolute)
  std::string workdir;         // the ranks' working directory, likewise ("agents/<name>")
  // Additive: what the launcher and the agent process need.
  int gpus = 0;
  std::string gpu_type;   // agents[].gpu_type; empty = any
  double peak_flops = 0;  // the partition's theoretical peak, FLOP/s (cluster.peak)
  GroupBackend backend = GroupBackend::kSingle;  // resolved: never kAuto
  std::vector<std::string> command;
  std::map<std::string, std::string> env;
  nlohmann::json args = nlohmann::json::object();
  RestartPolicy restart;
  // The ranks and placement planned before elastic failover shrank the agent
  // onto its surviving nodes (restart.elastic); 0 and empty: as planned. A
  // requeued allocation grows it back (NodeFailover::GrowBack).
  int planned_ranks = 0;
  std::vector<Placement> planned_placement;
  CheckpointPolicy checkpoint;
  GroupPolicy group;

  // The node that holds `rank`, or nullptr.
  const Placement* PlacementOfRank(int rank) const;
  // Its nodes in rank order, comma-separated ("n1,n2").
  std::string NodeList() const;
};

struct BusPlan {
  std::string host;
  int port = 0;
  bool fixed_port = false;  // bus.port was set in the config: never moved to another port
  BusConfig settings;       // settings.port == port
  // TLS with the run's own CA (comms/run_ca.h): whoever serves the bus signs
  // itself a certificate with it.
  bool run_ca = false;
};

struct ChannelPlan {
  std::string topic;
  std::vector<std::string> publishers;  // agent names
  std::vector<std::string> subscribers;
  int64_t keep_last = 0;  // messages the topic keeps (0: bus.retention's)
};

// A node the plan places agents on, as the partition map draws it.
struct PlanNode {
  std::string name;
  int gpus = 0;
  std::vector<std::vector<int>> nvlink_domains;  // as in NodeSpec
};

struct Plan {
  std::string run;      // run name
  std::string run_dir;  // empty until the run controller has created it
  BusPlan bus;
  std::vector<AgentPlan> agents;  // in config order; agents[i].index == i (ascending in a view)
  std::vector<ChannelPlan> channels;
  std::vector<std::string> warnings;  // e.g. local CPU oversubscription
  PortConfig ports;                   // cluster.ports: where leased blocks may move
  std::vector<PlanNode> nodes;        // the nodes with agents on them (additive)
  LeagueConfig league;                // `league:` (members empty: none)
  std::vector<PbtPopulation> pbt;     // `pbt:`
  // slurm.trust_slurm_binding: inside an allocation, ranks keep SLURM's
  // CUDA_VISIBLE_DEVICES instead of the plan's GPU ids (additive).
  bool trust_slurm_binding = false;

  const AgentPlan* FindAgent(std::string_view name) const;  // nullptr when absent
  AgentPlan* FindAgent(std::string_view name);
};

// Serialises in the shape above (keys in that order).
nlohmann::ordered_json PlanToJson(const Plan& plan);
std::string PlanToJsonString(const Plan& plan, int indent = 2);

// One agent's view of the plan: what its processes need of it, in the shape
// of plan.json, written to RUN_DIR/plans/<agent>.json beside plan.json. It
// holds the run, the bus, the port settings and the SLURM binding; the agent
// itself and the agents it plays with or against (its league opponents, and
// every agent whose args name the same `env`, which seat one multi-agent
// world), in plan order with their plan indices; the channels it publishes or
// subscribes to; the league members among those agents; the PBT populations it
// belongs to; and the nodes of its agents. No warnings. An agent reads this
// view, never the whole plan, so start-up work grows with the agent count, not
// with its square.
class PlanViews {
 public:
  explicit PlanViews(const Plan& plan);  // indexes the plan once; `plan` must outlive this
  Plan Of(size_t agent_index) const;

 private:
  const Plan& plan_;
  std::map<std::string, std::vector<size_t>, std::less<>> by_env_;  // args.env -> agents
  std::map<std::string, size_t, std::less<>> by_name_;
  std::vector<std::vector<size_t>> channels_of_;  // agent -> channel indices
  std::vector<std::vector<size_t>> pbt_of_;       // agent -> population indices
};

// Reads a plan back. Errors name the JSON path (`agents[3].ports.first`).
Result<Plan> PlanFromJson(const nlohmann::json& json);
Result<Plan> PlanFromJsonString(std::string_view text);
Result<Plan> ReadPlanFile(const std::string& path);
// Writes the plan to `path` (via a temporary file renamed into place).
Status WritePlanFile(const Plan& plan, const std::string& path);
// Writes a run's plan: every agent's view (RunDir::AgentPlanPath), then
// plan.json, last and durably: a run directory whose plan.json is new has
// views at least as new. Everything that writes a run's plan goes through here.
Status WriteRunPlan(const Plan& plan, const std::string& run_dir);
// An agent's view of its run's plan (as WriteRunPlan wrote it; plan.json in a
// run directory made by hand, without plans/). NotFound names the plan when the
// agent is not in it.
Result<Plan> ReadAgentPlanView(const std::string& run_dir, const std::string& agent);

// A readable table: agent, node(s), GPUs, ranks, ports, checkpoint dir.
std::string PlanToTable(const Plan& plan);

}  // namespace agentrt
