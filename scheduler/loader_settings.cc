// `agentctl validate --settings`: every setting the loader accepts, with its
// type, default and doc (DescribeSettings, AcceptedSettingKeys).
#include <type_traits>

#include "scheduler/loader_internal.h"

namespace agentrt {

using namespace loader_internal;  // NOLINT(google-build-using-namespace): its own insides

namespace {

// The type a setting's line in `validate --settings` names.
template <typename T>
std::string TypeName() {
  if constexpr (std::is_same_v<T, bool>) {
    return "bool";
  } else if constexpr (std::is_integral_v<T>) {
    return "int";
  } else if constexpr (std::is_floating_point_v<T>) {
    return "float";
  } else if constexpr (std::is_same_v<T, std::string>) {
    return "string";
  } else {
    static_assert(std::is_same_v<T, std::vector<std::string>>, "a setting of another type");
    return "list";
  }
}

std::string Show(const std::string& v) { return fmt::format("\"{}\"", v); }
std::string Show(const std::vector<std::string>& v) {
  return fmt::format("[{}]", fmt::join(v, ", "));
}
std::string Show(bool v) { return v ? "true" : "false"; }
template <typename T>
std::string Show(const T& v) {
  return fmt::format("{}", v);
}

}  // namespace

// Every settings block the loader reads from an X-macro list of plan/config.h:
// its struct (holding the defaults), its list, the prefix of its keys.
#define AGENTRT_SETTING_BLOCKS(X)                                          \
  X(RunConfig, AGENTRT_RUN_SETTINGS, "run.")                               \
  X(PortConfig, AGENTRT_PORT_SETTINGS, "cluster.ports.")                   \
  X(LinkConfig, AGENTRT_LINK_SETTINGS, "cluster.links.")                   \
  X(PeakConfig, AGENTRT_PEAK_SETTINGS, "cluster.peak.")                    \
  X(PreflightConfig, AGENTRT_PREFLIGHT_SETTINGS, "preflight.")             \
  X(SlurmConfig, AGENTRT_SLURM_SETTINGS, "slurm.")                         \
  X(BusConfig, AGENTRT_BUS_SETTINGS, "bus.")                               \
  X(RestartPolicy, AGENTRT_RESTART_SETTINGS, "defaults.restart.")          \
  X(CheckpointPolicy, AGENTRT_CHECKPOINT_SETTINGS, "defaults.checkpoint.") \
  X(GroupPolicy, AGENTRT_GROUP_SETTINGS, "defaults.group.")                \
  X(LeagueConfig, AGENTRT_LEAGUE_SETTINGS, "league.")                      \
  X(PbtPopulation, AGENTRT_PBT_SETTINGS, "pbt[].")

std::string DescribeSettings() {
  std::string out;
  auto line = [&out](const std::string& key, const std::string& type, const std::string& def,
                     const char* doc) {
    out += fmt::format("{:<32} {:<7} {:<14} {}\n", key, type, def, doc);
  };
  // One settings block: its X-macro list, the struct holding its defaults, its key prefix.
#define AGENTRT_LINE(type, name, default_value, doc) \
  line(prefix + #name, TypeName<type>(), Show(d.name), doc);
#define AGENTRT_BLOCK(Type, LIST, key_prefix) \
  {                                           \
    const Type d;                             \
    const std::string prefix = key_prefix;    \
    LIST(AGENTRT_LINE)                        \
  }
  AGENTRT_SETTING_BLOCKS(AGENTRT_BLOCK)
#undef AGENTRT_BLOCK
#undef AGENTRT_LINE
  line("defaults.command", "list", "[agent-worker]",
       "program and arguments every agent runs unless it sets command");
  line("defaults.env", "map", "{}",
       "environment variables for every agent (agents add to and override them)");
  line("agents[].name", "string", "(required)",
       "agent name; with replicas: N the agents are <name>-0..<name>-(N-1)");
  line("agents[].replicas", "int", "(none)", "number of copies of this agent");
  line("agents[].gpus", "int", "0", "GPUs per agent; 0 = a CPU agent");
  line("agents[].ranks", "int", "gpus or 1",
       "processes per agent; a multiple of gpus (one rank per GPU by default; more ranks than "
       "GPUs only with backend: mpi)");
  line("agents[].command", "list", "defaults", "program and arguments");
  line("agents[].env", "map", "defaults", "environment variables added to defaults.env");
  line("agents[].args", "map", "{}",
       "free-form settings passed to the agent (plan.json, agent-worker flags)");
  line("agents[].workdir", "string", "(run dir)",
       "the agent's working directory, relative to agents.yaml; default RUN_DIR/agents/<name>");
  line("agents[].restart", "map", "defaults", "overrides of defaults.restart keys");
  line("agents[].checkpoint", "map", "defaults", "overrides of defaults.checkpoint keys");
  line("agents[].group", "map", "defaults", "overrides of defaults.group keys");
  line("agents[].nodes", "list", "[]", "pin list of hostlist expressions; empty = any node");
  line("agents[].backend", "string", "auto",
       "group backend: auto (nccl with GPUs; else single, or mpi for >1 rank) | single | mpi | "
       "nccl");
  line("agents[].gpu_type", "string", "(any)",
       "only nodes whose GPUs are of this type (SLURM gres gpu:<type>:N), e.g. h100");
  line("cluster.nodes[].name", "string", "(required)", "hostlist expression, e.g. gpu[01-04,07]");
  line("cluster.nodes[].gpus", "int", "0", "GPUs per node");
  line("cluster.nodes[].cpus", "int", "(unlimited)", "CPU slots per node; each rank takes one");
  line("cluster.nodes[].gpu_type", "string", "(none)", "the type of the node's GPUs, e.g. h100");
  line("cluster.nodes[].nvlink_domains", "list", "[all GPUs]",
       "disjoint GPU id lists covering 0..gpus-1");
  line("channels[].topic", "string", "(required)",
       "topic name or pattern ('*' matches any characters, e.g. probe/*); {agent} makes one topic "
       "per publisher");
  line("channels[].publishers", "list", "(required)", "glob patterns of agents that may publish");
  line("channels[].subscribers", "list", "(required)",
       "glob patterns of agents that may subscribe");
  line("league.members[].agents", "list", "(required)",
       "agent name patterns this entry makes members");
  line("league.members[].role", "string", "(required)",
       "main | main_exploiter | league_exploiter | anchor (anchor: never trains, a yardstick)");
  line("league.members[].matchmaking", "string", "by role",
       "how opponents are picked: pfsp | uniform | self (default pfsp; main_exploiter self; "
       "anchor uniform)");
  line("league.members[].newest_share", "float", "by role",
       "share of matches against the opponent's newest snapshot (main 0.35, else 0)");
  line("league.members[].opponents", "list", "(all others)", "agent name patterns it plays");
  line("pbt[].name", "string", "pbt<i>", "the population's name");
  line("pbt[].agents", "list", "(required)", "agent name patterns in this population");
  line("pbt[].hyperparameters", "map", "(required)",
       "agent args to explore: <arg>: {min, max, perturb, log_scale}");
  line("pbt[].hyperparameters.<arg>.min", "float", "(required)", "lowest value");
  line("pbt[].hyperparameters.<arg>.max", "float", "(required)", "highest value");
  line("pbt[].hyperparameters.<arg>.perturb", "list", "[0.8, 1.2]",
       "explore: the value is multiplied by one of these factors");
  line("pbt[].hyperparameters.<arg>.log_scale", "bool", "false",
       "draw anew on a log scale (needs min > 0)");
  return out;
}

std::vector<std::string> AcceptedSettingKeys() {
  std::vector<std::string> keys;
  auto add = [&keys](const std::string& prefix, const std::vector<std::string>& names) {
    for (const std::string& name : names) keys.push_back(prefix + name);
  };
#define AGENTRT_ADD_BLOCK(Type, LIST, prefix) add(prefix, {LIST(AGENTRT_KEY_NAME)});
  AGENTRT_SETTING_BLOCKS(AGENTRT_ADD_BLOCK)
#undef AGENTRT_ADD_BLOCK
  for (const std::string& name : kDefaultsKeys) {
    // restart, checkpoint and group are the blocks above.
    if (name == "command" || name == "env") keys.push_back("defaults." + name);
  }
  add("agents[].", kAgentKeys);
  add("cluster.nodes[].", kNodeKeys);
  add("channels[].", kChannelKeys);
  add("league.members[].", kLeagueMemberKeys);
  add("pbt[].", kPbtListKeys);
  add("pbt[].hyperparameters.<arg>.", kPbtHyperparameterKeys);
  return keys;
}

}  // namespace agentrt
