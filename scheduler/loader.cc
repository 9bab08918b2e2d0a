#include "scheduler/loader.h"

#include "scheduler/loader_internal.h"

namespace agentrt {

using namespace loader_internal;  // NOLINT(google-build-using-namespace): its own insides

namespace {

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
    if (const YAML::Node n = root["channels"]; n.IsDefined()) ParseChannels(c_, n, config);
    if (const YAML::Node n = root["league"]; n.IsDefined()) ParseLeague(c_, n, config);
    if (const YAML::Node n = root["pbt"]; n.IsDefined()) ParsePbt(c_, n, config);
    return config;
  }

  void ParseRun(const YAML::Node& n, RunConfig& run) {
    ReadSettings(c_, n, "run", run);
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
    ReadSettings(c_, n, "preflight", p);
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
    c_.ReadRequired(n, path, "name", expr, "expected a hostlist like node[01-04]");
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
    ReadSettings(c_, n, path, ports);
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
    ReadSettings(c_, n, "slurm", slurm);
    static const std::regex kTime(R"((\d+-)?\d+(:\d+){0,2}|UNLIMITED|unlimited|infinite)");
    if (!std::regex_match(slurm.time, kTime)) {
      c_.Fail(n["time"], "slurm.time",
              fmt::format("expected [D-]HH:MM:SS, MM or UNLIMITED, got '{}'", slurm.time));
    }
    if (slurm.steps != "agent" && slurm.steps != "node") {
      c_.Fail(n["steps"], "slurm.steps",
              fmt::format("expected agent (a job step per agent) or node (one step per node for "
                          "its single-node agents), got '{}'",
                          slurm.steps));
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
    // true and false are YAML's spelling of on and off.
    if (bus.tls == "true") bus.tls = std::string(kBusTlsOn);
    if (bus.tls == "false") bus.tls = std::string(kBusTlsOff);
    if (bus.tls != kBusTlsOn && bus.tls != kBusTlsOff && bus.tls != kBusTlsAuto) {
      c_.Fail(n["tls"], "bus.tls",
              fmt::format("expected on, off or auto (true and false are on and off), got '{}'",
                          bus.tls));
    }
    if (bus.cert_file.empty() != bus.key_file.empty()) {
      c_.Fail(n[bus.cert_file.empty() ? "key_file" : "cert_file"], "bus.tls",
              "expected cert_file and key_file together (or neither: the run makes its own CA)");
    } else if (!bus.cert_file.empty() && bus.tls == kBusTlsOff) {
      c_.Fail(n["tls"], "bus.tls", "tls is off, but cert_file and key_file are given");
    } else if (!bus.cert_file.empty()) {
      bus.tls = std::string(kBusTlsOn);  // a certificate of one's own is meant to be used
    }
    if (bus.mtls && bus.tls == kBusTlsOff) {
      c_.Fail(n["mtls"], "bus.mtls", "mtls is true, but tls is off");
    } else if (bus.mtls && !bus.cert_file.empty()) {
      c_.Fail(n["mtls"], "bus.mtls",
              "mtls needs the run's own CA, which signs every agent a certificate; leave out "
              "cert_file and key_file");
    } else if (bus.mtls) {
      bus.tls = std::string(kBusTlsOn);
    }
    if (!bus.ca_file.empty() && bus.cert_file.empty()) {
      c_.Fail(n["ca_file"], "bus.ca_file",
              "ca_file belongs to your own cert_file and key_file; without them the run's CA "
              "is the one clients trust");
    }
    // Taken from the config's folder, as every path of it: the broker, the
    // league service and every agent (in its own working directory) read them.
    for (auto [key, file] :
         {std::pair{"cert_file", &bus.cert_file}, std::pair{"key_file", &bus.key_file},
          std::pair{"ca_file", &bus.ca_file}}) {
      if (file->empty()) continue;
      const std::filesystem::path resolved =
          (std::filesystem::path(base_dir_) / *file).lexically_normal();
      std::error_code ec;
      if (!std::filesystem::is_regular_file(resolved, ec)) {
        c_.Fail(n[key], Join("bus", key),
                fmt::format("no such file {} (relative paths are taken from the folder of the "
                            "config, {})",
                            resolved.string(), base_dir_));
      }
      *file = resolved.string();
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
    ReadSettings(c_, n, path, r, {"elastic"});
    if (const YAML::Node e = n["elastic"]; e.IsDefined()) {
      const std::string at = Join(path, "elastic");
      c_.CheckMap(e, at, kElasticKeys);
      if (!e["min_ranks"].IsDefined()) c_.Fail(e, at, "expected {min_ranks: N}");
      c_.Read(e, at, "min_ranks", r.elastic_min_ranks);
      Positive(e, at, "min_ranks", r.elastic_min_ranks);
    }
    if (r.max_restarts < 0)
      c_.Fail(n["max_restarts"], Join(path, "max_restarts"),
              fmt::format("expected 0 or more, got {}", r.max_restarts));
    if (r.backoff_s < 0)
      c_.Fail(n["backoff_s"], Join(path, "backoff_s"),
              fmt::format("expected 0 or more seconds, got {}", r.backoff_s));
    NotNegativeSeconds(n, path, "backoff_max_s", r.backoff_max_s);
    if (r.crash_loop_after < 0)
      c_.Fail(n["crash_loop_after"], Join(path, "crash_loop_after"),
              fmt::format("expected 0 (never) or more failures, got {}", r.crash_loop_after));
    if (!(r.heartbeat_timeout_s > 0))
      c_.Fail(n["heartbeat_timeout_s"], Join(path, "heartbeat_timeout_s"),
              fmt::format("expected a positive number of seconds, got {}", r.heartbeat_timeout_s));
    NotNegativeSeconds(n, path, "grace_s", r.grace_s);
    NotNegativeSeconds(n, path, "progress_timeout_s", r.progress_timeout_s, " (not watched)");
  }

  void ParseGroup(const YAML::Node& n, const std::string& path, GroupPolicy& g) {
    ReadSettings(c_, n, path, g);
    NotNegativeSeconds(n, path, "collective_timeout_s", g.collective_timeout_s, " (not watched)");
  }

  void ParseCheckpoint(const YAML::Node& n, const std::string& path, CheckpointPolicy& cp) {
    ReadSettings(c_, n, path, cp);
    if (!(cp.interval_s > 0))
      c_.Fail(n["interval_s"], Join(path, "interval_s"),
              fmt::format("expected a positive number of seconds, got {}", cp.interval_s));
    if (cp.keep_last < 1)
      c_.Fail(n["keep_last"], Join(path, "keep_last"),
              fmt::format("expected at least 1, got {}", cp.keep_last));
    if (cp.snapshot != "copy" && cp.snapshot != "fork")
      c_.Fail(n["snapshot"], Join(path, "snapshot"),
              fmt::format("expected copy or fork, got '{}'", cp.snapshot));
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

  // One entry of `agents:` (before replica expansion): its settings over the
  // defaults, and its replica count.
  AgentConfig ParseAgent(const YAML::Node& n, const std::string& path, const Config& config,
                         int* replicas, bool* has_replicas) {
    c_.CheckMap(n, path, kAgentKeys);
    AgentConfig base;
    base.line = n.Mark().line + 1;
    base.column = n.Mark().column + 1;
    c_.ReadRequired(n, path, "name", base.base_name, "every agent needs a name");
    if (!std::regex_match(base.base_name, NameRegex())) {
      c_.Fail(n["name"], Join(path, "name"),
              fmt::format("expected letters, digits, '_', '.', '-' (at most 63), starting with a "
                          "letter or digit, got '{}'",
                          base.base_name));
    }
    *has_replicas = c_.Read(n, path, "replicas", *replicas);
    if (*replicas < 1)
      c_.Fail(n["replicas"], Join(path, "replicas"),
              fmt::format("expected at least 1, got {}", *replicas));
    if (*replicas > 100000)
      c_.Fail(n["replicas"], Join(path, "replicas"),
              fmt::format("expected at most 100000, got {}", *replicas));
    c_.Read(n, path, "gpus", base.gpus);
    if (base.gpus < 0)
      c_.Fail(n["gpus"], Join(path, "gpus"),
              fmt::format("expected 0 (a CPU agent) or more GPUs, got {}", base.gpus));
    if (c_.Read(n, path, "gpu_type", base.gpu_type) && base.gpus == 0) {
      c_.Fail(n["gpu_type"], Join(path, "gpu_type"),
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
    if (const YAML::Node r = n["restart"]; r.IsDefined()) {
      ParseRestart(r, Join(path, "restart"), base.restart);
      if (base.restart.elastic_min_ranks > base.ranks && r["elastic"].IsDefined())
        c_.Fail(r["elastic"]["min_ranks"], Join(path, "restart.elastic.min_ranks"),
                fmt::format("expected at most the agent's {} ranks, got {}", base.ranks,
                            base.restart.elastic_min_ranks));
    }
    base.checkpoint = config.defaults.checkpoint;
    if (const YAML::Node cp = n["checkpoint"]; cp.IsDefined())
      ParseCheckpoint(cp, Join(path, "checkpoint"), base.checkpoint);
    base.group = config.defaults.group;
    if (const YAML::Node g = n["group"]; g.IsDefined())
      ParseGroup(g, Join(path, "group"), base.group);
    ParseAgentPlacement(n, path, base);
    if (const std::string problem = GroupBackendProblem(base.backend, base.gpus, base.ranks);
        !problem.empty()) {
      const YAML::Node b = n["backend"];
      const char* key = b.IsDefined() ? "backend" : n["ranks"].IsDefined() ? "ranks" : "gpus";
      c_.Fail(n[key], Join(path, key), problem);
    }
    return base;
  }

  // An agent's nodes:, workdir: and backend:.
  void ParseAgentPlacement(const YAML::Node& n, const std::string& path, AgentConfig& base) {
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
      base.workdir = (std::filesystem::path(base_dir_) / base.workdir).lexically_normal().string();
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
      int replicas = 1;
      bool has_replicas = false;
      const AgentConfig base = ParseAgent(n, path, config, &replicas, &has_replicas);
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

}  // namespace agentrt
