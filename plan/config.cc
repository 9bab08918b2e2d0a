#include "plan/config.h"

#include <filesystem>

namespace agentrt {

GroupBackend ResolveGroupBackend(GroupBackend requested, int gpus, int ranks) {
  if (requested != GroupBackend::kAuto) return requested;
  if (gpus > 0) return GroupBackend::kNccl;
  return ranks <= 1 ? GroupBackend::kSingle : GroupBackend::kMpi;
}

std::string GroupBackendProblem(GroupBackend requested, int gpus, int ranks) {
  const GroupBackend resolved = ResolveGroupBackend(requested, gpus, ranks);
  const std::string chosen =
      requested == GroupBackend::kAuto ? "auto (nccl for a GPU agent)" : "nccl";
  switch (resolved) {
    case GroupBackend::kNccl:
      if (gpus == 0) return "nccl needs GPUs; this agent has gpus: 0";
      if (ranks > gpus) {
        return "backend " + chosen + " puts " + std::to_string(ranks) + " ranks on " +
               std::to_string(gpus) +
               " GPU(s), but NCCL refuses two ranks on one GPU (\"Duplicate GPU detected\"): "
               "give the agent one GPU per rank (ranks: " +
               std::to_string(gpus) + "), or backend: mpi to train on the host";
      }
      return "";
    case GroupBackend::kSingle:
      if (ranks > 1) {
        return "single means one rank; this agent has " + std::to_string(ranks) + " ranks";
      }
      return "";
    case GroupBackend::kMpi:
    case GroupBackend::kAuto:
      return "";
  }
  return "";
}

bool LaunchesThroughMpi(GroupBackend backend, int ranks) {
  return backend == GroupBackend::kMpi && ranks > 1;
}

std::vector<std::string> ConfigWarnings(const Config& config) {
  std::vector<std::string> out;
  for (const AgentConfig& agent : config.agents) {
    if (agent.gpus == 0 || agent.command.empty()) continue;
    if (std::filesystem::path(agent.command.front()).filename() != "agent-worker") continue;
    const bool host =
        ResolveGroupBackend(agent.backend, agent.gpus, agent.ranks) != GroupBackend::kNccl;
    out.push_back(
        "agent " + agent.name + " asks for " + std::to_string(agent.gpus) +
        " GPU(s) but runs agent-worker, the C++ reference agent, which trains on the CPU: " +
        (host ? std::string("the GPUs stay reserved and idle")
              : std::string("it will refuse the nccl group a GPU agent gets (set backend: "
                            "single for one rank or mpi to train on the CPU)")) +
        ". Train on GPUs with the PyTorch agent (command: [python3, "
        "examples/torch_ppo/train.py]), or set gpus: 0");
  }
  return out;
}

int Config::TotalGpus() const {
  int total = 0;
  for (const AgentConfig& agent : agents) total += agent.gpus;
  return total;
}

int Config::TotalRanks() const {
  int total = 0;
  for (const AgentConfig& agent : agents) total += agent.ranks;
  return total;
}

const AgentConfig* Config::FindAgent(std::string_view name) const {
  for (const AgentConfig& agent : agents) {
    if (agent.name == name) return &agent;
  }
  return nullptr;
}

const LeagueMember* LeagueConfig::FindMember(std::string_view agent) const {
  for (const LeagueMember& m : members) {
    if (m.agent == agent) return &m;
  }
  return nullptr;
}

}  // namespace agentrt
