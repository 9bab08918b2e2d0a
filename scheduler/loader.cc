#include "scheduler/loader.h"

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

namespace agentrt {
namespace {

// Thrown while converting; caught at the module boundary and turned into a
// Status (exceptions are confined to configuration parsing).
class ConfigError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

std::string Location(std::string_view source, int line, int column) {
  return fmt::format("{}:{}:{}", source, line, column);
}

// ---------------------------------------------------------------------------
// The pre-scan: one pass, O(1) memory besides the indentation stack.

bool IsTokenStart(std::string_view text, size_t i) {
  if (i == 0) return true;
  char p = text[i - 1];
  return p == ' ' || p == '\t' || p == '\n' || p == '\r' || p == '[' || p == '{' || p == ',';
}

}  // namespace

Status PrescanYaml(std::string_view text, std::string_view source, const LoadLimits& limits) {
  if (text.size() > limits.max_bytes) {
    return InvalidArgument(fmt::format("{}: file is {} bytes; the limit for a config is {} bytes",
                                       source, text.size(), limits.max_bytes));
  }
  int line = 1;
  size_t line_start = 0;
  int flow_depth = 0;
  int anchors = 0;
  int aliases = 0;
  std::vector<size_t> indents;  // block indentation stack
  enum { kPlain, kSingle, kDouble } quote = kPlain;
  bool at_line_start = true;
  auto fail = [&](size_t i, std::string_view what) {
    return InvalidArgument(
        fmt::format("{}: {}", Location(source, line, static_cast<int>(i - line_start) + 1), what));
  };
  auto depth_check = [&](size_t i) -> Status {
    const int depth = static_cast<int>(indents.size()) + flow_depth;
    if (depth > limits.max_depth) {
      return fail(i, fmt::format("nesting deeper than {} levels; a config never needs that",
                                 limits.max_depth));
    }
    return Status::Ok();
  };
  for (size_t i = 0; i < text.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
    if (c < 0x20 && c != '\n' && c != '\r' && c != '\t') {
      return fail(i, fmt::format("byte 0x{:02x} is not allowed in YAML; is this a text file?", c));
    }
    if (c == '\n') {
      ++line;
      line_start = i + 1;
      at_line_start = true;
      continue;
    }
    if (quote == kSingle) {
      if (c == '\'') quote = kPlain;  // '' (escaped quote) re-enters on the next char
      continue;
    }
    if (quote == kDouble) {
      if (c == '\\') {
        ++i;
      } else if (c == '"') {
        quote = kPlain;
      }
      continue;
    }
    if (at_line_start && flow_depth == 0) {
      // Block structure: the indentation column, plus one level per compact
      // `- ` sequence entry on the same line.
      size_t k = i;
      while (k < text.size() && text[k] == ' ') ++k;
      if (k >= text.size() || text[k] == '\n' || text[k] == '\r' || text[k] == '#') {
        at_line_start = false;
        i = k - 1;
        continue;  // blank or comment-only line
      }
      size_t column = k - line_start;
      while (!indents.empty() && indents.back() > column) indents.pop_back();
      if (indents.empty() || indents.back() < column) indents.push_back(column);
      while (k + 1 < text.size() && text[k] == '-' && (text[k + 1] == ' ' || text[k + 1] == '\t')) {
        k += 2;
        while (k < text.size() && text[k] == ' ') ++k;
        indents.push_back(k - line_start);
      }
      AGENTRT_RETURN_IF_ERROR(depth_check(i));
      at_line_start = false;
      i = k - 1;
      continue;
    }
    at_line_start = false;
    if (c == ']' || c == '}') {
      flow_depth = std::max(0, flow_depth - 1);
      continue;
    }
    if (!IsTokenStart(text, i)) continue;
    switch (c) {
      case '#':
        while (i + 1 < text.size() && text[i + 1] != '\n') ++i;
        break;
      case '\'':
        quote = kSingle;
        break;
      case '"':
        quote = kDouble;
        break;
      case '[':
      case '{':
        ++flow_depth;
        AGENTRT_RETURN_IF_ERROR(depth_check(i));
        break;
      case '&':
        if (++anchors > limits.max_anchors) {
          return fail(i, fmt::format("more than {} anchors (&); refusing a possible alias bomb",
                                     limits.max_anchors));
        }
        break;
      case '*':
        if (++aliases > limits.max_aliases) {
          return fail(i, fmt::format("more than {} aliases (*); refusing a possible alias bomb",
                                     limits.max_aliases));
        }
        break;
      default:
        break;
    }
  }
  return Status::Ok();
}

namespace {

// Levenshtein distance, bounded to short keys.
size_t EditDistance(std::string_view a, std::string_view b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t sub = prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1);
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, sub});
    }
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

}  // namespace

std::string ClosestMatch(std::string_view word, const std::vector<std::string>& candidates) {
  std::string best;
  size_t best_distance = std::max<size_t>(2, word.size() / 3) + 1;
  for (const std::string& candidate : candidates) {
    size_t d = EditDistance(word, candidate);
    if (d < best_distance) {
      best_distance = d;
      best = candidate;
    }
  }
  return best;
}

