#include "scheduler/inventory.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <numeric>
#include <thread>

#include "agent_runtime/device_api.h"
#include "common/file_util.h"
#include "scheduler/loader.h"

namespace agentrt {

Inventory InventoryFromCluster(const ClusterConfig& cluster, std::string source) {
  Inventory inv;
  inv.nodes = cluster.nodes;
  inv.source = std::move(source);
  return inv;
}

namespace {

std::string Hostname() {
  char buf[256] = {};
  if (::gethostname(buf, sizeof(buf) - 1) != 0 || buf[0] == '\0') return "localhost";
  std::string name(buf);
  // The short name, as SLURM and MPI hostfiles use it.
  if (size_t dot = name.find('.'); dot != std::string::npos && dot > 0) name.resize(dot);
  return name;
}

// Groups GPUs that can all reach each other peer-to-peer (connected components).
Result<std::vector<std::vector<int>>> PeerGroups(device::Api& api, int gpus) {
  std::vector<int> parent(static_cast<size_t>(gpus));
  std::iota(parent.begin(), parent.end(), 0);
  auto find = [&](int x) {
    while (parent[static_cast<size_t>(x)] != x)
      x = parent[static_cast<size_t>(x)] =
          parent[static_cast<size_t>(parent[static_cast<size_t>(x)])];
    return x;
  };
  for (int a = 0; a < gpus; ++a) {
    for (int b = a + 1; b < gpus; ++b) {
      AGENTRT_ASSIGN_OR_RETURN(const bool can, api.CanAccessPeer(a, b));
      if (can) parent[static_cast<size_t>(find(b))] = find(a);
    }
  }
  std::vector<std::vector<int>> groups;
  std::vector<int> group_of(static_cast<size_t>(gpus), -1);
  for (int g = 0; g < gpus; ++g) {
    int root = find(g);
    if (group_of[static_cast<size_t>(root)] < 0) {
      group_of[static_cast<size_t>(root)] = static_cast<int>(groups.size());
      groups.emplace_back();
    }
    groups[static_cast<size_t>(group_of[static_cast<size_t>(root)])].push_back(g);
  }
  return groups;
}

}  // namespace

Status DetectLocalGpus(bool driver_present, const Result<device::Api*>& api,
                       LocalMachine& machine) {
  machine.gpus = 0;
  machine.nvlink_domains.clear();
  if (!driver_present) return Status::Ok();  // no NVIDIA driver: no GPU to use
  const std::string where = "this machine has an NVIDIA driver (libcuda.so.1)";
  if (!api.ok()) return api.status().WithContext(where + " but agentrt cannot use its GPUs");
  Result<int> count = (*api)->DeviceCount();
  if (!count.ok()) return count.status().WithContext(where + " but counting its GPUs failed");
  if (*count == 0) return Status::Ok();
  Result<std::vector<std::vector<int>>> groups = PeerGroups(**api, *count);
  if (!groups.ok()) {
    return groups.status().WithContext(where + " but reading its GPUs' peer access failed");
  }
  machine.gpus = *count;
  machine.nvlink_domains = std::move(groups).value();
  return Status::Ok();
}

Result<LocalMachine> DetectLocalMachine() {
  LocalMachine m;
  m.hostname = Hostname();
  long online = ::sysconf(_SC_NPROCESSORS_ONLN);
  m.cpus = online > 0 ? static_cast<int>(online)
                      : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const bool driver = device::DriverPresent();
  const Result<device::Api*> api =
      driver ? device::LoadDeviceApi() : Result<device::Api*>(FailedPrecondition("no driver"));
  AGENTRT_RETURN_IF_ERROR(DetectLocalGpus(driver, api, m));
  return m;
}

Inventory LocalInventory(const LocalMachine& machine) {
  Inventory inv;
  NodeSpec node;
  node.name = machine.hostname;
  node.gpus = machine.gpus;
  node.cpus = machine.cpus;
  node.nvlink_domains = machine.nvlink_domains;
  if (node.gpus > 0 && node.nvlink_domains.empty()) {
    std::vector<int> all(static_cast<size_t>(node.gpus));
    std::iota(all.begin(), all.end(), 0);
    node.nvlink_domains.push_back(std::move(all));
  }
  inv.nodes.push_back(std::move(node));
  inv.oversubscribe_cpus = true;
  inv.source = "local machine";
  return inv;
}

std::string GpuTypeFromGres(std::string_view gres) {
  for (size_t at = gres.find("gpu:"); at != std::string_view::npos;
       at = gres.find("gpu:", at + 1)) {
    if (at > 0 && gres[at - 1] != ',') continue;
    std::string_view rest = gres.substr(at + 4);
    const size_t colon = rest.find(':');
    const size_t stop = rest.find_first_of(",(");
    if (colon != std::string_view::npos && (stop == std::string_view::npos || colon < stop))
      return std::string(rest.substr(0, colon));
  }
  return "";
}

int GpusFromGres(std::string_view gres) {
  int total = 0;
  size_t start = 0;
  while (start < gres.size()) {
    // Entries are comma-separated, but a comma may sit inside "(S:0-1,3)".
    size_t end = start;
    int paren = 0;
    while (end < gres.size() && (gres[end] != ',' || paren > 0)) {
      if (gres[end] == '(') ++paren;
      if (gres[end] == ')') --paren;
      ++end;
    }
    std::string_view entry = gres.substr(start, end - start);
    if (size_t p = entry.find('('); p != std::string_view::npos) entry = entry.substr(0, p);
    if (entry.rfind("gpu", 0) == 0 && (entry.size() == 3 || entry[3] == ':')) {
      size_t colon = entry.rfind(':');
      if (colon != std::string_view::npos) {
        std::string_view count = entry.substr(colon + 1);
        int n = 0;
        auto [ptr, ec] = std::from_chars(count.data(), count.data() + count.size(), n);
        if (ec == std::errc() && ptr == count.data() + count.size()) total += n;
      }
    }
    start = end + 1;
  }
  return total;
}

namespace {

bool StateUsable(std::string_view state) {
  if (state.empty()) return false;
  if (state.find('*') != std::string_view::npos) return false;  // not responding
  for (std::string_view bad : {"DOWN", "DRAIN", "FAIL", "MAINT", "POWER", "FUTURE", "INVAL",
                               "REBOOT", "NOT_RESPONDING", "UNKNOWN"}) {
    if (state.find(bad) != std::string_view::npos) return false;
  }
  return true;
}

std::vector<std::string> SplitComma(std::string_view s) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= s.size()) {
    size_t comma = s.find(',', start);
    if (comma == std::string_view::npos) comma = s.size();
    if (comma > start) out.emplace_back(s.substr(start, comma - start));
    start = comma + 1;
  }
  return out;
}

}  // namespace

