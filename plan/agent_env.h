// agentrt::AgentEnv — the agent process contract: every variable a
// rank of an agent is started with, named once, here. Each launcher (the local
// backend, the srun backend, `agentctl array-task`) fills an AgentEnv from what
// it knows and turns it into variables with ToVariables(); the rank wrapper
// (plan/rank_exec.h) adds the per-rank part that only mpirun or srun know; the
// rank parses it once with Parse() (agentrt::Runtime does, and BusClient's
// FromEnvironment goes through it too).
//
//   variable                 field               who sets it
//   AGENTRT_RUN_DIR          run_dir             launcher
//   AGENTRT_AGENT            agent               launcher
//   AGENTRT_AGENT_INDEX      agent_index         launcher
//   RANK, WORLD_SIZE         rank, world_size    launcher or rank wrapper
//   LOCAL_RANK               local_rank          launcher or rank wrapper
//   LOCAL_WORLD_SIZE         local_world_size    launcher or rank wrapper
//   MASTER_ADDR, MASTER_PORT master_addr/_port   launcher
//   CUDA_VISIBLE_DEVICES     cuda_visible_devices launcher (rank wrapper per node); "" = no GPU
//   AGENTRT_PORTS            ports_first-last    launcher
//   AGENTRT_CKPT_DIR         ckpt_dir            launcher
//   AGENTRT_BUS              bus (host:port)     launcher ("" = no bus)
//   AGENTRT_TOKEN_FILE       token_file          launcher
//   AGENTRT_BUS_CA           bus_ca_file         launcher ("" = plaintext bus; else the
//                                                CA its clients verify it with: TLS)
//   AGENTRT_TELEMETRY        telemetry           launcher ("" = no controller)
//   AGENTRT_RESTART_COUNT    restart_count       launcher
//   AGENTRT_WORKDIR          workdir             launcher (also the rank's cwd)
//
// Plain data and pure functions; thread-safe.
#pragma once

#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace agentrt {

// The exit status of an agent process that cannot start because of its own
// configuration (bad `args`, a world it cannot be seated in): EX_CONFIG of
// sysexits.h. The supervisor does not restart it (trying again cannot help)
// and quotes the agent's last message in the run summary.
inline constexpr int kExitConfigError = 78;

// The exit status of an agent process that could not start because something
// it needs is not there for now (the run's bus does not answer): EX_TEMPFAIL
// of sysexits.h. The supervisor restarts it as any failure, but never counts
// it towards a crash loop (the same start-up failure again and again).
inline constexpr int kExitTempFail = 75;

// The run directory's variable, for code that needs it before (or without) a
// whole AgentEnv (the rank wrapper names its port lease after it).
inline constexpr char kEnvRunDir[] = "AGENTRT_RUN_DIR";

// Reads one variable (nullopt when unset). Tests pass a map.
using EnvLookup = std::function<std::optional<std::string>(const std::string& name)>;
// The process's own environment.
EnvLookup ProcessEnvLookup();
// A lookup over "NAME=value" strings.
EnvLookup EnvLookupOf(const std::vector<std::string>& environ);

struct AgentEnv {
  std::string run_dir;
  std::string agent;
  int agent_index = 0;
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_world_size = 1;
  std::string master_addr;
  int master_port = 0;
  std::string cuda_visible_devices;  // as given: indices, or UUIDs/MIG names
  int ports_first = 0;
  int ports_last = 0;
  std::string ckpt_dir;
  std::string bus;
  std::string token_file;
  std::string bus_ca_file;
  std::string telemetry;
  int restart_count = 0;
  std::string workdir;

  // How many GPUs cuda_visible_devices makes visible: indices, UUIDs
  // ("GPU-…") and MIG instances ("MIG-…") alike (DeviceListEntries).
  int VisibleGpuCount() const;

  // The variables of the table above. Without `with_rank`: the agent-wide ones
  // only (no RANK, LOCAL_RANK, and no WORLD_SIZE/LOCAL_WORLD_SIZE), for a
  // launcher whose rank wrapper sets those from mpirun's or srun's own.
  std::map<std::string, std::string> ToVariables(bool with_rank = true) const;

  // Parses a rank's environment. Under mpirun or srun without the wrapper the
  // rank variables fall back to OMPI_COMM_WORLD_* / PMIX_RANK / SLURM_*.
  // Errors name the variable and say that agents are started by `agentctl run`.
  static Result<AgentEnv> Parse(const EnvLookup& lookup);
  static Result<AgentEnv> FromProcess() { return Parse(ProcessEnvLookup()); }
};

// A GPU id list in the CUDA_VISIBLE_DEVICES form: "0,1,3" ("" for none).
std::string GpuListString(const std::vector<int>& gpus);

// The devices a CUDA_VISIBLE_DEVICES value names, as CUDA reads it: entries
// up to the first that names none (empty, or a negative index such as "-1").
// Entries are indices, UUIDs ("GPU-8a1…") or MIG instances ("MIG-…").
std::vector<std::string> DeviceListEntries(std::string_view cuda_visible_devices);

// The CUDA_VISIBLE_DEVICES a rank needs to see the plan's GPUs `plan_gpus`
// when its launcher itself runs with `launcher_visible` (nullopt: unset, so
// plan GPU i is device i). The plan numbers the GPUs the launcher sees, so
// with CUDA_VISIBLE_DEVICES=2,3 (or two UUIDs) plan GPU 0 is the first
// entry. Fails, naming the GPU, when the plan asks for one the launcher
// cannot see.
Result<std::string> VisibleDevicesFor(const std::vector<int>& plan_gpus,
                                      const std::optional<std::string>& launcher_visible);

// True for what a process's own launcher set for it: the MPI/PMIx wiring
// (OMPI_*, PMIX_*) and the NCCL/gloo interface choice. A rank keeps these
// when its launcher started it itself (an array task under srun).
bool IsLauncherWiringVariable(std::string_view name);

// True for a name a launcher must not pass on from its own environment: the
// contract's, torchrun's and the launcher wiring of an enclosing mpirun/PMIx.
bool IsInheritedLaunchVariable(std::string_view name);

// The complete environment of a rank ("NAME=value", sorted): `base` without the
// inherited launch variables, then `agent_env` (the agent's `env:` from
// agents.yaml), then `contract` (it wins).
std::vector<std::string> ComposeEnvironment(const std::vector<std::string>& base,
                                            const std::map<std::string, std::string>& agent_env,
                                            const std::map<std::string, std::string>& contract);

// The rank part of the contract as mpirun (OMPI_COMM_WORLD_*) or srun
// (SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, SLURM_TASKS_PER_NODE at
// SLURM_NODEID) tell it: RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE.
// Errors name the launcher variable that is missing or malformed.
Result<std::map<std::string, std::string>> RankVariablesFromLauncher(const EnvLookup& lookup);

// `SLURM_TASKS_PER_NODE` ("2(x3),1") expanded to one count per node.
Result<std::vector<int>> ParseTasksPerNode(const std::string& text);

}  // namespace agentrt
