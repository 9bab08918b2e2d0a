#include "plan/plan.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <set>
#include <utility>

#include "common/file_util.h"
#include "plan/run_dir.h"

namespace agentrt {
namespace {

using ojson = nlohmann::ordered_json;
using json = nlohmann::json;

// Reads typed values out of untrusted JSON, remembering the first error with
// its JSON path so PlanFromJson can report exactly what is wrong.
class Reader {
 public:
  bool ok() const { return error_.empty(); }
  const std::string& error() const { return error_; }

  const json* Get(const json& obj, const std::string& path, const char* key, bool required = true) {
    if (!obj.is_object()) {
      Fail(path, "expected an object");
      return nullptr;
    }
    auto it = obj.find(key);
    if (it == obj.end()) {
      if (required) Fail(Join(path, key), "missing");
      return nullptr;
    }
    return &*it;
  }

  template <typename T>
  void Read(const json& obj, const std::string& path, const char* key, T& out,
            bool required = true) {
    const json* v = Get(obj, path, key, required);
    if (v == nullptr) return;
    ReadValue(*v, Join(path, key), out);
  }

  // A scalar of type T, when `is_t` says the JSON value holds one.
  template <typename T>
  void ReadScalar(const json& v, const std::string& path, T& out, bool is_t, const char* expected) {
    if (!is_t) return Fail(path, expected);
    out = v.get<T>();
  }
  void ReadValue(const json& v, const std::string& path, std::string& out) {
    ReadScalar(v, path, out, v.is_string(), "expected a string");
  }
  void ReadValue(const json& v, const std::string& path, int& out) {
    ReadScalar(v, path, out, v.is_number_integer(), "expected an integer");
  }
  void ReadValue(const json& v, const std::string& path, std::int64_t& out) {
    ReadScalar(v, path, out, v.is_number_integer(), "expected an integer");
  }
  void ReadValue(const json& v, const std::string& path, double& out) {
    ReadScalar(v, path, out, v.is_number(), "expected a number");
  }
  void ReadValue(const json& v, const std::string& path, bool& out) {
    ReadScalar(v, path, out, v.is_boolean(), "expected true or false");
  }
  template <typename T>
  void ReadValue(const json& v, const std::string& path, std::vector<T>& out) {
    if (!v.is_array()) return Fail(path, "expected an array");
    out.clear();
    out.resize(v.size());
    for (size_t i = 0; i < v.size() && ok(); ++i)
      ReadValue(v[i], fmt::format("{}[{}]", path, i), out[i]);
  }
  void ReadValue(const json& v, const std::string& path, std::map<std::string, std::string>& out) {
    if (!v.is_object()) return Fail(path, "expected an object");
    out.clear();
    for (const auto& [key, value] : v.items()) {
      if (!value.is_string()) return Fail(Join(path, key.c_str()), "expected a string");
      out[key] = value.get<std::string>();
    }
  }

  // item(element, its path) for each element of the array obj[key]; a missing
  // optional key has no elements.
  template <typename F>
  void ForEach(const json& obj, const std::string& path, const char* key, bool required, F item) {
    const json* list = Get(obj, path, key, required);
    if (list == nullptr) return;
    const std::string lpath = Join(path, key);
    if (!list->is_array()) return Fail(lpath, "expected an array");
    for (size_t i = 0; ok() && i < list->size(); ++i)
      item((*list)[i], fmt::format("{}[{}]", lpath, i));
  }

  void Fail(const std::string& path, std::string_view what) {
    if (error_.empty()) error_ = fmt::format("plan: {}: {}", path.empty() ? "<root>" : path, what);
  }

  static std::string Join(const std::string& path, const char* key) {
    return path.empty() ? std::string(key) : path + "." + key;
  }