Result<std::vector<SlurmNode>> ParseScontrolNodes(std::string_view text) {
  std::vector<SlurmNode> nodes;
  int line_no = 0;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t eol = text.find('\n', pos);
    if (eol == std::string_view::npos) eol = text.size();
    std::string_view line = text.substr(pos, eol - pos);
    pos = eol + 1;
    ++line_no;
    if (line.find_first_not_of(" \t\r") == std::string_view::npos) continue;
    // key=value tokens; a token without '=' continues the previous value
    // (values such as OS= and Reason= contain spaces).
    std::vector<std::pair<std::string, std::string>> kv;
    size_t i = 0;
    while (i < line.size()) {
      while (i < line.size() && (line[i] == ' ' || line[i] == '\t' || line[i] == '\r')) ++i;
      size_t end = i;
      while (end < line.size() && line[end] != ' ' && line[end] != '\t' && line[end] != '\r') ++end;
      if (end == i) break;
      std::string_view token = line.substr(i, end - i);
      size_t eq = token.find('=');
      if (eq == std::string_view::npos || eq == 0) {
        if (!kv.empty()) kv.back().second += " " + std::string(token);
      } else {
        kv.emplace_back(std::string(token.substr(0, eq)), std::string(token.substr(eq + 1)));
      }
      i = end;
    }
    SlurmNode node;
    bool have_name = false;
    for (const auto& [key, value] : kv) {
      if (key == "NodeName") {
        node.spec.name = value;
        have_name = true;
      } else if (key == "NodeAddr") {
        node.spec.addr = value;
      } else if (key == "CPUTot") {
        std::from_chars(value.data(), value.data() + value.size(), node.spec.cpus);
      } else if (key == "CPUAlloc") {
        std::from_chars(value.data(), value.data() + value.size(), node.cpus_allocated);
      } else if (key == "Gres") {
        node.spec.gpus = GpusFromGres(value);
        node.spec.gpu_type = GpuTypeFromGres(value);
      } else if (key == "GresUsed") {
        node.gpus_used = GpusFromGres(value);
      } else if (key == "State") {
        node.state = value;
      } else if (key == "Partitions") {
        node.partitions = SplitComma(value);
      }
    }
    if (!have_name || node.spec.name.empty()) {
      return InvalidArgument(fmt::format(
          "scontrol output line {}: no NodeName= (is this `scontrol show node -o` output?)",
          line_no));
    }
    if (node.spec.gpus > 0) {
      std::vector<int> all(static_cast<size_t>(node.spec.gpus));
      std::iota(all.begin(), all.end(), 0);
      node.spec.nvlink_domains.push_back(std::move(all));
    }
    node.usable = StateUsable(node.state);
    nodes.push_back(std::move(node));
  }
  return nodes;
}