namespace {

// ---------------------------------------------------------------------------
// YAML → Config conversion.

std::string Join(const std::string& path, std::string_view key) {
  return path.empty() ? std::string(key) : fmt::format("{}.{}", path, key);
}
std::string Index(const std::string& path, size_t i) { return fmt::format("{}[{}]", path, i); }

std::string KindName(const YAML::Node& n) {
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

bool IsQuoted(const YAML::Node& n) { return n.Tag() == "!"; }

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

const std::vector<std::string> kTopKeys = {"run",    "cluster",  "slurm",     "bus",    "defaults",
                                           "agents", "channels", "preflight", "league", "pbt"};
const std::vector<std::string> kLeagueMemberKeys = {"agents", "role", "matchmaking", "newest_share",
                                                    "opponents"};
const std::vector<std::string> kPbtHyperparameterKeys = {"min", "max", "perturb", "log_scale"};
// Keys of league: and of a pbt: population beside their X-macro settings.
const std::vector<std::string> kLeagueListKeys = {"members"};
const std::vector<std::string> kPbtListKeys = {"name", "agents", "hyperparameters"};
const std::vector<std::string> kClusterKeys = {"nodes", "ports", "links", "peak"};
const std::vector<std::string> kNodeKeys = {"name", "gpus", "cpus", "nvlink_domains", "gpu_type"};
const std::vector<std::string> kDefaultsKeys = {"restart", "checkpoint", "group", "command", "env"};
const std::vector<std::string> kAgentKeys = {
    "name",    "replicas", "gpus",       "ranks", "command", "env",     "args",
    "restart", "workdir",  "checkpoint", "group", "nodes",   "backend", "gpu_type"};
const std::vector<std::string> kChannelKeys = {"topic", "publishers", "subscribers"};
constexpr int kMaxGpusPerNode = 64;

const std::regex& NameRegex() {
  static const std::regex r("[A-Za-z0-9][A-Za-z0-9_.-]{0,62}");
  return r;
}
const std::regex& EnvKeyRegex() {
  static const std::regex r("[A-Za-z_][A-Za-z0-9_]*");
  return r;
}
const std::regex& TopicRegex() {
  // '*' makes a topic pattern ("probe/*"): the channel's ACL covers every
  // topic it matches (fnmatch, as comms/auth.h applies it).
  static const std::regex r("[A-Za-z0-9_.{}/*-]{1,200}");
  return r;
}

// Variables the launcher sets itself (the agent contract, plan/agent_env.h); a config must not
// override them.
bool IsReservedEnv(const std::string& key) {
  static const std::set<std::string> kReserved = {
      "RANK",        "WORLD_SIZE",  "LOCAL_RANK",          "LOCAL_WORLD_SIZE",
      "MASTER_ADDR", "MASTER_PORT", "CUDA_VISIBLE_DEVICES"};
  return kReserved.count(key) > 0 || key.rfind("AGENTRT_", 0) == 0;
}

class ConfigBuilder {
 public:
  // `base_dir`: the folder relative paths in the config are taken from.
  explicit ConfigBuilder(Converter& c, std::string base_dir = ".",
                         std::map<std::string, ArgsValidator> validators = {})
      : c_(c),
        base_dir_(std::filesystem::absolute(base_dir).lexically_normal().string()),
        validators_(std::move(validators)) {}

  Config Build(const YAML::Node& root) {
    Config config;
    config.source = c_.source();
    if (root.IsNull() || !root.IsDefined()) {
      c_.Fail(YAML::Mark(), "",
              "the config is empty; expected a map with at least an 'agents:' list");
    }
    if (!root.IsMap()) {
      c_.Fail(root, "",
              fmt::format("expected a map with at least an 'agents:' list at the top, got {}",
                          KindName(root)));
    }
    c_.CheckMap(root, "", kTopKeys);
    if (const YAML::Node n = root["run"]; n.IsDefined()) ParseRun(n, config.run);
    if (const YAML::Node n = root["cluster"]; n.IsDefined())
      ParseCluster(n, "cluster", config.cluster, nullptr);
    if (const YAML::Node n = root["slurm"]; n.IsDefined()) ParseSlurm(n, config.slurm);
    if (const YAML::Node n = root["bus"]; n.IsDefined()) ParseBus(n, config.bus);
    if (const YAML::Node n = root["preflight"]; n.IsDefined()) ParsePreflight(n, config.preflight);
    if (const YAML::Node n = root["defaults"]; n.IsDefined()) ParseDefaults(n, config.defaults);
    const YAML::Node agents = root["agents"];
    if (!agents.IsDefined()) c_.Fail(root, "agents", "missing; expected a list of agents");
    ParseAgents(agents, config);
    if (const YAML::Node n = root["channels"]; n.IsDefined()) ParseChannels(n, config);
    if (const YAML::Node n = root["league"]; n.IsDefined()) ParseLeague(n, config);
    if (const YAML::Node n = root["pbt"]; n.IsDefined()) ParsePbt(n, config);
    return config;
  }

  void ParseRun(const YAML::Node& n, RunConfig& run) {
    c_.CheckMap(n, "run", {AGENTRT_RUN_SETTINGS(AGENTRT_KEY_NAME)});
#define AGENTRT_READ(type, name, default_value, doc) c_.Read(n, "run", #name, run.name);
    AGENTRT_RUN_SETTINGS(AGENTRT_READ)
#undef AGENTRT_READ
    if (!std::regex_match(run.name, NameRegex())) {
      c_.Fail(
          n["name"], "run.name",
          "expected letters, digits, '_', '.', '-' (at most 63), starting with a letter or digit");
    }
    if (run.dir.empty()) c_.Fail(n["dir"], "run.dir", "expected a directory, got an empty string");
  }

  // Fills `cluster`; sets *ports_given when the block states `ports:`.
  void ParseCluster(const YAML::Node& n, const std::string& path, ClusterConfig& cluster,
                    bool* ports_given) {
    c_.CheckMap(n, path, kClusterKeys);
    if (const YAML::Node nodes = n["nodes"]; nodes.IsDefined()) {
      const std::string npath = Join(path, "nodes");
      if (!nodes.IsSequence())
        c_.Fail(nodes, npath, fmt::format("expected a list of nodes, got {}", KindName(nodes)));
      std::set<std::string> names;
      for (size_t i = 0; i < nodes.size(); ++i)
        ParseNodes(nodes[i], Index(npath, i), cluster.nodes, names);
    }
    if (const YAML::Node ports = n["ports"]; ports.IsDefined()) {
      if (ports_given != nullptr) *ports_given = true;
      ParsePorts(ports, Join(path, "ports"), cluster.ports);
    }
    if (const YAML::Node links = n["links"]; links.IsDefined()) {
      const std::string lpath = Join(path, "links");
      c_.CheckMap(links, lpath, {AGENTRT_LINK_SETTINGS(AGENTRT_KEY_NAME)});
#define AGENTRT_READ(type, name, default_value, doc) \
  c_.Read(links, lpath, #name, cluster.links.name);  \
  if (!(cluster.links.name > 0))                     \
    c_.Fail(links[#name], Join(lpath, #name),        \
            fmt::format("expected a positive bandwidth in GB/s, got {}", cluster.links.name));
      AGENTRT_LINK_SETTINGS(AGENTRT_READ)
#undef AGENTRT_READ
    }
    if (const YAML::Node peak = n["peak"]; peak.IsDefined()) {
      const std::string ppath = Join(path, "peak");
      c_.CheckMap(peak, ppath, {AGENTRT_PEAK_SETTINGS(AGENTRT_KEY_NAME)});
#define AGENTRT_READ(type, name, default_value, doc) \
  c_.Read(peak, ppath, #name, cluster.peak.name);    \
  if (cluster.peak.name < 0)                         \
    c_.Fail(peak[#name], Join(ppath, #name),         \
            fmt::format("expected 0 or more, got {}", cluster.peak.name));
      AGENTRT_PEAK_SETTINGS(AGENTRT_READ)
#undef AGENTRT_READ
    }
  }

  void ParsePreflight(const YAML::Node& n, PreflightConfig& p) {
    c_.CheckMap(n, "preflight", {AGENTRT_PREFLIGHT_SETTINGS(AGENTRT_KEY_NAME)});
#define AGENTRT_READ(type, name, default_value, doc) c_.Read(n, "preflight", #name, p.name);
    AGENTRT_PREFLIGHT_SETTINGS(AGENTRT_READ)
#undef AGENTRT_READ
    if (!(p.min_efficiency >= 0 && p.min_efficiency <= 1))
      c_.Fail(n["min_efficiency"], "preflight.min_efficiency",
              fmt::format("expected a fraction in 0..1, got {}", p.min_efficiency));
    if (p.max_bytes < 8 || p.max_bytes > (int64_t{1} << 34))
      c_.Fail(n["max_bytes"], "preflight.max_bytes",
              fmt::format("expected 8 B .. 16 GiB, got {}", p.max_bytes));
    if (p.checkpoint_probe_bytes < 1 || p.checkpoint_bytes < 0)
      c_.Fail(n, "preflight",
              "checkpoint_probe_bytes must be positive, checkpoint_bytes 0 or more");
  }

  void ParseNodes(const YAML::Node& n, const std::string& path, std::vector<NodeSpec>& out,
                  std::set<std::string>& names) {
    c_.CheckMap(n, path, kNodeKeys);
    NodeSpec spec;
    std::string expr;
    if (!c_.Read(n, path, "name", expr))
      c_.Fail(n, Join(path, "name"), "missing; expected a hostlist like node[01-04]");
    Result<std::vector<std::string>> hosts = ExpandHostlist(expr);
    if (!hosts.ok()) c_.Fail(n["name"], Join(path, "name"), hosts.status().message());
    c_.Read(n, path, "gpus", spec.gpus);
    if (spec.gpus < 0 || spec.gpus > kMaxGpusPerNode) {
      c_.Fail(n["gpus"], Join(path, "gpus"),
              fmt::format("expected 0..{} GPUs, got {}", kMaxGpusPerNode, spec.gpus));
    }
    c_.Read(n, path, "gpu_type", spec.gpu_type);
    if (c_.Read(n, path, "cpus", spec.cpus) && spec.cpus < 1) {
      c_.Fail(n["cpus"], Join(path, "cpus"),
              fmt::format("expected at least 1 CPU, got {}", spec.cpus));
    }
    if (const YAML::Node domains = n["nvlink_domains"]; domains.IsDefined()) {
      const std::string dpath = Join(path, "nvlink_domains");
      if (!domains.IsSequence()) {
        c_.Fail(domains, dpath,
                fmt::format("expected a list of GPU id lists like [[0,1],[2,3]], got {}",
                            KindName(domains)));
      }
      std::vector<int> owner(static_cast<size_t>(spec.gpus), -1);
      for (size_t d = 0; d < domains.size(); ++d) {
        const YAML::Node domain = domains[d];
        if (!domain.IsSequence() || domain.size() == 0) {
          c_.Fail(domain, Index(dpath, d),
                  fmt::format("expected a non-empty list of GPU ids, got {}", KindName(domain)));
        }
        std::vector<int> ids;
        for (size_t k = 0; k < domain.size(); ++k) {
          int id = 0;
          c_.Convert(domain[k], Index(Index(dpath, d), k), id);
          if (id < 0 || id >= spec.gpus) {
            c_.Fail(domain[k], Index(Index(dpath, d), k),
                    fmt::format("expected a GPU id in 0..{}, got {}", spec.gpus - 1, id));
          }
          if (owner[static_cast<size_t>(id)] >= 0) {
            c_.Fail(
                domain[k], Index(Index(dpath, d), k),
                fmt::format("GPU {} is already in domain {}", id, owner[static_cast<size_t>(id)]));
          }
          owner[static_cast<size_t>(id)] = static_cast<int>(d);
          ids.push_back(id);
        }
        std::sort(ids.begin(), ids.end());
        spec.nvlink_domains.push_back(std::move(ids));
      }
      for (int g = 0; g < spec.gpus; ++g) {
        if (owner[static_cast<size_t>(g)] < 0) {
          c_.Fail(domains, dpath,
                  fmt::format("GPU {} is in no domain; the domains must cover GPUs 0..{}", g,
                              spec.gpus - 1));
        }
      }
    } else if (spec.gpus > 0) {
      std::vector<int> all(static_cast<size_t>(spec.gpus));
      for (int g = 0; g < spec.gpus; ++g) all[static_cast<size_t>(g)] = g;
      spec.nvlink_domains.push_back(std::move(all));
    }
    for (const std::string& host : *hosts) {
      if (!names.insert(host).second)
        c_.Fail(n["name"], Join(path, "name"), fmt::format("node '{}' is listed twice", host));
      NodeSpec copy = spec;
      copy.name = host;
      out.push_back(std::move(copy));
    }
  }

  void ParsePorts(const YAML::Node& n, const std::string& path, PortConfig& ports) {
    c_.CheckMap(n, path, {AGENTRT_PORT_SETTINGS(AGENTRT_KEY_NAME)});
#define AGENTRT_READ(type, name, default_value, doc) c_.Read(n, path, #name, ports.name);
    AGENTRT_PORT_SETTINGS(AGENTRT_READ)
#undef AGENTRT_READ
    auto port_ok = [](int p) { return p >= 1 && p <= 65535; };
    if (!port_ok(ports.first))
      c_.Fail(n["first"], Join(path, "first"),
              fmt::format("expected a port in 1..65535, got {}", ports.first));
    if (!port_ok(ports.last))
      c_.Fail(n["last"], Join(path, "last"),
              fmt::format("expected a port in 1..65535, got {}", ports.last));
    if (ports.last < ports.first) {
      c_.Fail(n, path, fmt::format("expected first <= last, got {}-{}", ports.first, ports.last));
    }
    if (ports.per_agent < 1) {
      c_.Fail(n["per_agent"], Join(path, "per_agent"),
              fmt::format("expected at least 1 port per agent, got {}", ports.per_agent));
    }
    if (ports.BlockCount() < 2) {
      c_.Fail(
          n, path,
          fmt::format(
              "port range too small: {}-{} holds {} block(s) of {} ports; expected room for "
              "the bus and at least one agent (2 blocks, {} ports)",
              ports.first, ports.last, ports.BlockCount(), ports.per_agent, 2 * ports.per_agent));
    }
  }

  void ParseSlurm(const YAML::Node& n, SlurmConfig& slurm) {
    c_.CheckMap(n, "slurm", {AGENTRT_SLURM_SETTINGS(AGENTRT_KEY_NAME)});
#define AGENTRT_READ(type, name, default_value, doc) c_.Read(n, "slurm", #name, slurm.name);
    AGENTRT_SLURM_SETTINGS(AGENTRT_READ)
#undef AGENTRT_READ
    static const std::regex kTime(R"((\d+-)?\d+(:\d+){0,2}|UNLIMITED|unlimited|infinite)");
    if (!std::regex_match(slurm.time, kTime)) {
      c_.Fail(n["time"], "slurm.time",
              fmt::format("expected [D-]HH:MM:SS, MM or UNLIMITED, got '{}'", slurm.time));
    }
    if (slurm.spare_nodes < 0 || slurm.spare_nodes > 1024) {
      c_.Fail(n["spare_nodes"], "slurm.spare_nodes",
              fmt::format("expected 0..1024 nodes, got {}", slurm.spare_nodes));
    }
    if (slurm.signal_grace_s < 0 || slurm.signal_grace_s > 65533) {
      c_.Fail(n["signal_grace_s"], "slurm.signal_grace_s",
              fmt::format("expected 0..65533 seconds, got {}", slurm.signal_grace_s));
    }
  }

  void ParseBus(const YAML::Node& n, BusConfig& bus) {
    c_.CheckMap(n, "bus", {AGENTRT_BUS_SETTINGS(AGENTRT_KEY_NAME)});
    const YAML::Node port = n["port"];
    if (port.IsDefined() && !(port.IsScalar() && !IsQuoted(port) && port.Scalar() == "auto")) {
      c_.Convert(port, "bus.port", bus.port);
      if (bus.port < 1 || bus.port > 65535)
        c_.Fail(port, "bus.port",
                fmt::format("expected auto or a port in 1..65535, got {}", bus.port));
    }
#define AGENTRT_READ(type, name, default_value, doc) \
  if (std::string_view(#name) != "port") c_.Read(n, "bus", #name, bus.name);
    AGENTRT_BUS_SETTINGS(AGENTRT_READ)
#undef AGENTRT_READ
    Positive(n, "bus", "max_message_bytes", bus.max_message_bytes);
    if (bus.max_message_bytes > kMaxMessageBytesCeiling)
      c_.Fail(n["max_message_bytes"], "bus.max_message_bytes",
              fmt::format("{} is above the largest message the bus carries, {} (1 GiB)",
                          bus.max_message_bytes, kMaxMessageBytesCeiling));
    Positive(n, "bus", "retention", bus.retention);
    Positive(n, "bus", "retention_bytes", bus.retention_bytes);
    Positive(n, "bus", "fsync_interval_ms", bus.fsync_interval_ms);
    Positive(n, "bus", "segment_bytes", bus.segment_bytes);
    if (auto d = ParseBusDurability(bus.durability); !d.ok())
      c_.Fail(n["durability"], "bus.durability", d.status().message());
    NotNegativeSeconds(n, "bus", "retention_age_s", bus.retention_age_s, " (no age limit)");
    if (!(bus.call_timeout_s > 0))
      c_.Fail(n["call_timeout_s"], "bus.call_timeout_s",
              fmt::format("expected a positive number of seconds, got {}", bus.call_timeout_s));
    if (bus.tls && (bus.cert_file.empty() || bus.key_file.empty())) {
      c_.Fail(n["tls"], "bus.tls", "expected cert_file and key_file when tls is true");
    }
  }

  template <typename T>
  void Positive(const YAML::Node& n, const std::string& path, const char* key, T value) {
    if (value < 1)
      c_.Fail(n[key], Join(path, key), fmt::format("expected a positive count, got {}", value));
  }

  // A duration that may be 0 (`zero_means`, e.g. " (not watched)") but not negative.
  void NotNegativeSeconds(const YAML::Node& n, const std::string& path, const char* key,
                          double value, std::string_view zero_means = "") {
    if (value < 0)
      c_.Fail(n[key], Join(path, key),
              fmt::format("expected 0{} or more seconds, got {}", zero_means, value));
  }

  void ParseRestart(const YAML::Node& n, const std::string& path, RestartPolicy& r) {
    c_.CheckMap(n, path, {AGENTRT_RESTART_SETTINGS(AGENTRT_KEY_NAME)});
#define AGENTRT_READ(type, name, default_value, doc) c_.Read(n, path, #name, r.name);
    AGENTRT_RESTART_SETTINGS(AGENTRT_READ)
#undef AGENTRT_READ
    if (r.max_restarts < 0)
      c_.Fail(n["max_restarts"], Join(path, "max_restarts"),
              fmt::format("expected 0 or more, got {}", r.max_restarts));
    if (r.backoff_s < 0)
      c_.Fail(n["backoff_s"], Join(path, "backoff_s"),
              fmt::format("expected 0 or more seconds, got {}", r.backoff_s));
    if (!(r.heartbeat_timeout_s > 0))
      c_.Fail(n["heartbeat_timeout_s"], Join(path, "heartbeat_timeout_s"),
              fmt::format("expected a positive number of seconds, got {}", r.heartbeat_timeout_s));
    NotNegativeSeconds(n, path, "grace_s", r.grace_s);
    NotNegativeSeconds(n, path, "progress_timeout_s", r.progress_timeout_s, " (not watched)");
  }

  void ParseGroup(const YAML::Node& n, const std::string& path, GroupPolicy& g) {
    c_.CheckMap(n, path, {AGENTRT_GROUP_SETTINGS(AGENTRT_KEY_NAME)});
#define AGENTRT_READ(type, name, default_value, doc) c_.Read(n, path, #name, g.name);
    AGENTRT_GROUP_SETTINGS(AGENTRT_READ)
#undef AGENTRT_READ
    NotNegativeSeconds(n, path, "collective_timeout_s", g.collective_timeout_s, " (not watched)");
  }

  void ParseCheckpoint(const YAML::Node& n, const std::string& path, CheckpointPolicy& cp) {
    c_.CheckMap(n, path, {AGENTRT_CHECKPOINT_SETTINGS(AGENTRT_KEY_NAME)});
#define AGENTRT_READ(type, name, default_value, doc) c_.Read(n, path, #name, cp.name);
    AGENTRT_CHECKPOINT_SETTINGS(AGENTRT_READ)
#undef AGENTRT_READ
    if (!(cp.interval_s > 0))
      c_.Fail(n["interval_s"], Join(path, "interval_s"),
              fmt::format("expected a positive number of seconds, got {}", cp.interval_s));
    if (cp.keep_last < 1)
      c_.Fail(n["keep_last"], Join(path, "keep_last"),
              fmt::format("expected at least 1, got {}", cp.keep_last));
  }

  // A relative program path (`bin/agent`, `./run.sh`) and a relative script
  // argument (`train.py`, `scripts/go.sh`) are taken from the folder of the
  // config, so `command: [python3, train.py]` next to agents.yaml works from
  // wherever agentctl runs (and in the agent's own working directory); a bare
  // program name is looked up in PATH at launch.
  void ParseCommand(const YAML::Node& n, const std::string& path,
                    std::vector<std::string>& command) {
    c_.Convert(n, path, command);
    if (command.empty() || command[0].empty())
      c_.Fail(n, path, "expected a program and its arguments, e.g. [python3, train.py]");
    for (size_t i = 0; i < command.size(); ++i) {
      const std::string& word = command[i];
      const bool program_path = i == 0 && word.find('/') != std::string::npos;
      const bool script = i > 0 && IsScriptPath(word);
      if (word.empty() || word.front() == '/' || (!program_path && !script)) continue;
      const std::filesystem::path resolved =
          (std::filesystem::path(base_dir_) / word).lexically_normal();
      std::error_code ec;
      if (!std::filesystem::is_regular_file(resolved, ec)) {
        c_.Fail(n.IsSequence() && i < n.size() ? n[i] : n, Index(path, i),
                fmt::format("no such file {} (relative paths in command are taken from the "
                            "folder of the config, {})",
                            resolved.string(), base_dir_));
      }
      command[i] = resolved.string();
    }
  }

  // The agent's args as its program sees them (LoadOptions::args_validators),
  // failing at the key the problem is about.
  void ValidateArgs(const YAML::Node& n, const std::string& path, const AgentConfig& agent) {
    if (validators_.empty() || agent.command.empty()) return;
    const auto v = validators_.find(std::filesystem::path(agent.command[0]).filename().string());
    if (v == validators_.end()) return;
    const std::optional<ArgsProblem> problem = v->second(agent.args);
    if (!problem) return;
    const YAML::Node args = n["args"];
    if (args.IsMap() && !problem->key.empty()) {
      for (auto it = args.begin(); it != args.end(); ++it) {
        if (it->first.Scalar() == problem->key) {
          c_.Fail(it->first, Join(Join(path, "args"), problem->key), problem->message);
        }
      }
    }
    c_.Fail(args.IsDefined() ? args : n, Join(path, "args"), problem->message);
  }

  // `train.py`, `scripts/run.sh`: a relative path with a script's extension
  // and no spaces (an inline `-c "..."` program is left alone).
  static bool IsScriptPath(const std::string& w) {
    if (w.empty() || w.front() == '-' || w.find_first_of(" \t\n=") != std::string::npos)
      return false;
    static const std::set<std::string> kExtensions = {".py",  ".sh", ".bash", ".pl", ".rb",
                                                      ".lua", ".jl", ".R",    ".js"};
    return kExtensions.count(std::filesystem::path(w).extension().string()) > 0;
  }

  void ParseEnv(const YAML::Node& n, const std::string& path,
                std::map<std::string, std::string>& env) {
    c_.Convert(n, path, env);
    for (auto it = n.begin(); it != n.end(); ++it) {
      const std::string key = it->first.Scalar();
      if (!std::regex_match(key, EnvKeyRegex()))
        c_.Fail(it->first, Join(path, key),
                "expected an environment variable name ([A-Za-z_][A-Za-z0-9_]*)");
      if (IsReservedEnv(key))
        c_.Fail(it->first, Join(path, key),
                "is set by agentrt for every rank; it cannot be overridden");
    }
  }

  void ParseDefaults(const YAML::Node& n, AgentDefaults& d) {
    c_.CheckMap(n, "defaults", kDefaultsKeys);
    if (const YAML::Node r = n["restart"]; r.IsDefined())
      ParseRestart(r, "defaults.restart", d.restart);
    if (const YAML::Node cp = n["checkpoint"]; cp.IsDefined())
      ParseCheckpoint(cp, "defaults.checkpoint", d.checkpoint);
    if (const YAML::Node g = n["group"]; g.IsDefined()) ParseGroup(g, "defaults.group", d.group);
    if (const YAML::Node cmd = n["command"]; cmd.IsDefined())
      ParseCommand(cmd, "defaults.command", d.command);
    if (const YAML::Node env = n["env"]; env.IsDefined()) ParseEnv(env, "defaults.env", d.env);
  }

  void ParseAgents(const YAML::Node& list, Config& config) {
    c_.Visit(list);
    if (!list.IsSequence() || list.size() == 0) {
      c_.Fail(list, "agents",
              fmt::format("expected a non-empty list of agents, got {}", KindName(list)));
    }
    std::map<std::string, std::string> where;  // expanded name → where it was declared
    for (size_t i = 0; i < list.size(); ++i) {
      const YAML::Node n = list[i];
      const std::string path = Index("agents", i);
      c_.CheckMap(n, path, kAgentKeys);
      AgentConfig base;
      base.line = n.Mark().line + 1;
      base.column = n.Mark().column + 1;
      if (!c_.Read(n, path, "name", base.base_name))
        c_.Fail(n, Join(path, "name"), "missing; every agent needs a name");
      if (!std::regex_match(base.base_name, NameRegex())) {
        c_.Fail(n["name"], Join(path, "name"),
                fmt::format("expected letters, digits, '_', '.', '-' (at most 63), starting with a "
                            "letter or digit, got '{}'",
                            base.base_name));
      }
      int replicas = 1;
      const bool has_replicas = c_.Read(n, path, "replicas", replicas);
      if (replicas < 1)
        c_.Fail(n["replicas"], Join(path, "replicas"),
                fmt::format("expected at least 1, got {}", replicas));
      if (replicas > 100000)
        c_.Fail(n["replicas"], Join(path, "replicas"),
                fmt::format("expected at most 100000, got {}", replicas));
      c_.Read(n, path, "gpus", base.gpus);
      if (base.gpus < 0)
        c_.Fail(n["gpus"], Join(path, "gpus"),
                fmt::format("expected 0 (a CPU agent) or more GPUs, got {}", base.gpus));
      if (c_.Read(n, path, "gpu_type", base.gpu_type) && base.gpus == 0) {
        c_.Fail(
            n["gpu_type"], Join(path, "gpu_type"),
            fmt::format("a CPU agent (gpus: 0) cannot ask for GPUs of type '{}'", base.gpu_type));
      }
      base.ranks = base.gpus > 0 ? base.gpus : 1;
      if (c_.Read(n, path, "ranks", base.ranks)) {
        if (base.ranks < 1)
          c_.Fail(n["ranks"], Join(path, "ranks"),
                  fmt::format("expected at least 1 rank, got {}", base.ranks));
        if (base.gpus > 0 && base.ranks % base.gpus != 0) {
          c_.Fail(n["ranks"], Join(path, "ranks"),
                  fmt::format("expected a multiple of gpus ({}) so every GPU has the same number "
                              "of ranks, got {}",
                              base.gpus, base.ranks));
        }
      }
      base.command = config.defaults.command;
      if (const YAML::Node cmd = n["command"]; cmd.IsDefined())
        ParseCommand(cmd, Join(path, "command"), base.command);
      base.env = config.defaults.env;
      if (const YAML::Node env = n["env"]; env.IsDefined()) {
        std::map<std::string, std::string> own;
        ParseEnv(env, Join(path, "env"), own);
        for (auto& [k, v] : own) base.env[k] = v;
      }
      if (const YAML::Node args = n["args"]; args.IsDefined()) {
        if (!args.IsMap() && !args.IsNull())
          c_.Fail(args, Join(path, "args"), fmt::format("expected a map, got {}", KindName(args)));
        if (args.IsMap()) base.args = c_.ToJson(args, Join(path, "args"));
      }
      ValidateArgs(n, path, base);
      base.restart = config.defaults.restart;
      if (const YAML::Node r = n["restart"]; r.IsDefined())
        ParseRestart(r, Join(path, "restart"), base.restart);
      base.checkpoint = config.defaults.checkpoint;
      if (const YAML::Node cp = n["checkpoint"]; cp.IsDefined())
        ParseCheckpoint(cp, Join(path, "checkpoint"), base.checkpoint);
      base.group = config.defaults.group;
      if (const YAML::Node g = n["group"]; g.IsDefined())
        ParseGroup(g, Join(path, "group"), base.group);
      if (const YAML::Node pins = n["nodes"]; pins.IsDefined()) {
        std::vector<std::string> exprs;
        c_.Convert(pins, Join(path, "nodes"), exprs);
        for (const std::string& expr : exprs) {
          Result<std::vector<std::string>> hosts = ExpandHostlist(expr);
          if (!hosts.ok()) c_.Fail(pins, Join(path, "nodes"), hosts.status().message());
          for (std::string& h : *hosts) {
            if (std::find(base.nodes.begin(), base.nodes.end(), h) == base.nodes.end())
              base.nodes.push_back(std::move(h));
          }
        }
      }
      if (const YAML::Node w = n["workdir"]; w.IsDefined()) {
        c_.Convert(w, Join(path, "workdir"), base.workdir);
        if (base.workdir.empty()) c_.Fail(w, Join(path, "workdir"), "expected a directory");
        // Relative to the config's folder, like command paths.
        base.workdir =
            (std::filesystem::path(base_dir_) / base.workdir).lexically_normal().string();
      }
      if (const YAML::Node b = n["backend"]; b.IsDefined()) {
        std::string name;
        c_.Convert(b, Join(path, "backend"), name);
        Result<GroupBackend> parsed = ParseGroupBackend(name);
        if (parsed.ok()) base.backend = *parsed;
        if (!parsed.ok() || name.empty()) {
          std::string hint = ClosestMatch(name, {"auto", "single", "mpi", "nccl"});
          c_.Fail(b, Join(path, "backend"),
                  fmt::format("expected auto, single, mpi or nccl, got '{}'{}", name,
                              hint.empty() ? "" : fmt::format("; did you mean '{}'?", hint)));
        }
      }
      if (const std::string problem = GroupBackendProblem(base.backend, base.gpus, base.ranks);
          !problem.empty()) {
        const YAML::Node b = n["backend"];
        const char* key = b.IsDefined() ? "backend" : n["ranks"].IsDefined() ? "ranks" : "gpus";
        c_.Fail(n[key], Join(path, key), problem);
      }
      for (int r = 0; r < replicas; ++r) {
        AgentConfig agent = base;
        agent.replica = r;
        agent.name = has_replicas ? fmt::format("{}-{}", base.base_name, r) : base.base_name;
        agent.index = static_cast<int>(config.agents.size());
        std::string here = Location(c_.source(), base.line, base.column);
        auto [it, inserted] = where.emplace(agent.name, here);
        if (!inserted) {
          c_.Fail(n["name"], Join(path, "name"),
                  fmt::format("agent name '{}' is already used by the agent at {}; names must be "
                              "unique after replica expansion",
                              agent.name, it->second));
        }
        config.agents.push_back(std::move(agent));
      }
    }
  }

  // Agent names matched by `pattern`, in agent order.
  static std::vector<std::string> Match(const Config& config, const std::string& pattern) {
    std::vector<std::string> out;
    for (const AgentConfig& a : config.agents) {
      if (fnmatch(pattern.c_str(), a.name.c_str(), 0) == 0) out.push_back(a.name);
    }
    return out;
  }

  std::vector<std::string> MatchAll(const Config& config, const YAML::Node& n,
                                    const std::string& path, std::vector<std::string>& patterns) {
    c_.Convert(n, path, patterns);
    std::vector<std::string> names;
    for (size_t i = 0; i < patterns.size(); ++i) {
      std::vector<std::string> matched = Match(config, patterns[i]);
      if (matched.empty()) {
        std::vector<std::string> candidates = {"*"};
        for (const AgentConfig& a : config.agents) {
          candidates.push_back(a.name);
          candidates.push_back(a.base_name + "-*");
        }
        std::string hint = ClosestMatch(patterns[i], candidates);
        c_.Fail(n.IsSequence() ? n[i] : n, n.IsSequence() ? Index(path, i) : path,
                fmt::format("pattern '{}' matches no agent{}", patterns[i],
                            hint.empty() ? "" : fmt::format("; did you mean '{}'?", hint)));
      }
      for (std::string& m : matched) {
        if (std::find(names.begin(), names.end(), m) == names.end()) names.push_back(std::move(m));
      }
    }
    // Agent order, not pattern order, so the plan does not depend on how patterns are listed.
    std::vector<std::string> ordered;
    for (const AgentConfig& a : config.agents) {
      if (std::find(names.begin(), names.end(), a.name) != names.end()) ordered.push_back(a.name);
    }
    return ordered;
  }

  void ParseChannels(const YAML::Node& list, Config& config) {
    c_.Visit(list);
    if (!list.IsSequence())
      c_.Fail(list, "channels", fmt::format("expected a list of channels, got {}", KindName(list)));
    std::map<std::string, std::string> topics;  // topic → path of its declaration
    for (size_t i = 0; i < list.size(); ++i) {
      const YAML::Node n = list[i];
      const std::string path = Index("channels", i);
      c_.CheckMap(n, path, kChannelKeys);
      ChannelConfig ch;
      if (!c_.Read(n, path, "topic", ch.topic))
        c_.Fail(n, Join(path, "topic"), "missing; every channel needs a topic");
      if (!std::regex_match(ch.topic, TopicRegex())) {
        c_.Fail(n["topic"], Join(path, "topic"),
                fmt::format("expected letters, digits, '_', '.', '/', '-', '*' (a pattern) and "
                            "{{agent}}, got '{}'",
                            ch.topic));
      }
      const YAML::Node pubs = n["publishers"];
      const YAML::Node subs = n["subscribers"];
      if (!pubs.IsDefined())
        c_.Fail(n, Join(path, "publishers"),
                "missing; expected agent name patterns like [\"predator-*\"]");
      if (!subs.IsDefined())
        c_.Fail(n, Join(path, "subscribers"),
                "missing; expected agent name patterns like [\"prey-*\"]");
      ch.publishers = MatchAll(config, pubs, Join(path, "publishers"), ch.publisher_patterns);
      ch.subscribers = MatchAll(config, subs, Join(path, "subscribers"), ch.subscriber_patterns);
      std::vector<ChannelConfig> expanded;
      const size_t placeholder = ch.topic.find("{agent}");
      if (placeholder == std::string::npos) {
        if (ch.topic.find_first_of("{}") != std::string::npos) {
          c_.Fail(n["topic"], Join(path, "topic"),
                  "the only placeholder a topic may hold is {agent}");
        }
        expanded.push_back(ch);
      } else {
        for (const std::string& publisher : ch.publishers) {
          ChannelConfig one = ch;
          one.topic.replace(placeholder, 7, publisher);
          one.publishers = {publisher};
          expanded.push_back(std::move(one));
        }
      }
      for (ChannelConfig& one : expanded) {
        auto [it, inserted] = topics.emplace(one.topic, path);
        if (!inserted)
          c_.Fail(n["topic"], Join(path, "topic"),
                  fmt::format("topic '{}' is already declared by {}", one.topic, it->second));
        config.channels.push_back(std::move(one));
      }
    }
  }

  void ParseLeague(const YAML::Node& n, Config& config) {
    LeagueConfig& league = config.league;
    std::vector<std::string> keys = {AGENTRT_LEAGUE_SETTINGS(AGENTRT_KEY_NAME)};
    keys.insert(keys.end(), kLeagueListKeys.begin(), kLeagueListKeys.end());
    c_.CheckMap(n, "league", keys);
#define AGENTRT_READ(type, name, default_value, doc) c_.Read(n, "league", #name, league.name);
    AGENTRT_LEAGUE_SETTINGS(AGENTRT_READ)
#undef AGENTRT_READ
    if (league.keep_snapshots < 1 || league.keep_snapshots > 10000)
      c_.Fail(n["keep_snapshots"], "league.keep_snapshots",
              fmt::format("expected 1..10000 snapshots, got {}", league.keep_snapshots));
    if (league.freeze_every_steps < 1)
      c_.Fail(n["freeze_every_steps"], "league.freeze_every_steps",
              fmt::format("expected at least 1 env step, got {}", league.freeze_every_steps));
    if (!(league.elo_k > 0))
      c_.Fail(n["elo_k"], "league.elo_k",
              fmt::format("expected more than 0, got {}", league.elo_k));
    const YAML::Node members = n["members"];
    if (!members.IsDefined())
      c_.Fail(n, "league.members",
              "missing; expected a list like [{agents: [hunter-*], role: main}]");
    c_.Visit(members);
    if (!members.IsSequence() || members.size() == 0)
      c_.Fail(members, "league.members", "expected a non-empty list of members");
    std::map<std::string, std::string> member_of;  // agent -> path of its entry
    std::vector<YAML::Node> opponent_nodes;
    for (size_t i = 0; i < members.size(); ++i) {
      const YAML::Node m = members[i];
      const std::string path = Index("league.members", i);
      c_.CheckMap(m, path, kLeagueMemberKeys);
      if (!m["agents"].IsDefined())
        c_.Fail(m, Join(path, "agents"), "missing; expected agent name patterns");
      std::vector<std::string> patterns;
      const std::vector<std::string> agents =
          MatchAll(config, m["agents"], Join(path, "agents"), patterns);
      std::string role;
      if (!c_.Read(m, path, "role", role))
        c_.Fail(m, Join(path, "role"),
                fmt::format("missing; expected one of {}", fmt::join(LeagueRoles(), ", ")));
      CheckOneOf(m["role"], Join(path, "role"), role, LeagueRoles(), "role");
      // AlphaStar's mix by role: main agents mostly PFSP with a share of the
      // newest, exploiters against the newest (main) or PFSP over the league.
      std::string matchmaking = role == "main_exploiter" ? "self"
                                : role == "anchor"       ? "uniform"
                                                         : "pfsp";
      double newest_share = role == "main" ? 0.35 : 0.0;
      c_.Read(m, path, "matchmaking", matchmaking);
      CheckOneOf(m["matchmaking"], Join(path, "matchmaking"), matchmaking, LeagueMatchmakings(),
                 "matchmaking");
      c_.Read(m, path, "newest_share", newest_share);
      if (!(newest_share >= 0 && newest_share <= 1))
        c_.Fail(m["newest_share"], Join(path, "newest_share"),
                fmt::format("expected a fraction in 0..1, got {}", newest_share));
      for (const std::string& agent : agents) {
        auto [it, inserted] = member_of.emplace(agent, path);
        if (!inserted)
          c_.Fail(m["agents"], Join(path, "agents"),
                  fmt::format("agent {} is already a member by {}", agent, it->second));
        league.members.push_back({agent, role, matchmaking, newest_share, {}});
      }
      opponent_nodes.insert(opponent_nodes.end(), agents.size(), m);
    }
    // Opponents are resolved once every member is known: by default every other member.
    for (size_t i = 0; i < league.members.size(); ++i) {
      LeagueMember& member = league.members[i];
      const YAML::Node m = opponent_nodes[i];
      const std::string path = member_of[member.agent];
      if (const YAML::Node o = m["opponents"]; o.IsDefined()) {
        std::vector<std::string> patterns;
        for (const std::string& agent : MatchAll(config, o, Join(path, "opponents"), patterns)) {
          if (agent == member.agent)
            c_.Fail(o, Join(path, "opponents"),
                    fmt::format("agent {} cannot be its own opponent (it plays its past through "
                                "matchmaking, not by name)",
                                agent));
          if (member_of.count(agent) == 0)
            c_.Fail(o, Join(path, "opponents"),
                    fmt::format("agent {} is not a league member; opponents are members", agent));
          member.opponents.push_back(agent);
        }
      } else {
        for (const LeagueMember& other : league.members)
          if (other.agent != member.agent) member.opponents.push_back(other.agent);
      }
      if (member.opponents.empty())
        c_.Fail(
            m, Join(path, "opponents"),
            fmt::format("agent {} has nobody to play: the league needs two members", member.agent));
    }
  }

  void ParsePbt(const YAML::Node& list, Config& config) {
    c_.Visit(list);
    if (!list.IsSequence())
      c_.Fail(list, "pbt", fmt::format("expected a list of populations, got {}", KindName(list)));
    std::map<std::string, std::string> population_of;  // agent -> path
    for (size_t i = 0; i < list.size(); ++i) {
      const YAML::Node n = list[i];
      const std::string path = Index("pbt", i);
      std::vector<std::string> keys = {AGENTRT_PBT_SETTINGS(AGENTRT_KEY_NAME)};
      keys.insert(keys.end(), kPbtListKeys.begin(), kPbtListKeys.end());
      c_.CheckMap(n, path, keys);
      PbtPopulation pop;
      pop.name = "pbt" + std::to_string(i);
      c_.Read(n, path, "name", pop.name);
#define AGENTRT_READ(type, name, default_value, doc) c_.Read(n, path, #name, pop.name);
      AGENTRT_PBT_SETTINGS(AGENTRT_READ)
#undef AGENTRT_READ
      if (!n["agents"].IsDefined())
        c_.Fail(n, Join(path, "agents"), "missing; expected agent name patterns");
      std::vector<std::string> patterns;
      pop.agents = MatchAll(config, n["agents"], Join(path, "agents"), patterns);
      if (pop.agents.size() < 2)
        c_.Fail(n["agents"], Join(path, "agents"),
                fmt::format("a population needs at least 2 agents, got {}", pop.agents.size()));
      const AgentConfig* first = config.FindAgent(pop.agents.front());
      for (const std::string& agent : pop.agents) {
        auto [it, inserted] = population_of.emplace(agent, path);
        if (!inserted)
          c_.Fail(n["agents"], Join(path, "agents"),
                  fmt::format("agent {} is already in the population {}", agent, it->second));
        const AgentConfig* a = config.FindAgent(agent);
        if (a->ranks != first->ranks)
          c_.Fail(
              n["agents"], Join(path, "agents"),
              fmt::format("agent {} has {} ranks and {} has {}: a member restarts from another's "
                          "checkpoint, so every member needs the same ranks",
                          agent, a->ranks, first->name, first->ranks));
      }
      if (pop.interval_steps < 1)
        c_.Fail(n["interval_steps"], Join(path, "interval_steps"),
                fmt::format("expected at least 1 env step, got {}", pop.interval_steps));
      if (!(pop.fraction > 0 && pop.fraction <= 0.5))
        c_.Fail(n["fraction"], Join(path, "fraction"),
                fmt::format("expected a fraction in (0, 0.5], got {}", pop.fraction));
      if (!(pop.resample_probability >= 0 && pop.resample_probability <= 1))
        c_.Fail(n["resample_probability"], Join(path, "resample_probability"),
                fmt::format("expected a probability in 0..1, got {}", pop.resample_probability));
      if (pop.metric.empty()) c_.Fail(n["metric"], Join(path, "metric"), "expected a metric name");
      if (pop.metric == "rating") {
        for (const std::string& agent : pop.agents)
          if (config.league.FindMember(agent) == nullptr)
            c_.Fail(n["metric"], Join(path, "metric"),
                    fmt::format("metric rating is the league's Elo, but agent {} is not a league "
                                "member",
                                agent));
      }
      if (pop.checkpoint_wait_s < 0)
        c_.Fail(n["checkpoint_wait_s"], Join(path, "checkpoint_wait_s"),
                fmt::format("expected 0 or more seconds, got {}", pop.checkpoint_wait_s));
      const YAML::Node hps = n["hyperparameters"];
      if (hps.IsDefined()) {
        const std::string hpath = Join(path, "hyperparameters");
        c_.Visit(hps);
        if (!hps.IsMap())
          c_.Fail(hps, hpath, fmt::format("expected a map of agent args, got {}", KindName(hps)));
        for (auto it = hps.begin(); it != hps.end(); ++it)
          pop.hyperparameters.push_back(
              ParseHyperparameter(it->first, it->second, hpath, config, pop));
      }
      config.pbt.push_back(std::move(pop));
    }
  }

 private:
  void CheckOneOf(const YAML::Node& at, const std::string& path, const std::string& value,
                  const std::vector<std::string>& allowed, const char* what) {
    if (std::find(allowed.begin(), allowed.end(), value) != allowed.end()) return;
    const std::string hint = ClosestMatch(value, allowed);
    c_.Fail(
        at, path,
        fmt::format("unknown {} '{}'; expected one of {}{}", what, value, fmt::join(allowed, ", "),
                    hint.empty() ? "" : fmt::format("; did you mean '{}'?", hint)));
  }

  PbtHyperparameter ParseHyperparameter(const YAML::Node& key, const YAML::Node& n,
                                        const std::string& hpath, const Config& config,
                                        const PbtPopulation& pop) {
    PbtHyperparameter hp;
    c_.Convert(key, hpath, hp.name);
    const std::string path = Join(hpath, hp.name);
    c_.CheckMap(n, path, kPbtHyperparameterKeys);
    if (!c_.Read(n, path, "min", hp.min))
      c_.Fail(n, Join(path, "min"), "missing; expected the lowest value");
    if (!c_.Read(n, path, "max", hp.max))
      c_.Fail(n, Join(path, "max"), "missing; expected the highest value");
    if (!(hp.min < hp.max))
      c_.Fail(n["max"], Join(path, "max"),
              fmt::format("expected more than min ({}), got {}", hp.min, hp.max));
    c_.Read(n, path, "log_scale", hp.log_scale);
    if (hp.log_scale && !(hp.min > 0))
      c_.Fail(n["min"], Join(path, "min"), fmt::format("log_scale needs min > 0, got {}", hp.min));
    if (const YAML::Node p = n["perturb"]; p.IsDefined()) {
      c_.Visit(p);
      if (!p.IsSequence() || p.size() == 0)
        c_.Fail(p, Join(path, "perturb"), "expected a list of factors like [0.8, 1.2]");
      hp.perturb.clear();
      for (size_t i = 0; i < p.size(); ++i) {
        double f = 0;
        c_.Convert(p[i], Index(Join(path, "perturb"), i), f);
        if (!(f > 0))
          c_.Fail(p[i], Index(Join(path, "perturb"), i),
                  fmt::format("expected a factor > 0, got {}", f));
        hp.perturb.push_back(f);
      }
    }
    // Every member starts from its own args.<name>, inside the bounds.
    for (const std::string& agent : pop.agents) {
      const AgentConfig* a = config.FindAgent(agent);
      const nlohmann::json* v = a->args.contains(hp.name) ? &a->args[hp.name] : nullptr;
      if (v == nullptr || !v->is_number())
        c_.Fail(key, path,
                fmt::format("agent {} sets no number args.{}: each member's starting value comes "
                            "from its args",
                            agent, hp.name));
      const double value = v->get<double>();
      if (agent == pop.agents.front()) hp.integer = v->is_number_integer();
      hp.integer = hp.integer && v->is_number_integer();
      if (value < hp.min || value > hp.max)
        c_.Fail(value < hp.min ? n["min"] : n["max"], Join(path, value < hp.min ? "min" : "max"),
                fmt::format("agent {} starts with args.{} = {}, outside [{}, {}]", agent, hp.name,
                            value, hp.min, hp.max));
    }
    return hp;
  }

  Converter& c_;
  std::string base_dir_;
  std::map<std::string, ArgsValidator> validators_;
};

// Applies `a.b.c=value` to the YAML tree; returns the value's node.
YAML::Node ApplyOverride(YAML::Node& root, const std::string& override_text,
                         const LoadLimits& limits) {
  const size_t eq = override_text.find('=');
  if (eq == std::string::npos || eq == 0) {
    throw ConfigError(fmt::format("--set {}: expected key.path=value", override_text));
  }
  const std::string path = override_text.substr(0, eq);
  if (Status st = PrescanYaml(override_text.substr(eq + 1), "--set " + override_text, limits);
      !st.ok()) {
    throw ConfigError(st.message());
  }
  YAML::Node value;
  try {
    value = YAML::Load(override_text.substr(eq + 1));
  } catch (const YAML::Exception& e) {
    throw ConfigError(
        fmt::format("--set {}: the value is not valid YAML: {}", override_text, e.msg));
  }
  if (!root.IsDefined() || root.IsNull()) root = YAML::Node(YAML::NodeType::Map);
  YAML::Node cur;
  cur.reset(root);
  size_t start = 0;
  while (true) {
    size_t dot = path.find('.', start);
    std::string key =
        path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    if (key.empty())
      throw ConfigError(fmt::format("--set {}: empty key in '{}'", override_text, path));
    if (!cur.IsMap() && !cur.IsNull()) {
      throw ConfigError(fmt::format("--set {}: '{}' is not a map in the config", override_text,
                                    path.substr(0, start - 1)));
    }
    if (dot == std::string::npos) {
      cur[key] = value;
      return value;
    }
    YAML::Node next = cur[key];
    if (!next.IsDefined() || next.IsNull()) {
      cur[key] = YAML::Node(YAML::NodeType::Map);
      next.reset(cur[key]);
    }
    cur.reset(next);
    start = dot + 1;
  }
}

YAML::Node ParseYaml(std::string_view text, const std::string& source) {
  try {
    std::vector<YAML::Node> docs = YAML::LoadAll(std::string(text));
    // A second document would be ignored silently (`agents: 5` after a `---`);
    // an empty one after a trailing `---` holds nothing to ignore.
    while (docs.size() > 1 && docs.back().IsNull()) docs.pop_back();
    if (docs.size() > 1) {
      const YAML::Mark m = docs[1].Mark();
      throw ConfigError(fmt::format(
          "{}: a second YAML document starts here; agents.yaml holds one document (remove the "
          "'---' line or merge the two)",
          m.is_null() ? source : Location(source, m.line + 1, m.column + 1)));
    }
    return docs.empty() ? YAML::Node() : docs[0];
  } catch (const ConfigError&) {
    throw;
  } catch (const YAML::Exception& e) {
    if (e.mark.is_null()) throw ConfigError(fmt::format("{}: not valid YAML: {}", source, e.msg));
    throw ConfigError(fmt::format("{}: not valid YAML: {}",
                                  Location(source, e.mark.line + 1, e.mark.column + 1), e.msg));
  }
}

Result<std::string> ReadCapped(const std::string& path, size_t max_bytes) {
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) &&
      static_cast<size_t>(st.st_size) > max_bytes) {
    return InvalidArgument(fmt::format("{}: file is {} bytes; the limit for a config is {} bytes",
                                       path, static_cast<size_t>(st.st_size), max_bytes));
  }
  Result<std::string> text = ReadWholeFile(path, max_bytes);
  if (!text.ok()) return text.status().WithContext("cannot read config");
  return text;
}

}  // namespace

Result<Config> LoadConfigString(std::string_view text, std::string_view source,
                                const LoadOptions& options) {
  AGENTRT_RETURN_IF_ERROR(PrescanYaml(text, source, options.limits));
  try {
    YAML::Node root = ParseYaml(text, std::string(source));
    Converter converter{std::string(source), options.limits};
    for (const std::string& o : options.overrides) {
      converter.AddOverride(ApplyOverride(root, o, options.limits), o);
    }
    ConfigBuilder builder{converter, options.base_dir.empty() ? "." : options.base_dir,
                          options.args_validators};
    return builder.Build(root);
  } catch (const ConfigError& e) {
    return InvalidArgument(e.what());
  } catch (const YAML::Exception& e) {
    return InvalidArgument(fmt::format("{}: {}", source, e.what()));
  }
}

Result<Config> LoadConfigFile(const std::string& path, const LoadOptions& options) {
  AGENTRT_ASSIGN_OR_RETURN(std::string text, ReadCapped(path, options.limits.max_bytes));
  LoadOptions with_dir = options;
  if (with_dir.base_dir.empty()) {
    with_dir.base_dir = std::filesystem::absolute(path).parent_path().string();
  }
  return LoadConfigString(text, path, with_dir);
}

Status ApplyClusterFile(const std::string& path, Config& config, const LoadLimits& limits) {
  AGENTRT_ASSIGN_OR_RETURN(std::string text, ReadCapped(path, limits.max_bytes));
  AGENTRT_RETURN_IF_ERROR(PrescanYaml(text, path, limits));
  try {
    YAML::Node root = ParseYaml(text, path);
    Converter converter{path, limits};
    if (!root.IsDefined() || root.IsNull())
      converter.Fail(YAML::Mark(), "", "the inventory is empty; expected a 'cluster:' block");
    converter.CheckMap(root, "", {"cluster"});
    const YAML::Node cluster = root["cluster"];
    if (!cluster.IsDefined())
      converter.Fail(root, "cluster", "missing; expected a 'cluster:' block with 'nodes:'");
    ConfigBuilder builder{converter};
    ClusterConfig parsed;
    parsed.ports = config.cluster.ports;
    bool ports_given = false;
    builder.ParseCluster(cluster, "cluster", parsed, &ports_given);
    if (parsed.nodes.empty())
      converter.Fail(cluster, "cluster.nodes", "expected at least one node");
    config.cluster.nodes = std::move(parsed.nodes);
    if (ports_given) config.cluster.ports = parsed.ports;
    return Status::Ok();
  } catch (const ConfigError& e) {
    return InvalidArgument(e.what());
  } catch (const YAML::Exception& e) {
    return InvalidArgument(fmt::format("{}: {}", path, e.what()));
  }
}

namespace {

template <typename T>
std::string TypeName();
template <>
std::string TypeName<int>() {
  return "int";
}
template <>
std::string TypeName<std::int64_t>() {
  return "int";
}
template <>
std::string TypeName<double>() {
  return "float";
}
template <>
std::string TypeName<bool>() {
  return "bool";
}
template <>
std::string TypeName<std::string>() {
  return "string";
}
template <>
std::string TypeName<std::vector<std::string>>() {
  return "list";
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
