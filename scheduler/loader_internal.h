// The YAML loader's insides, shared by its files: loader.cc (the document,
// agents, cluster and the other blocks), loader_population.cc (channels:,
// league:, pbt:), loader_prescan.cc (the pre-scan and spelling hints) and
// loader_settings.cc (validate --settings). Not installed.
#pragma once

#include <fmt/format.h>
#include <fnmatch.h>
#include <sys/stat.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <stdexcept>

#include "common/file_util.h"
#include "comms/bus_log.h"
#include "comms/bus_validate.h"
#include "scheduler/hostlist.h"
#include "scheduler/loader.h"

namespace agentrt::loader_internal {

// Thrown while converting; caught at the module boundary and turned into a
// Status (exceptions are confined to configuration parsing).
class ConfigError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

inline std::string Location(std::string_view source, int line, int column) {
  return fmt::format("{}:{}:{}", source, line, column);
}

// ---------------------------------------------------------------------------
// YAML → Config conversion.

inline std::string Join(const std::string& path, std::string_view key) {
  return path.empty() ? std::string(key) : fmt::format("{}.{}", path, key);
}
inline std::string Index(const std::string& path, size_t i) {
  return fmt::format("{}[{}]", path, i);
}

inline std::string KindName(const YAML::Node& n) {
  switch (n.Type()) {
    case YAML::NodeType::Map:
      return "a map";
    case YAML::NodeType::Sequence:
      return "a list";
    case YAML::NodeType::Scalar:
      return fmt::format("'{}'", n.Scalar());
    case YAML::NodeType::Null:
      return "nothing";
    default:
      return "an undefined value";
  }
}

inline bool IsQuoted(const YAML::Node& n) { return n.Tag() == "!"; }

class Converter {
 public:
  Converter(std::string source, const LoadLimits& limits)
      : source_(std::move(source)), limits_(limits) {}

  [[noreturn]] void Fail(const YAML::Node& at, const std::string& key,
                         const std::string& what) const {
    // A value that came from the command line is blamed on its --set, not on
    // a line of the file (its marks point into the override text).
    for (const auto& [node, text] : override_nodes_) {
      if (at.IsDefined() && at.is(node)) {
        std::string where = fmt::format("--set {}", text);
        if (key.empty()) throw ConfigError(fmt::format("{}: {}", where, what));
        throw ConfigError(fmt::format("{}: key '{}': {}", where, key, what));
      }
    }
    YAML::Mark mark = at.IsDefined() ? at.Mark() : YAML::Mark::null_mark();
    Fail(mark, key, what);
  }

  // Remembers every node of an override's value (bounded: the text is small).
  void AddOverride(const YAML::Node& value, const std::string& text) {
    if (override_nodes_.size() > 10000) return;
    override_nodes_.emplace_back(value, text);
    if (value.IsSequence()) {
      for (size_t i = 0; i < value.size(); ++i) AddOverride(value[i], text);
    } else if (value.IsMap()) {
      for (auto it = value.begin(); it != value.end(); ++it) {
        AddOverride(it->first, text);
        AddOverride(it->second, text);
      }
    }
  }
  [[noreturn]] void Fail(const YAML::Mark& mark, const std::string& key,
                         const std::string& what) const {
    std::string where =
        mark.is_null() ? source_ : Location(source_, mark.line + 1, mark.column + 1);
    if (key.empty()) throw ConfigError(fmt::format("{}: {}", where, what));
    throw ConfigError(fmt::format("{}: key '{}': {}", where, key, what));
  }

  void Visit(const YAML::Node& at) {
    if (++visited_ > limits_.max_nodes) {
      Fail(at, "",
           fmt::format("the document expands to more than {} nodes (an alias bomb?)",
                       limits_.max_nodes));
    }
  }

  // Checks that `map` is a map whose keys are all in `allowed`.
  void CheckMap(const YAML::Node& map, const std::string& path,
                const std::vector<std::string>& allowed) {
    Visit(map);
    if (!map.IsMap()) Fail(map, path, fmt::format("expected a map, got {}", KindName(map)));
    std::set<std::string> seen;
    for (auto it = map.begin(); it != map.end(); ++it) {
      Visit(it->first);
      if (!it->first.IsScalar()) Fail(it->first, path, "expected plain keys, got a complex key");
      const std::string key = it->first.Scalar();
      if (!seen.insert(key).second) Fail(it->first, Join(path, key), "appears twice");
      if (std::find(allowed.begin(), allowed.end(), key) != allowed.end()) continue;
      std::string hint = ClosestMatch(key, allowed);
      std::string what = fmt::format("unknown key; expected one of {}", fmt::join(allowed, ", "));
      if (!hint.empty()) what += fmt::format("; did you mean '{}'?", hint);
      Fail(it->first, Join(path, key), what);
    }
  }

