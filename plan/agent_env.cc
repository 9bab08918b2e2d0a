#include "plan/agent_env.h"

#include <charconv>
#include <cstdlib>
#include <set>
#include <sstream>

namespace agentrt {
namespace {

constexpr char kOutsideHint[] =
    " (agent processes are started by `agentctl run`, which sets it; to run one by hand, set the "
    "variables README.md's \"Running a job\" lists yourself)";

Result<int64_t> ParseInt(std::string_view name, std::string_view text) {
  int64_t v = 0;
  auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || ptr != text.data() + text.size()) {
    return InvalidArgument("environment variable " + std::string(name) + "=\"" + std::string(text) +
                           "\" is not an integer");
  }
  return v;
}

}  // namespace

EnvLookup ProcessEnvLookup() {
  return [](const std::string& name) -> std::optional<std::string> {
    const char* v = std::getenv(name.c_str());
    if (v == nullptr) return std::nullopt;
    return std::string(v);
  };
}

EnvLookup EnvLookupOf(const std::vector<std::string>& env) {
  std::map<std::string, std::string> vars;
  for (const auto& e : env) {
    const auto eq = e.find('=');
    if (eq != std::string::npos) vars[e.substr(0, eq)] = e.substr(eq + 1);
  }
  return [vars = std::move(vars)](const std::string& name) -> std::optional<std::string> {
    auto it = vars.find(name);
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
}

std::vector<std::string> DeviceListEntries(std::string_view s) {
  std::vector<std::string> out;
  while (!s.empty()) {
    const auto comma = s.find(',');
    std::string_view item = s.substr(0, comma);
    while (!item.empty() && item.front() == ' ') item.remove_prefix(1);
    while (!item.empty() && item.back() == ' ') item.remove_suffix(1);
    if (item.empty() || item.front() == '-') break;
    out.emplace_back(item);
    if (comma == std::string_view::npos) break;
    s.remove_prefix(comma + 1);
  }
  return out;
}

int AgentEnv::VisibleGpuCount() const {
  return static_cast<int>(DeviceListEntries(cuda_visible_devices).size());
}

Result<std::string> VisibleDevicesFor(const std::vector<int>& plan_gpus,
                                      const std::optional<std::string>& launcher_visible) {
  if (!launcher_visible) return GpuListString(plan_gpus);
  const std::vector<std::string> seen = DeviceListEntries(*launcher_visible);
  std::string out;
  for (const int g : plan_gpus) {
    if (g < 0 || static_cast<size_t>(g) >= seen.size()) {
      return FailedPrecondition("the plan gives GPU " + std::to_string(g) +
                                " but agentctl runs with CUDA_VISIBLE_DEVICES=\"" +
                                *launcher_visible + "\", which makes " +
                                std::to_string(seen.size()) +
                                " GPU(s) visible (plan GPU i is its i-th entry)");
    }
    out += (out.empty() ? "" : ",") + seen[static_cast<size_t>(g)];
  }
  return out;
}

std::map<std::string, std::string> AgentEnv::ToVariables(bool with_rank) const {
  std::map<std::string, std::string> v;
  v[kEnvRunDir] = run_dir;
  v["AGENTRT_AGENT"] = agent;
  v["AGENTRT_AGENT_INDEX"] = std::to_string(agent_index);
  if (with_rank) {
    v["RANK"] = std::to_string(rank);
    v["WORLD_SIZE"] = std::to_string(world_size);
    v["LOCAL_RANK"] = std::to_string(local_rank);
    v["LOCAL_WORLD_SIZE"] = std::to_string(local_world_size);
  }
  v["MASTER_ADDR"] = master_addr;
  v["MASTER_PORT"] = std::to_string(master_port);
  v["CUDA_VISIBLE_DEVICES"] = cuda_visible_devices;
  if (ports_first > 0) {
    v["AGENTRT_PORTS"] = std::to_string(ports_first) + "-" + std::to_string(ports_last);
  }
  v["AGENTRT_CKPT_DIR"] = ckpt_dir;
  v["AGENTRT_BUS"] = bus;
  v["AGENTRT_TOKEN_FILE"] = token_file;
  v["AGENTRT_BUS_CA"] = bus_ca_file;
  v["AGENTRT_TELEMETRY"] = telemetry;
  v["AGENTRT_RESTART_COUNT"] = std::to_string(restart_count);
  v["AGENTRT_WORKDIR"] = workdir;
  return v;
}

Result<AgentEnv> AgentEnv::Parse(const EnvLookup& lookup) {
  auto get = [&lookup](const char* name) -> std::optional<std::string> {
    std::optional<std::string> v = lookup(name);
    if (v && v->empty()) return std::nullopt;
    return v;
  };
  auto required = [&get](const char* name) -> Result<std::string> {
    std::optional<std::string> v = get(name);
    if (!v)
      return NotFound(std::string("environment variable ") + name + " is not set" + kOutsideHint);
    return *v;
  };
  // The first of `names` that is set, parsed; `fallback` when none is.
  auto integer = [&get](std::initializer_list<const char*> names, int64_t fallback,
                        bool is_required) -> Result<int64_t> {
    for (const char* n : names) {
      if (std::optional<std::string> v = get(n)) return ParseInt(n, *v);
    }
    if (is_required) {
      return NotFound(std::string("environment variable ") + *names.begin() + " is not set" +
                      kOutsideHint);
    }
    return fallback;
  };

  AgentEnv a;
  AGENTRT_ASSIGN_OR_RETURN(a.run_dir, required(kEnvRunDir));
  AGENTRT_ASSIGN_OR_RETURN(a.agent, required("AGENTRT_AGENT"));
  AGENTRT_ASSIGN_OR_RETURN(a.ckpt_dir, required("AGENTRT_CKPT_DIR"));
  AGENTRT_ASSIGN_OR_RETURN(const int64_t index, integer({"AGENTRT_AGENT_INDEX"}, 0, true));
  AGENTRT_ASSIGN_OR_RETURN(
      const int64_t rank,
      integer({"RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "SLURM_PROCID"}, 0, true));
  AGENTRT_ASSIGN_OR_RETURN(
      const int64_t world,
      integer({"WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "SLURM_NTASKS"}, 1, true));
  AGENTRT_ASSIGN_OR_RETURN(
      const int64_t local_rank,
      integer({"LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID"}, rank, false));
  AGENTRT_ASSIGN_OR_RETURN(
      const int64_t local_world,
      integer({"LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE"}, world, false));
  AGENTRT_ASSIGN_OR_RETURN(const int64_t master_port, integer({"MASTER_PORT"}, 0, false));
  AGENTRT_ASSIGN_OR_RETURN(const int64_t restarts, integer({"AGENTRT_RESTART_COUNT"}, 0, false));
  if (index < 0) {
    return InvalidArgument("environment variable AGENTRT_AGENT_INDEX=" + std::to_string(index) +
                           " is negative");
  }
  if (world < 1 || rank < 0 || rank >= world) {
    return InvalidArgument("RANK=" + std::to_string(rank) + " is outside WORLD_SIZE=" +
                           std::to_string(world) + " for agent " + a.agent);
  }
  if (master_port < 0 || master_port > 65535) {
    return InvalidArgument("environment variable MASTER_PORT=" + std::to_string(master_port) +
                           " is not a port");
  }
  a.agent_index = static_cast<int>(index);
  a.rank = static_cast<int>(rank);
  a.world_size = static_cast<int>(world);
  a.local_rank = static_cast<int>(local_rank);
  a.local_world_size = static_cast<int>(local_world);
  a.master_port = static_cast<int>(master_port);
  a.restart_count = static_cast<int>(restarts);
  a.master_addr = get("MASTER_ADDR").value_or("");
  a.bus = get("AGENTRT_BUS").value_or("");
  a.token_file = get("AGENTRT_TOKEN_FILE").value_or("");
  a.bus_ca_file = get("AGENTRT_BUS_CA").value_or("");
  a.telemetry = get("AGENTRT_TELEMETRY").value_or("");
  a.workdir = get("AGENTRT_WORKDIR").value_or("");
  // Set but empty is meaningful here: no GPU.
  a.cuda_visible_devices = lookup("CUDA_VISIBLE_DEVICES").value_or("");
  if (std::optional<std::string> v = get("AGENTRT_PORTS")) {
    const std::string_view s = *v;
    const auto dash = s.find('-');
    if (dash == std::string_view::npos) {
      return InvalidArgument("environment variable AGENTRT_PORTS=\"" + *v +
                             "\" is not of the form first-last");
    }
    AGENTRT_ASSIGN_OR_RETURN(const int64_t first, ParseInt("AGENTRT_PORTS", s.substr(0, dash)));
    AGENTRT_ASSIGN_OR_RETURN(const int64_t last, ParseInt("AGENTRT_PORTS", s.substr(dash + 1)));
    if (first < 1 || last > 65535 || first > last) {
      return InvalidArgument("environment variable AGENTRT_PORTS=\"" + *v +
                             "\" is not a port range within 1-65535");
    }
    a.ports_first = static_cast<int>(first);
    a.ports_last = static_cast<int>(last);
  }
  return a;
}

std::string GpuListString(const std::vector<int>& gpus) {
  std::string out;
  for (size_t i = 0; i < gpus.size(); ++i) out += (i ? "," : "") + std::to_string(gpus[i]);
  return out;
}

bool IsLauncherWiringVariable(std::string_view name) {
  return name.rfind("OMPI_", 0) == 0 || name.rfind("PMIX_", 0) == 0 ||
         name == "NCCL_SOCKET_IFNAME" || name == "GLOO_SOCKET_IFNAME";
}

bool IsInheritedLaunchVariable(std::string_view name) {
  static const std::set<std::string, std::less<>> kNames = {
      "RANK",        "WORLD_SIZE",         "LOCAL_RANK", "LOCAL_WORLD_SIZE",
      "MASTER_ADDR", "MASTER_PORT",        "GROUP_RANK", "CUDA_VISIBLE_DEVICES",
      "ROLE_RANK",   "TORCHELASTIC_RUN_ID"};
  return name.rfind("AGENTRT_", 0) == 0 || IsLauncherWiringVariable(name) || kNames.count(name) > 0;
}

std::vector<std::string> ComposeEnvironment(const std::vector<std::string>& base,
                                            const std::map<std::string, std::string>& agent_env,
                                            const std::map<std::string, std::string>& contract) {
  std::map<std::string, std::string> env;
  for (const auto& e : base) {
    const auto eq = e.find('=');
    if (eq == std::string::npos) continue;
    std::string name = e.substr(0, eq);
    if (!IsInheritedLaunchVariable(name)) env[std::move(name)] = e.substr(eq + 1);
  }
  for (const auto& [k, v] : agent_env) env[k] = v;
  for (const auto& [k, v] : contract) env[k] = v;
  std::vector<std::string> out;
  out.reserve(env.size());
  for (const auto& [k, v] : env) out.push_back(k + "=" + v);
  return out;
}

Result<std::vector<int>> ParseTasksPerNode(const std::string& text) {
  std::vector<int> counts;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    int count = 0;
    int repeat = 1;
    const size_t paren = item.find('(');
    auto [p, ec] = std::from_chars(
        item.data(), item.data() + (paren == std::string::npos ? item.size() : paren), count);
    bool ok = ec == std::errc() && count >= 0;
    if (ok && paren != std::string::npos) {
      // "2(x3)": three nodes with two tasks each.
      ok = item.size() > paren + 3 && item[paren + 1] == 'x' && item.back() == ')';
      if (ok) {
        auto [q, ec2] =
            std::from_chars(item.data() + paren + 2, item.data() + item.size() - 1, repeat);
        ok = ec2 == std::errc() && q == item.data() + item.size() - 1 && repeat > 0;
      }
    } else if (ok) {
      ok = p == item.data() + item.size();
    }
    if (!ok) {
      return InvalidArgument("SLURM_TASKS_PER_NODE='" + text + "': cannot read '" + item + "'");
    }
    counts.insert(counts.end(), static_cast<size_t>(repeat), count);
  }
  if (counts.empty()) return InvalidArgument("SLURM_TASKS_PER_NODE is empty");
  return counts;
}

Result<std::map<std::string, std::string>> RankVariablesFromLauncher(const EnvLookup& lookup) {
  auto number = [&lookup](const char* name) -> Result<int64_t> {
    std::optional<std::string> v = lookup(name);
    if (!v || v->empty()) return NotFound(std::string(name) + " is not set");
    return ParseInt(name, *v);
  };
  std::map<std::string, std::string> out;
  if (lookup("OMPI_COMM_WORLD_RANK")) {
    AGENTRT_ASSIGN_OR_RETURN(const int64_t rank, number("OMPI_COMM_WORLD_RANK"));
    AGENTRT_ASSIGN_OR_RETURN(const int64_t size, number("OMPI_COMM_WORLD_SIZE"));
    AGENTRT_ASSIGN_OR_RETURN(const int64_t local, number("OMPI_COMM_WORLD_LOCAL_RANK"));
    AGENTRT_ASSIGN_OR_RETURN(const int64_t local_size, number("OMPI_COMM_WORLD_LOCAL_SIZE"));
    out["RANK"] = std::to_string(rank);
    out["WORLD_SIZE"] = std::to_string(size);
    out["LOCAL_RANK"] = std::to_string(local);
    out["LOCAL_WORLD_SIZE"] = std::to_string(local_size);
    return out;
  }
  if (lookup("SLURM_PROCID")) {
    AGENTRT_ASSIGN_OR_RETURN(const int64_t rank, number("SLURM_PROCID"));
    AGENTRT_ASSIGN_OR_RETURN(const int64_t size, number("SLURM_NTASKS"));
    AGENTRT_ASSIGN_OR_RETURN(const int64_t local, number("SLURM_LOCALID"));
    AGENTRT_ASSIGN_OR_RETURN(const int64_t node, number("SLURM_NODEID"));
    const std::string per_node_text = lookup("SLURM_TASKS_PER_NODE").value_or("");
    AGENTRT_ASSIGN_OR_RETURN(const std::vector<int> per_node, ParseTasksPerNode(per_node_text));
    if (node < 0 || static_cast<size_t>(node) >= per_node.size()) {
      return InvalidArgument("SLURM_NODEID=" + std::to_string(node) +
                             " but SLURM_TASKS_PER_NODE='" + per_node_text + "'");
    }
    out["RANK"] = std::to_string(rank);
    out["WORLD_SIZE"] = std::to_string(size);
    out["LOCAL_RANK"] = std::to_string(local);
    out["LOCAL_WORLD_SIZE"] = std::to_string(per_node[static_cast<size_t>(node)]);
    return out;
  }
  return FailedPrecondition(
      "neither OMPI_COMM_WORLD_RANK nor SLURM_PROCID is set: the rank wrapper runs under mpirun or "
      "srun");
}

}  // namespace agentrt
