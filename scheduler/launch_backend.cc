#include "scheduler/launch_backend.h"

#include <filesystem>

#include "plan/fence.h"
#include "plan/rank_exec.h"

namespace agentrt {

AgentEnv AgentLaunch::Contract(int rank, int rendezvous_port) const {
  const RankLaunch* r = nullptr;
  for (const auto& candidate : ranks) {
    if (candidate.rank == rank) r = &candidate;
  }
  const RankLaunch& any = r != nullptr ? *r : ranks.front();
  AgentEnv e;
  e.run_dir = run_dir;
  e.agent = name;
  e.agent_index = index;
  e.rank = r != nullptr ? r->rank : 0;
  e.world_size = static_cast<int>(ranks.size());
  e.local_rank = r != nullptr ? r->local_rank : 0;
  e.local_world_size = any.local_world_size;
  e.master_addr = master_addr;
  e.master_port = rendezvous_port;
  // "" for a CPU rank: it must not pick up a GPU. PrepareLaunch refused a
  // mapping that fails.
  Result<std::string> visible = VisibleDevicesFor(any.gpus, launcher_visible_devices);
  e.cuda_visible_devices = visible.ok() ? *visible : GpuListString(any.gpus);
  e.ports_first = ports_first;
  e.ports_last = ports_last;
  e.ckpt_dir = checkpoint_dir;
  e.bus = bus_address;
  e.token_file = token_file;
  e.bus_ca_file = bus_ca_file;
  e.telemetry = telemetry_endpoint;
  e.restart_count = restart_count;
  e.workdir = workdir;
  return e;
}

Status PrepareLaunch(const AgentLaunch& agent, bool still_running) {
  if (agent.ranks.empty()) return InvalidArgument("agent " + agent.name + ": no ranks to launch");
  if (agent.command.empty()) return InvalidArgument("agent " + agent.name + ": empty command");
  if (still_running) {
    return FailedPrecondition("agent " + agent.name + " is still running; cannot launch it again");
  }
  for (const RankLaunch& r : agent.ranks) {
    Result<std::string> visible = VisibleDevicesFor(r.gpus, agent.launcher_visible_devices);
    if (!visible.ok()) {
      return visible.status().WithContext("agent " + agent.name + " rank " +
                                          std::to_string(r.rank) + " on " + r.node);
    }
  }
  for (const std::string* dir : {&agent.log_dir, &agent.checkpoint_dir, &agent.workdir}) {
    if (dir->empty()) continue;
    std::error_code ec;
    std::filesystem::create_directories(*dir, ec);
    if (ec)
      return Internal("agent " + agent.name + ": cannot create " + *dir + ": " + ec.message());
  }
  // How this incarnation's ranks end is written afresh: a record of an
  // earlier one with the same restart count would pass for it (a rank killed
  // with its node leaves none, and would then count as a clean exit).
  if (!agent.log_dir.empty()) RemoveRankExits(agent.log_dir);
  if (!agent.incarnation.empty() && !agent.checkpoint_dir.empty()) {
    AGENTRT_RETURN_IF_ERROR(WriteCheckpointFence(agent.checkpoint_dir, agent.incarnation)
                                .WithContext("agent " + agent.name));
  }
  return Status::Ok();
}

std::vector<std::string> BuildRankEnvironment(const AgentLaunch& agent, int rank, int master_port,
                                              const std::vector<std::string>& base_env) {
  return ComposeEnvironment(base_env, agent.env,
                            agent.Contract(rank, master_port).ToVariables(rank >= 0));
}

}  // namespace agentrt