  const std::string& source() const { return source_; }

  // Scalar conversions. `key` is the dotted path for messages.
  void Convert(const YAML::Node& n, const std::string& key, std::string& out) {
    Visit(n);
    if (!n.IsScalar()) Fail(n, key, fmt::format("expected a string, got {}", KindName(n)));
    out = n.Scalar();
  }
  void Convert(const YAML::Node& n, const std::string& key, int& out) {
    std::int64_t v = 0;
    Convert(n, key, v);
    if (v < INT32_MIN || v > INT32_MAX)
      Fail(n, key, fmt::format("expected an integer, got {} (out of range)", v));
    out = static_cast<int>(v);
  }
  void Convert(const YAML::Node& n, const std::string& key, std::int64_t& out) {
    Visit(n);
    if (!n.IsScalar() || IsQuoted(n))
      Fail(n, key, fmt::format("expected an integer, got {}", KindName(n)));
    const std::string& s = n.Scalar();
    const char* begin = s.data() + (!s.empty() && s[0] == '+' ? 1 : 0);
    auto [ptr, ec] = std::from_chars(begin, s.data() + s.size(), out);
    if (ec != std::errc() || ptr != s.data() + s.size() || s.empty()) {
      Fail(n, key, fmt::format("expected an integer, got {}", KindName(n)));
    }
  }
  void Convert(const YAML::Node& n, const std::string& key, double& out) {
    Visit(n);
    if (!n.IsScalar() || IsQuoted(n))
      Fail(n, key, fmt::format("expected a number, got {}", KindName(n)));
    const std::string& s = n.Scalar();
    char* end = nullptr;
    errno = 0;
    out = std::strtod(s.c_str(), &end);
    if (s.empty() || end != s.c_str() + s.size() || errno == ERANGE || !std::isfinite(out)) {
      Fail(n, key, fmt::format("expected a number, got {}", KindName(n)));
    }
  }
  void Convert(const YAML::Node& n, const std::string& key, bool& out) {
    Visit(n);
    static const std::set<std::string> kTrue = {"true", "True", "TRUE", "yes", "Yes", "on", "On"};
    static const std::set<std::string> kFalse = {"false", "False", "FALSE", "no",
                                                 "No",    "off",   "Off"};
    if (n.IsScalar() && !IsQuoted(n) && kTrue.count(n.Scalar())) {
      out = true;
    } else if (n.IsScalar() && !IsQuoted(n) && kFalse.count(n.Scalar())) {
      out = false;
    } else {
      Fail(n, key, fmt::format("expected true or false, got {}", KindName(n)));
    }
  }
  // A list of strings; a single string is a list of one.
  void Convert(const YAML::Node& n, const std::string& key, std::vector<std::string>& out) {
    Visit(n);
    out.clear();
    if (n.IsScalar()) {
      out.push_back(n.Scalar());
      return;
    }
    if (!n.IsSequence())
      Fail(n, key, fmt::format("expected a list of strings, got {}", KindName(n)));
    for (size_t i = 0; i < n.size(); ++i) {
      std::string s;
      Convert(n[i], Index(key, i), s);
      out.push_back(std::move(s));
    }
  }
  void Convert(const YAML::Node& n, const std::string& key,
               std::map<std::string, std::string>& out) {
    Visit(n);
    if (!n.IsMap()) Fail(n, key, fmt::format("expected a map of strings, got {}", KindName(n)));
    for (auto it = n.begin(); it != n.end(); ++it) {
      Visit(it->first);
      const std::string name = it->first.Scalar();
      if (!it->second.IsScalar()) {
        Fail(it->second, Join(key, name),
             fmt::format("expected a string, got {}", KindName(it->second)));
      }
      out[name] = it->second.Scalar();
    }
  }

  // Reads `map[key]` into `out` when present.
  template <typename T>
  bool Read(const YAML::Node& map, const std::string& path, const char* key, T& out) {
    const YAML::Node v = map[key];
    if (!v.IsDefined()) return false;
    Convert(v, Join(path, key), out);
    return true;
  }