Inventory InventoryFromSlurm(const std::vector<SlurmNode>& nodes, std::string_view partition) {
  Inventory inv;
  inv.source =
      partition.empty() ? std::string("slurm") : fmt::format("slurm partition {}", partition);
  for (const SlurmNode& n : nodes) {
    if (!n.usable) continue;
    if (!partition.empty() &&
        std::find(n.partitions.begin(), n.partitions.end(), partition) == n.partitions.end()) {
      continue;
    }
    inv.nodes.push_back(n.spec);
  }
  return inv;
}

void ReserveControllerCpu(Inventory& inventory) {
  for (NodeSpec& node : inventory.nodes) {
    if (node.cpus > 0) --node.cpus;
  }
  inventory.controller_cpu_reserved = true;
}

Result<Inventory> ResolveInventory(Config& config, const InventoryRequest& request,
                                   const ScontrolReader& read_live_scontrol) {
  if (!request.cluster_file.empty()) {
    if (request.live_slurm) {
      return InvalidArgument(
          "--cluster " + request.cluster_file +
          " cannot be used with --backend slurm: the allocation runs on the nodes SLURM has "
          "(scontrol show node); drop --cluster, or use it with `agentctl plan` and "
          "`--backend local`");
    }
    if (!request.scontrol.empty()) {
      return InvalidArgument("give either --cluster or --scontrol, not both");
    }
    AGENTRT_RETURN_IF_ERROR(ApplyClusterFile(request.cluster_file, config));
    return InventoryFromCluster(config.cluster, request.cluster_file);
  }
  const bool use_slurm =
      !request.scontrol.empty() || request.live_slurm ||
      (config.cluster.nodes.empty() && request.fallback == InventoryRequest::Fallback::kSlurm);
  if (use_slurm) {
    Result<std::string> text = Internal("no scontrol output");
    if (!request.scontrol.empty() && request.scontrol != "-") {
      text = ReadWholeFile(request.scontrol, size_t{64} << 20);
      if (!text.ok()) return text.status().WithContext("--scontrol");
    } else {
      if (!read_live_scontrol) return FailedPrecondition("no way to read the live SLURM cluster");
      text = read_live_scontrol();
      if (!text.ok()) {
        return text.status().WithContext(
            "cannot read the SLURM cluster (scontrol show node -o); is SLURM installed and "
            "reachable? (or describe the nodes with --cluster / a cluster: block)");
      }
    }
    AGENTRT_ASSIGN_OR_RETURN(std::vector<SlurmNode> nodes, ParseScontrolNodes(*text));
    Inventory inventory = InventoryFromSlurm(nodes, config.slurm.partition);
    if (request.live_slurm) ReserveControllerCpu(inventory);
    if (!config.cluster.nodes.empty()) {
      inventory.warnings.push_back(
          fmt::format("{}: the cluster.nodes block is not used: the plan is made on SLURM's nodes",
                      request.config_file.empty() ? "the config" : request.config_file));
    }
    return inventory;
  }
  if (!config.cluster.nodes.empty()) {
    return InventoryFromCluster(config.cluster, request.config_file + " cluster:");
  }
  AGENTRT_ASSIGN_OR_RETURN(const LocalMachine machine, DetectLocalMachine());
  return LocalInventory(machine);
}

}  // namespace agentrt