 private:
  std::string error_;
};

// One agent-level settings block (an X-macro list of plan/config.h) to JSON
// and back: {"<setting>": value, ...}; keys it lacks keep their defaults.
#define AGENTRT_PUT(type, name, default_value, doc) j[#name] = s.name;
#define AGENTRT_GET(type, name, default_value, doc) r.Read(obj, path, #name, s.name, false);
#define AGENTRT_SETTINGS_CODEC(Type, LIST)                                              \
  ojson SettingsToJson(const Type& s) {                                                 \
    ojson j = ojson::object();                                                          \
    LIST(AGENTRT_PUT)                                                                   \
    return j;                                                                           \
  }                                                                                     \
  void SettingsFromJson(Reader& r, const json& obj, const std::string& path, Type& s) { \
    LIST(AGENTRT_GET)                                                                   \
  }
AGENTRT_SETTINGS_CODEC(RestartPolicy, AGENTRT_RESTART_SETTINGS)
AGENTRT_SETTINGS_CODEC(CheckpointPolicy, AGENTRT_CHECKPOINT_SETTINGS)
AGENTRT_SETTINGS_CODEC(GroupPolicy, AGENTRT_GROUP_SETTINGS)
#undef AGENTRT_SETTINGS_CODEC
#undef AGENTRT_GET
#undef AGENTRT_PUT

}  // namespace

const Placement* AgentPlan::PlacementOfRank(int rank) const {
  for (const Placement& p : placement) {
    if (std::find(p.ranks.begin(), p.ranks.end(), rank) != p.ranks.end()) return &p;
  }
  return nullptr;
}

std::string AgentPlan::NodeList() const {
  std::string out;
  for (const Placement& p : placement) out += (out.empty() ? "" : ",") + p.node;
  return out;
}

const AgentPlan* Plan::FindAgent(std::string_view name) const {
  for (const AgentPlan& agent : agents) {
    if (agent.name == name) return &agent;
  }
  return nullptr;
}

AgentPlan* Plan::FindAgent(std::string_view name) {
  return const_cast<AgentPlan*>(std::as_const(*this).FindAgent(name));
}

namespace {

nlohmann::ordered_json PlacementToJson(const std::vector<Placement>& placement) {
  ojson j = ojson::array();
  for (const Placement& p : placement) {
    j.push_back(ojson{{"node", p.node}, {"gpus", p.gpus}, {"ranks", p.ranks}});
  }
  return j;
}

// One agent of plan.json.
nlohmann::ordered_json AgentToJson(const AgentPlan& a) {
  ojson aj = ojson::object();
  aj["name"] = a.name;
  aj["index"] = a.index;
  aj["ranks"] = a.ranks;
  aj["placement"] = PlacementToJson(a.placement);
  aj["ports"] = ojson{{"node", a.ports.node}, {"first", a.ports.first}, {"last", a.ports.last}};
  aj["master_addr"] = a.master_addr;
  aj["master_port"] = a.master_port;
  aj["checkpoint_dir"] = a.checkpoint_dir;
  aj["workdir"] = a.workdir;
  aj["gpus"] = a.gpus;
  if (!a.gpu_type.empty()) aj["gpu_type"] = a.gpu_type;
  if (a.peak_flops > 0) aj["peak_flops"] = a.peak_flops;
  aj["backend"] = std::string(GroupBackendName(a.backend));
  aj["command"] = a.command;
  aj["env"] = a.env;
  aj["args"] = ojson::parse(a.args.dump());
  aj["restart"] = SettingsToJson(a.restart);
  if (a.restart.elastic_min_ranks > 0) aj["elastic_min_ranks"] = a.restart.elastic_min_ranks;
  if (a.planned_ranks > 0) aj["planned_ranks"] = a.planned_ranks;
  if (!a.planned_placement.empty()) aj["planned_placement"] = PlacementToJson(a.planned_placement);
  aj["checkpoint"] = SettingsToJson(a.checkpoint);
  aj["group"] = SettingsToJson(a.group);
  return aj;
}

}  // namespace

nlohmann::ordered_json PlanToJson(const Plan& plan) {
  ojson j = ojson::object();
  j["run"] = plan.run;
  if (!plan.run_dir.empty()) j["run_dir"] = plan.run_dir;
  ojson bus = ojson::object();
  bus["host"] = plan.bus.host;
  bus["port"] = plan.bus.port;
  bus["fixed_port"] = plan.bus.fixed_port;
  bus["run_ca"] = plan.bus.run_ca;
#define AGENTRT_TO_JSON(type, name, default_value, doc) \
  if (std::string_view(#name) != "port") bus[#name] = plan.bus.settings.name;
  AGENTRT_BUS_SETTINGS(AGENTRT_TO_JSON)
#undef AGENTRT_TO_JSON
  j["bus"] = std::move(bus);

  ojson agents = ojson::array();
  for (const AgentPlan& a : plan.agents) agents.push_back(AgentToJson(a));
  j["agents"] = std::move(agents);

  ojson channels = ojson::array();
  for (const ChannelPlan& c : plan.channels) {
    ojson cj{{"topic", c.topic}, {"publishers", c.publishers}, {"subscribers", c.subscribers}};
    if (c.keep_last > 0) cj["keep_last"] = c.keep_last;
    channels.push_back(std::move(cj));
  }
  j["channels"] = std::move(channels);
  j["ports"] = ojson{
      {"first", plan.ports.first}, {"last", plan.ports.last}, {"per_agent", plan.ports.per_agent}};
  if (!plan.warnings.empty()) j["warnings"] = plan.warnings;
  if (plan.trust_slurm_binding) j["trust_slurm_binding"] = true;
  if (!plan.nodes.empty()) {
    ojson nodes = ojson::array();
    for (const PlanNode& n : plan.nodes) {
      nodes.push_back(
          ojson{{"name", n.name}, {"gpus", n.gpus}, {"nvlink_domains", n.nvlink_domains}});
    }
    j["nodes"] = std::move(nodes);
  }
  if (plan.league.enabled()) {
    ojson league = ojson::object();
#define AGENTRT_PUT(type, name, default_value, doc) league[#name] = plan.league.name;
    AGENTRT_LEAGUE_SETTINGS(AGENTRT_PUT)
#undef AGENTRT_PUT
    ojson members = ojson::array();
    for (const LeagueMember& m : plan.league.members) {
      members.push_back(ojson{{"agent", m.agent},
                              {"role", m.role},
                              {"matchmaking", m.matchmaking},
                              {"newest_share", m.newest_share},
                              {"opponents", m.opponents}});
    }
    league["members"] = std::move(members);
    j["league"] = std::move(league);
  }
  if (!plan.pbt.empty()) {
    ojson pbt = ojson::array();
    for (const PbtPopulation& p : plan.pbt) {
      ojson pj = ojson::object();
      pj["name"] = p.name;
      pj["agents"] = p.agents;
#define AGENTRT_PUT(type, name, default_value, doc) pj[#name] = p.name;
      AGENTRT_PBT_SETTINGS(AGENTRT_PUT)
#undef AGENTRT_PUT
      ojson hps = ojson::array();
      for (const PbtHyperparameter& h : p.hyperparameters) {
        hps.push_back(ojson{{"name", h.name},
                            {"min", h.min},
                            {"max", h.max},
                            {"perturb", h.perturb},
                            {"log_scale", h.log_scale},
                            {"integer", h.integer}});
      }
      pj["hyperparameters"] = std::move(hps);
      pbt.push_back(std::move(pj));
    }
    j["pbt"] = std::move(pbt);
  }
  return j;
}

std::string PlanToJsonString(const Plan& plan, int indent) { return PlanToJson(plan).dump(indent); }

namespace {

void ReadPlacement(Reader& r, const json& aj, const std::string& path, const char* key,
                   bool required, std::vector<Placement>& out) {
  r.ForEach(aj, path, key, required, [&](const json& pj, const std::string& ppath) {
    Placement p;
    r.Read(pj, ppath, "node", p.node);
    r.Read(pj, ppath, "gpus", p.gpus);
    r.Read(pj, ppath, "ranks", p.ranks);
    out.push_back(std::move(p));
  });
}

// agents[i] of a plan (its index must be i).
// `previous`: the index of the agent before it (-1: none). plan.json numbers
// its agents 0, 1, 2...; an agent's view holds some of them, in that order.
AgentPlan ReadAgent(Reader& r, const json& aj, const std::string& path, int previous) {
  AgentPlan a;
  r.Read(aj, path, "name", a.name);
  r.Read(aj, path, "index", a.index);
  r.Read(aj, path, "ranks", a.ranks);
  ReadPlacement(r, aj, path, "placement", true, a.placement);
  if (const json* ports = r.Get(aj, path, "ports")) {
    r.Read(*ports, path + ".ports", "node", a.ports.node);
    r.Read(*ports, path + ".ports", "first", a.ports.first);
    r.Read(*ports, path + ".ports", "last", a.ports.last);
  }
  r.Read(aj, path, "master_addr", a.master_addr);
  r.Read(aj, path, "master_port", a.master_port);
  r.Read(aj, path, "checkpoint_dir", a.checkpoint_dir);
  r.Read(aj, path, "workdir", a.workdir, false);
  if (a.workdir.empty()) a.workdir = RunDir::RelativeWorkDir(a.name);
  // Additive keys are optional so a plan without them reads.
  r.Read(aj, path, "gpus", a.gpus, false);
  if (!aj.contains("gpus")) {
    a.gpus = 0;
    for (const Placement& p : a.placement) a.gpus += static_cast<int>(p.gpus.size());
  }
  r.Read(aj, path, "gpu_type", a.gpu_type, false);
  r.Read(aj, path, "peak_flops", a.peak_flops, false);
  std::string backend;
  r.Read(aj, path, "backend", backend, false);
  if (backend.empty()) {
    a.backend = ResolveGroupBackend(GroupBackend::kAuto, a.gpus, a.ranks);
  } else {
    Result<GroupBackend> parsed = ParseGroupBackend(backend);
    if (!parsed.ok() || *parsed == GroupBackend::kAuto) {
      r.Fail(path + ".backend", "expected single, mpi or nccl, got \"" + backend + "\"");
    } else {
      a.backend = *parsed;
    }
  }
  if (aj.contains("command")) {
    r.Read(aj, path, "command", a.command);
  } else {
    a.command = {"agent-worker"};
  }
  r.Read(aj, path, "env", a.env, false);
  if (const json* args = r.Get(aj, path, "args", false)) {
    if (!args->is_object()) r.Fail(path + ".args", "expected an object");
    a.args = *args;
  }
  if (const json* restart = r.Get(aj, path, "restart", false))
    SettingsFromJson(r, *restart, path + ".restart", a.restart);
  r.Read(aj, path, "elastic_min_ranks", a.restart.elastic_min_ranks, false);
  r.Read(aj, path, "planned_ranks", a.planned_ranks, false);
  ReadPlacement(r, aj, path, "planned_placement", false, a.planned_placement);
  if (const json* checkpoint = r.Get(aj, path, "checkpoint", false))
    SettingsFromJson(r, *checkpoint, path + ".checkpoint", a.checkpoint);
  if (const json* group = r.Get(aj, path, "group", false))
    SettingsFromJson(r, *group, path + ".group", a.group);
  if (r.ok() && a.index <= previous)
    r.Fail(path + ".index", fmt::format("expected more than {} (agents in plan order)", previous));
  return a;
}

// The plan's league block.
void ReadLeague(Reader& r, const json& league_json, LeagueConfig& league) {
#define AGENTRT_GET(type, name, default_value, doc) \
  r.Read(league_json, "league", #name, league.name, false);
  AGENTRT_LEAGUE_SETTINGS(AGENTRT_GET)
#undef AGENTRT_GET
  r.ForEach(league_json, "league", "members", true, [&](const json& mj, const std::string& path) {
    LeagueMember m;
    r.Read(mj, path, "agent", m.agent);
    r.Read(mj, path, "role", m.role);
    r.Read(mj, path, "matchmaking", m.matchmaking);
    r.Read(mj, path, "newest_share", m.newest_share);
    r.Read(mj, path, "opponents", m.opponents);
    league.members.push_back(std::move(m));
  });
}

// pbt[i] of a plan.
PbtPopulation ReadPopulation(Reader& r, const json& pj, const std::string& path) {
  PbtPopulation p;
  r.Read(pj, path, "name", p.name);
  r.Read(pj, path, "agents", p.agents);
#define AGENTRT_GET(type, name, default_value, doc) r.Read(pj, path, #name, p.name, false);
  AGENTRT_PBT_SETTINGS(AGENTRT_GET)
#undef AGENTRT_GET
  r.ForEach(pj, path, "hyperparameters", false, [&](const json& hj, const std::string& hpath) {
    PbtHyperparameter h;
    r.Read(hj, hpath, "name", h.name);
    r.Read(hj, hpath, "min", h.min);
    r.Read(hj, hpath, "max", h.max);
    r.Read(hj, hpath, "perturb", h.perturb, false);
    r.Read(hj, hpath, "log_scale", h.log_scale, false);
    r.Read(hj, hpath, "integer", h.integer, false);
    p.hyperparameters.push_back(std::move(h));
  });
  return p;
}

}  // namespace

Result<Plan> PlanFromJson(const nlohmann::json& j) {
  Reader r;
  Plan plan;
  r.Read(j, "", "run", plan.run);
  r.Read(j, "", "run_dir", plan.run_dir, /*required=*/false);
  if (const json* found = r.Get(j, "", "bus")) {
    // A plan.json written before bus.tls took on, off and auto held a boolean.
    json legacy;
    const json* bus = found;
    if (auto tls = found->find("tls"); tls != found->end() && tls->is_boolean()) {
      legacy = *found;
      legacy["tls"] = std::string(tls->get<bool>() ? kBusTlsOn : kBusTlsOff);
      bus = &legacy;
    }
    r.Read(*bus, "bus", "host", plan.bus.host);
    r.Read(*bus, "bus", "port", plan.bus.port);
    r.Read(*bus, "bus", "fixed_port", plan.bus.fixed_port, false);
    r.Read(*bus, "bus", "run_ca", plan.bus.run_ca, false);
#define AGENTRT_FROM_JSON(type, name, default_value, doc) \
  if (std::string_view(#name) != "port") r.Read(*bus, "bus", #name, plan.bus.settings.name, false);
    AGENTRT_BUS_SETTINGS(AGENTRT_FROM_JSON)
#undef AGENTRT_FROM_JSON
    plan.bus.settings.port = plan.bus.port;
  }
  r.ForEach(j, "", "agents", true, [&](const json& aj, const std::string& path) {
    plan.agents.push_back(
        ReadAgent(r, aj, path, plan.agents.empty() ? -1 : plan.agents.back().index));
  });
  r.ForEach(j, "", "channels", false, [&](const json& cj, const std::string& path) {
    ChannelPlan c;
    r.Read(cj, path, "topic", c.topic);
    r.Read(cj, path, "publishers", c.publishers);
    r.Read(cj, path, "subscribers", c.subscribers);
    r.Read(cj, path, "keep_last", c.keep_last, false);
    plan.channels.push_back(std::move(c));
  });
  r.Read(j, "", "warnings", plan.warnings, false);
  r.Read(j, "", "trust_slurm_binding", plan.trust_slurm_binding, false);
  if (const json* ports = r.Get(j, "", "ports", false)) {
    r.Read(*ports, "ports", "first", plan.ports.first);
    r.Read(*ports, "ports", "last", plan.ports.last);
    r.Read(*ports, "ports", "per_agent", plan.ports.per_agent);
  }
  r.ForEach(j, "", "nodes", false, [&](const json& nj, const std::string& path) {
    PlanNode n;
    r.Read(nj, path, "name", n.name);
    r.Read(nj, path, "gpus", n.gpus);
    r.Read(nj, path, "nvlink_domains", n.nvlink_domains, false);
    plan.nodes.push_back(std::move(n));
  });
  if (const json* league = r.Get(j, "", "league", false)) ReadLeague(r, *league, plan.league);
  r.ForEach(j, "", "pbt", false, [&](const json& pj, const std::string& path) {
    plan.pbt.push_back(ReadPopulation(r, pj, path));
  });
  if (!r.ok()) return InvalidArgument(r.error());
  return plan;
}

Result<Plan> PlanFromJsonString(std::string_view text) {
  json j = json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return InvalidArgument("plan: not valid JSON");
  return PlanFromJson(j);
}

Result<Plan> ReadPlanFile(const std::string& path) {
  Result<std::string> text = ReadWholeFile(path, size_t{64} << 20);
  if (!text.ok()) return text.status().WithContext("cannot read the plan");
  Result<Plan> plan = PlanFromJsonString(*text);
  if (!plan.ok()) return plan.status().WithContext(path);
  return plan;
}

Status WritePlanFile(const Plan& plan, const std::string& path) {
  return WriteFileAtomic(path, PlanToJsonString(plan) + "\n", {.mode = 0644, .sync_dir = true});
}

namespace {

// The `env` an agent's args name ("" when none): agents of one env share a world.
std::string EnvOf(const AgentPlan& a) {
  if (!a.args.is_object()) return "";
  auto it = a.args.find("env");
  return it != a.args.end() && it->is_string() ? it->get<std::string>() : "";
}

}  // namespace

PlanViews::PlanViews(const Plan& plan)
    : plan_(plan), channels_of_(plan.agents.size()), pbt_of_(plan.agents.size()) {
  for (size_t i = 0; i < plan.agents.size(); ++i) {
    const AgentPlan& a = plan.agents[i];
    by_name_.emplace(a.name, i);
    if (std::string env = EnvOf(a); !env.empty()) by_env_[env].push_back(i);
  }
  auto note = [this](const std::vector<std::string>& names, size_t what,
                     std::vector<std::vector<size_t>>& of) {
    for (const std::string& name : names) {
      auto it = by_name_.find(name);
      if (it != by_name_.end() && (of[it->second].empty() || of[it->second].back() != what))
        of[it->second].push_back(what);
    }
  };
  for (size_t c = 0; c < plan.channels.size(); ++c) {
    note(plan.channels[c].publishers, c, channels_of_);
    note(plan.channels[c].subscribers, c, channels_of_);
  }
  for (size_t p = 0; p < plan.pbt.size(); ++p) note(plan.pbt[p].agents, p, pbt_of_);
}

Plan PlanViews::Of(size_t agent_index) const {
  const AgentPlan& me = plan_.agents.at(agent_index);
  std::set<size_t> agents = {agent_index};
  if (auto peers = by_env_.find(EnvOf(me)); peers != by_env_.end())
    agents.insert(peers->second.begin(), peers->second.end());
  if (const LeagueMember* member = plan_.league.FindMember(me.name)) {
    for (const std::string& opponent : member->opponents) {
      if (auto it = by_name_.find(opponent); it != by_name_.end()) agents.insert(it->second);
    }
  }
  Plan view;
  view.run = plan_.run;
  view.run_dir = plan_.run_dir;
  view.bus = plan_.bus;
  view.ports = plan_.ports;
  view.trust_slurm_binding = plan_.trust_slurm_binding;
  std::set<std::string, std::less<>> names, nodes;
  for (size_t i : agents) {
    view.agents.push_back(plan_.agents[i]);
    names.insert(plan_.agents[i].name);
    for (const Placement& p : plan_.agents[i].placement) nodes.insert(p.node);
  }
  for (size_t c : channels_of_[agent_index]) view.channels.push_back(plan_.channels[c]);
  for (size_t p : pbt_of_[agent_index]) view.pbt.push_back(plan_.pbt[p]);
  for (const PlanNode& n : plan_.nodes) {
    if (nodes.count(n.name) > 0) view.nodes.push_back(n);
  }
  view.league = plan_.league;
  view.league.members.clear();
  for (const LeagueMember& m : plan_.league.members) {
    if (names.count(m.agent) > 0) view.league.members.push_back(m);
  }
  return view;
}

Status WriteRunPlan(const Plan& plan, const std::string& run_dir) {
  const RunDir dir(run_dir);
  if (::mkdir(dir.PlanViewsDir().c_str(), 0755) != 0 && errno != EEXIST)
    return ErrnoStatus(errno, "cannot create " + dir.PlanViewsDir());
  const PlanViews views(plan);
  for (size_t i = 0; i < plan.agents.size(); ++i) {
    AGENTRT_RETURN_IF_ERROR(WriteFileAtomic(dir.AgentPlanPath(plan.agents[i].name),
                                            PlanToJsonString(views.Of(i), -1) + "\n",
                                            {.mode = 0644, .sync_file = false}));
  }
  // The views' bytes reach the disk before plan.json names the run's new plan.
  if (!plan.agents.empty()) AGENTRT_RETURN_IF_ERROR(SyncFileSystemOf(dir.PlanViewsDir()));
  return WritePlanFile(plan, dir.PlanPath());
}

Result<Plan> ReadAgentPlanView(const std::string& run_dir, const std::string& agent) {
  const RunDir dir(run_dir);
  struct stat st {};
  // A run directory made by hand (an agent started without agentctl) may hold
  // plan.json alone: then that is the agent's view.
  const bool views = ::stat(dir.PlanViewsDir().c_str(), &st) == 0;
  const std::string path = views ? dir.AgentPlanPath(agent) : dir.PlanPath();
  Result<Plan> view = ReadPlanFile(path);
  if (view.ok() && view->FindAgent(agent) == nullptr) {
    return NotFound(fmt::format("agent '{}' is not in the plan ({})", agent, path));
  }
  if (views && view.status().code() == StatusCode::kNotFound) {
    return NotFound(fmt::format("agent '{}' is not in the plan ({}/plan.json; there is no {})",
                                agent, run_dir, path));
  }
  return view;
}

namespace {

// "0-3,6" for a sorted id list.
std::string CompactIds(const std::vector<int>& ids) {
  std::string out;
  for (size_t i = 0; i < ids.size();) {
    size_t k = i;
    while (k + 1 < ids.size() && ids[k + 1] == ids[k] + 1) ++k;
    if (!out.empty()) out += ',';
    out += k == i ? fmt::format("{}", ids[i]) : fmt::format("{}-{}", ids[i], ids[k]);
    i = k + 1;
  }
  return out.empty() ? "-" : out;
}

}  // namespace

std::string PlanToTable(const Plan& plan) {
  struct Row {
    std::string agent, nodes, gpus, ranks, ports, ckpt;
  };
  std::vector<Row> rows;
  rows.push_back({"AGENT", "NODE(S)", "GPUS", "RANKS", "PORTS", "CHECKPOINT DIR"});
  const RunDir dir(plan.run_dir);
  for (const AgentPlan& a : plan.agents) {
    Row row{a.name,
            "",
            "",
            "",
            fmt::format("{}-{}", a.ports.first, a.ports.last),
            plan.run_dir.empty() ? a.checkpoint_dir : dir.Resolve(a.checkpoint_dir)};
    for (size_t i = 0; i < a.placement.size(); ++i) {
      const Placement& p = a.placement[i];
      const char* sep = i == 0 ? "" : " ";
      row.nodes += sep + p.node;
      row.gpus += sep + (p.gpus.empty() ? std::string("-") : CompactIds(p.gpus));
      row.ranks += sep + CompactIds(p.ranks);
    }
    rows.push_back(std::move(row));
  }
  size_t w[5] = {0, 0, 0, 0, 0};
  for (const Row& r : rows) {
    w[0] = std::max(w[0], r.agent.size());
    w[1] = std::max(w[1], r.nodes.size());
    w[2] = std::max(w[2], r.gpus.size());
    w[3] = std::max(w[3], r.ranks.size());
    w[4] = std::max(w[4], r.ports.size());
  }
  std::string out = fmt::format("run {}: {} agents; bus on {}:{}\n", plan.run, plan.agents.size(),
                                plan.bus.host, plan.bus.port);
  if (plan.run_dir.empty()) out += "(paths are relative to the run directory)\n";
  for (const Row& r : rows) {
    out += fmt::format("{:<{}}  {:<{}}  {:<{}}  {:<{}}  {:<{}}  {}\n", r.agent, w[0], r.nodes, w[1],
                       r.gpus, w[2], r.ranks, w[3], r.ports, w[4], r.ckpt);
  }
  for (const ChannelPlan& c : plan.channels) {
    out += fmt::format("channel {}: {} publisher(s), {} subscriber(s)\n", c.topic,
                       c.publishers.size(), c.subscribers.size());
  }
  for (const std::string& warning : plan.warnings) out += "warning: " + warning + "\n";
  return out;
}

}  // namespace agentrt