  // Reads `map[key]` into `out`; a missing key fails at `map` with
  // "missing; <expected>".
  template <typename T>
  void ReadRequired(const YAML::Node& map, const std::string& path, const char* key, T& out,
                    const std::string& expected) {
    if (!Read(map, path, key, out)) Fail(map, Join(path, key), "missing; " + expected);
  }

  // Arbitrary YAML → JSON (for agent args), with YAML 1.2 core scalar typing.
  nlohmann::json ToJson(const YAML::Node& n, const std::string& key) {
    Visit(n);
    switch (n.Type()) {
      case YAML::NodeType::Null:
        return nullptr;
      case YAML::NodeType::Sequence: {
        nlohmann::json arr = nlohmann::json::array();
        for (size_t i = 0; i < n.size(); ++i) arr.push_back(ToJson(n[i], Index(key, i)));
        return arr;
      }
      case YAML::NodeType::Map: {
        nlohmann::json obj = nlohmann::json::object();
        for (auto it = n.begin(); it != n.end(); ++it) {
          Visit(it->first);
          if (!it->first.IsScalar()) Fail(it->first, key, "expected plain keys, got a complex key");
          obj[it->first.Scalar()] = ToJson(it->second, Join(key, it->first.Scalar()));
        }
        return obj;
      }
      case YAML::NodeType::Scalar:
        return ScalarToJson(n);
      default:
        Fail(n, key, "undefined value");
    }
  }

 private:
  static nlohmann::json ScalarToJson(const YAML::Node& n) {
    const std::string& s = n.Scalar();
    if (IsQuoted(n)) return s;
    if (s == "null" || s == "~" || s == "Null" || s == "NULL" || s.empty()) return nullptr;
    if (s == "true" || s == "True" || s == "TRUE") return true;
    if (s == "false" || s == "False" || s == "FALSE") return false;
    std::int64_t i = 0;
    const char* begin = s.data() + (s[0] == '+' ? 1 : 0);
    auto [ptr, ec] = std::from_chars(begin, s.data() + s.size(), i);
    if (ec == std::errc() && ptr == s.data() + s.size()) return i;
    static const std::regex kFloat(R"([-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?)");
    if (std::regex_match(s, kFloat)) return std::strtod(s.c_str(), nullptr);
    if (s == ".inf" || s == "+.inf" || s == "-.inf" || s == ".nan")
      return s;  // JSON has no inf/nan
    return s;
  }

