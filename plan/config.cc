#include "plan/config.h"

namespace agentrt {

GroupBackend ResolveGroupBackend(GroupBackend requested, int gpus, int ranks) {
  if (requested != GroupBackend::kAuto) return requested;
  if (ranks <= 1) return GroupBackend::kSingle;
  return gpus > 0 ? GroupBackend::kNccl : GroupBackend::kMpi;
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
