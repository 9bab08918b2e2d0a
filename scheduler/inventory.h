// Cluster inventory: the nodes a plan may use, from one of
//   - the config's `cluster:` block or an inventory file (InventoryFromCluster),
//   - the local machine (DetectLocalMachine + LocalInventory),
//   - SLURM (`scontrol show node -o` text → ParseScontrolNodes → InventoryFromSlurm).
// Plain data and pure functions, except DetectLocalMachine (reads the host).
#pragma once

#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "plan/config.h"

namespace agentrt {

namespace device {
class Api;
}  // namespace device

struct Inventory {
  std::vector<NodeSpec> nodes;  // in order: the first node hosts the bus
  // The local machine: CPU counts are advice, not a limit (a 2-core laptop may
  // run a 5-rank demo); the planner then warns instead of refusing.
  bool oversubscribe_cpus = false;
  std::string source;  // "config", "local machine", "slurm partition gpu", ...
  // A live SLURM allocation (ReserveControllerCpu): one CPU of every node is
  // kept for the controller's task, so the counts are CPUTot - 1.
  bool controller_cpu_reserved = false;
  // Said while resolving it (e.g. a config block it did not use); the planner
  // copies them into the plan's warnings.
  std::vector<std::string> warnings;
};

Inventory InventoryFromCluster(const ClusterConfig& cluster, std::string source = "config");

// What DetectLocalMachine found.
struct LocalMachine {
  std::string hostname = "localhost";
  int cpus = 1;
  int gpus = 0;
  std::vector<std::vector<int>> nvlink_domains;  // GPUs that can reach each other peer-to-peer
};

// Hostname (or "localhost"), online CPUs, and the GPU count and peer-access
// groups (cudaDeviceCanAccessPeer) through agentrt's GPU support
// (device::LoadDeviceApi). Honours CUDA_VISIBLE_DEVICES as the CUDA runtime
// does. 0 GPUs only when there is none to use (DetectLocalGpus); any other
// failure is an error that says why.
Result<LocalMachine> DetectLocalMachine();

// The GPU part of DetectLocalMachine, over what the machine has: no NVIDIA
// driver → 0 GPUs; a driver but no usable GPU support (`api` failed to load),
// or a CUDA error counting the devices or reading peer access → that error,
// never a silent 0.
Status DetectLocalGpus(bool driver_present, const Result<device::Api*>& api, LocalMachine& machine);
Inventory LocalInventory(const LocalMachine& machine);

// One line of `scontrol show node -o`.
struct SlurmNode {
  NodeSpec spec;           // name, gpus (from Gres), cpus (CPUTot), one NVLink domain
  int gpus_used = 0;       // from GresUsed, when present
  int cpus_allocated = 0;  // CPUAlloc
  std::string state;       // e.g. "IDLE", "MIXED", "IDLE+DRAIN", "DOWN*"
  std::vector<std::string> partitions;
  // false when the node cannot take jobs: DOWN, DRAIN(ED/ING), FAIL, MAINT,
  // NOT_RESPONDING (`*`), POWERED_DOWN, FUTURE, INVAL, REBOOT...
  bool usable = false;
};

// Parses `scontrol show node -o` output (one node per line). Understands
// `Gres=gpu:8`, `gpu:h100:8(S:0-1)`, several gres entries and `(null)`.
Result<std::vector<SlurmNode>> ParseScontrolNodes(std::string_view text);

// Usable nodes, in the order given, restricted to `partition` when not empty.
Inventory InventoryFromSlurm(const std::vector<SlurmNode>& nodes, std::string_view partition);

// Where the nodes of a plan come from: one rule, shared by `agentctl plan`,
// `agentctl run` and `agentctl sbatch`, in this order of precedence:
//   1. --cluster FILE: an inventory file; its nodes (and its ports, when it
//      states them) replace the config's. Refused when planning for a live
//      SLURM allocation (`run --backend slurm`), whose nodes SLURM decides.
//   2. SLURM: `--scontrol FILE` (saved `scontrol show node -o` output) or
//      `--scontrol -` / a live allocation (scontrol run now): the usable nodes of
//      slurm.partition. A `cluster.nodes` block in the config is then not used,
//      and the inventory says so in a warning.
//   3. the config's own `cluster.nodes` block;
//   4. the command's fallback: this machine (plan, run) or the live SLURM
//      cluster (sbatch).
struct InventoryRequest {
  std::string config_file;   // names the config's cluster block in messages
  std::string cluster_file;  // --cluster
  std::string scontrol;      // --scontrol: a file, or "-" for the live cluster
  bool live_slurm = false;   // plan for a live allocation (run --backend slurm)
  enum class Fallback { kLocalMachine, kSlurm };
  Fallback fallback = Fallback::kLocalMachine;
};

// `scontrol show node -o` of the live cluster (slurm/slurm_client.h provides one).
using ScontrolReader = std::function<Result<std::string>()>;

// The inventory `request` asks for. May change `config` (an inventory file's
// nodes and ports replace the config's). Errors name the file or the command.
Result<Inventory> ResolveInventory(Config& config, const InventoryRequest& request,
                                   const ScontrolReader& read_live_scontrol);

// For a live allocation (`run --backend slurm`): its batch step, the run
// controller, holds a CPU of its own, and the allocation asks every node for
// the same task count (--ntasks-per-node: the most ranks on one node, plus
// the controller's), so the planner may give no node more than CPUTot - 1
// ranks. Lowers every stated CPU count by one and says so in the inventory.
void ReserveControllerCpu(Inventory& inventory);

// The GPU count of a SLURM gres string (`gpu:h100:8(S:0-1),nic:1` → 8).
int GpusFromGres(std::string_view gres);
// The GPU type of a SLURM gres string (`gpu:h100:8(S:0-1)` → "h100"); "" when untyped.
std::string GpuTypeFromGres(std::string_view gres);

}  // namespace agentrt