  std::string source_;
  LoadLimits limits_;
  size_t visited_ = 0;
  std::vector<std::pair<YAML::Node, std::string>> override_nodes_;
};

#define AGENTRT_KEY_NAME(type, name, default_value, doc) #name,

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

// ReadSettings(c, map, path, out[, extra_keys]) for each block above: checks that `map`
// holds only the block's keys (and `extra_keys`, which the caller reads) and reads each
// into its member of `out`.
#define AGENTRT_READ_SETTING(type, name, default_value, doc) c.Read(map, path, #name, out.name);
#define AGENTRT_SETTINGS_READER(Type, LIST, key_prefix)                                  \
  inline void ReadSettings(Converter& c, const YAML::Node& map, const std::string& path, \
                           Type& out, const std::vector<std::string>& extra_keys = {}) { \
    std::vector<std::string> keys = {LIST(AGENTRT_KEY_NAME)};                            \
    keys.insert(keys.end(), extra_keys.begin(), extra_keys.end());                       \
    c.CheckMap(map, path, keys);                                                         \
    LIST(AGENTRT_READ_SETTING)                                                           \
  }
AGENTRT_SETTING_BLOCKS(AGENTRT_SETTINGS_READER)
#undef AGENTRT_SETTINGS_READER
#undef AGENTRT_READ_SETTING

inline const std::vector<std::string> kTopKeys = {"run",      "cluster", "slurm",    "bus",
                                                  "defaults", "agents",  "channels", "preflight",
                                                  "league",   "pbt"};
// The keys of the list blocks, declared once: name, type, default and doc. The loader
// accepts exactly these keys (in this order in its messages) and `validate --settings`
// describes them.
#define AGENTRT_AGENT_KEYS(X)                                                                    \
  X(name, "string", "(required)",                                                                \
    "agent name; with replicas: N the agents are <name>-0..<name>-(N-1)")                        \
  X(replicas, "int", "(none)", "number of copies of this agent")                                 \
  X(gpus, "int", "0", "GPUs per agent; 0 = a CPU agent")                                         \
  X(ranks, "int", "gpus or 1",                                                                   \
    "processes per agent; a multiple of gpus (one rank per GPU by default; more ranks than "     \
    "GPUs only with backend: mpi)")                                                              \
  X(command, "list", "defaults", "program and arguments")                                        \
  X(env, "map", "defaults", "environment variables added to defaults.env")                       \
  X(args, "map", "{}", "free-form settings passed to the agent (plan.json, agent-worker flags)") \
  X(restart, "map", "defaults", "overrides of defaults.restart keys")                            \
  X(workdir, "string", "(run dir)",                                                              \
    "the agent's working directory, relative to agents.yaml; default RUN_DIR/agents/<name>")     \
  X(checkpoint, "map", "defaults", "overrides of defaults.checkpoint keys")                      \
  X(group, "map", "defaults", "overrides of defaults.group keys")                                \
  X(nodes, "list", "[]", "pin list of hostlist expressions; empty = any node")                   \
  X(backend, "string", "auto",                                                                   \
    "group backend: auto (nccl with GPUs; else single, or mpi for >1 rank) | single | mpi | "    \
    "nccl")                                                                                      \
  X(gpu_type, "string", "(any)",                                                                 \
    "only nodes whose GPUs are of this type (SLURM gres gpu:<type>:N), e.g. h100")

#define AGENTRT_NODE_KEYS(X)                                                          \
  X(name, "string", "(required)", "hostlist expression, e.g. gpu[01-04,07]")          \
  X(gpus, "int", "0", "GPUs per node")                                                \
  X(cpus, "int", "(unlimited)", "CPU slots per node; each rank takes one")            \
  X(nvlink_domains, "list", "[all GPUs]", "disjoint GPU id lists covering 0..gpus-1") \
  X(gpu_type, "string", "(none)", "the type of the node's GPUs, e.g. h100")

#define AGENTRT_CHANNEL_KEYS(X)                                                                  \
  X(topic, "string", "(required)",                                                               \
    "topic name or pattern ('*' matches any characters, e.g. probe/*); {agent} makes one topic " \
    "per publisher")                                                                             \
  X(publishers, "list", "(required)", "glob patterns of agents that may publish")                \
  X(subscribers, "list", "(required)", "glob patterns of agents that may subscribe")             \
  X(keep_last, "int", "bus.retention",                                                           \
    "messages (weight-stream versions) each of its topics keeps; the oldest go first")

#define AGENTRT_LEAGUE_MEMBER_KEYS(X)                                                        \
  X(agents, "list", "(required)", "agent name patterns this entry makes members")            \
  X(role, "string", "(required)",                                                            \
    "main | main_exploiter | league_exploiter | anchor (anchor: never trains, a yardstick)") \
  X(matchmaking, "string", "by role",                                                        \
    "how opponents are picked: pfsp | uniform | self (default pfsp; main_exploiter self; "   \
    "anchor uniform)")                                                                       \
  X(newest_share, "float", "by role",                                                        \
    "share of matches against the opponent's newest snapshot (main 0.35, else 0)")           \
  X(opponents, "list", "(all others)", "agent name patterns it plays")

// Keys of a pbt: population beside its X-macro settings.
#define AGENTRT_PBT_LIST_KEYS(X)                                            \
  X(name, "string", "pbt<i>", "the population's name")                      \
  X(agents, "list", "(required)", "agent name patterns in this population") \
  X(hyperparameters, "map", "(required)",                                   \
    "agent args to explore: <arg>: {min, max, perturb, log_scale}")

#define AGENTRT_PBT_HYPERPARAMETER_KEYS(X)                                                     \
  X(min, "float", "(required)", "lowest value")                                                \
  X(max, "float", "(required)", "highest value")                                               \
  X(perturb, "list", "[0.8, 1.2]", "explore: the value is multiplied by one of these factors") \
  X(log_scale, "bool", "false", "draw anew on a log scale (needs min > 0)")

// defaults: beside the restart, checkpoint and group blocks (X-macro settings).
#define AGENTRT_DEFAULTS_LIST_KEYS(X)                                \
  X(command, "list", "[agent-worker]",                               \
    "program and arguments every agent runs unless it sets command") \
  X(env, "map", "{}", "environment variables for every agent (agents add to and override them)")

// restart.elastic (defaults.restart or an agent's restart).
#define AGENTRT_ELASTIC_KEYS(X)                                                             \
  X(min_ranks, "int", "(required)",                                                         \
    "when a node of the agent dies and no spare fits, go on with the ranks of its healthy " \
    "nodes if at least this many (its checkpoint re-sharded); it grows back at the next "   \
    "requeue")

// The key lists and their prefixes in `validate --settings`, one row per list block.
#define AGENTRT_LIST_KEY_BLOCKS(X)                     \
  X(AGENTRT_DEFAULTS_LIST_KEYS, "defaults.")           \
  X(AGENTRT_ELASTIC_KEYS, "defaults.restart.elastic.") \
  X(AGENTRT_AGENT_KEYS, "agents[].")                   \
  X(AGENTRT_NODE_KEYS, "cluster.nodes[].")             \
  X(AGENTRT_CHANNEL_KEYS, "channels[].")               \
  X(AGENTRT_LEAGUE_MEMBER_KEYS, "league.members[].")   \
  X(AGENTRT_PBT_LIST_KEYS, "pbt[].")                   \
  X(AGENTRT_PBT_HYPERPARAMETER_KEYS, "pbt[].hyperparameters.<arg>.")

#define AGENTRT_LISTED_KEY(name, type, default_value, doc) #name,

inline const std::vector<std::string> kLeagueMemberKeys = {
    AGENTRT_LEAGUE_MEMBER_KEYS(AGENTRT_LISTED_KEY)};
inline const std::vector<std::string> kPbtHyperparameterKeys = {
    AGENTRT_PBT_HYPERPARAMETER_KEYS(AGENTRT_LISTED_KEY)};
// Keys of league: beside its X-macro settings.
inline const std::vector<std::string> kLeagueListKeys = {"members"};
inline const std::vector<std::string> kPbtListKeys = {AGENTRT_PBT_LIST_KEYS(AGENTRT_LISTED_KEY)};
inline const std::vector<std::string> kClusterKeys = {"nodes", "ports", "links", "peak"};
inline const std::vector<std::string> kNodeKeys = {AGENTRT_NODE_KEYS(AGENTRT_LISTED_KEY)};
inline const std::vector<std::string> kDefaultsKeys = {
    "restart", "checkpoint", "group", AGENTRT_DEFAULTS_LIST_KEYS(AGENTRT_LISTED_KEY)};
inline const std::vector<std::string> kAgentKeys = {AGENTRT_AGENT_KEYS(AGENTRT_LISTED_KEY)};
inline const std::vector<std::string> kElasticKeys = {AGENTRT_ELASTIC_KEYS(AGENTRT_LISTED_KEY)};
inline const std::vector<std::string> kChannelKeys = {AGENTRT_CHANNEL_KEYS(AGENTRT_LISTED_KEY)};
inline constexpr int kMaxGpusPerNode = 64;

inline const std::regex& NameRegex() {
  static const std::regex r("[A-Za-z0-9][A-Za-z0-9_.-]{0,62}");
  return r;
}
inline const std::regex& EnvKeyRegex() {
  static const std::regex r("[A-Za-z_][A-Za-z0-9_]*");
  return r;
}
inline const std::regex& TopicRegex() {
  // '*' makes a topic pattern ("probe/*"): the channel's ACL covers every
  // topic it matches (fnmatch, as comms/auth.h applies it).
  static const std::regex r("[A-Za-z0-9_.{}/*-]{1,200}");
  return r;
}

// Variables the launcher sets itself (the agent contract, plan/agent_env.h); a config must not
// override them.
inline bool IsReservedEnv(const std::string& key) {
  static const std::set<std::string> kReserved = {
      "RANK",        "WORLD_SIZE",  "LOCAL_RANK",          "LOCAL_WORLD_SIZE",
      "MASTER_ADDR", "MASTER_PORT", "CUDA_VISIBLE_DEVICES"};
  return kReserved.count(key) > 0 || key.rfind("AGENTRT_", 0) == 0;
}

// The channels:, league: and pbt: blocks (loader_population.cc).
void ParseChannels(Converter& c, const YAML::Node& list, Config& config);
void ParseLeague(Converter& c, const YAML::Node& n, Config& config);
void ParsePbt(Converter& c, const YAML::Node& list, Config& config);

}  // namespace agentrt::loader_internal
