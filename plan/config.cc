#include "plan/config.h"

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
  // Agents that ask for GPUs but run agent-worker, by whether their group
  // would be a host one (GPUs idle) or nccl (refused): one warning per kind,
  // naming the first few agents, so a large run gets two lines, not one per agent.
  constexpr size_t kNamed = 5;
  struct Kind {
    std::vector<const AgentConfig*> agents;
  };
  Kind host, nccl;
  for (const AgentConfig& agent : config.agents) {
    if (agent.gpus == 0 || agent.command.empty()) continue;
    const std::string_view program = agent.command.front();
    const size_t slash = program.rfind('/');
    if (program.substr(slash == std::string_view::npos ? 0 : slash + 1) != "agent-worker") continue;
    const bool on_host =
        ResolveGroupBackend(agent.backend, agent.gpus, agent.ranks) != GroupBackend::kNccl;
    (on_host ? host : nccl).agents.push_back(&agent);
  }
  std::vector<std::string> out;
  for (const Kind* kind : {&host, &nccl}) {
    if (kind->agents.empty()) continue;
    std::string who;
    if (kind->agents.size() == 1) {
      who = "agent " + kind->agents[0]->name + " asks for " +
            std::to_string(kind->agents[0]->gpus) + " GPU(s) but runs";
    } else {
      who = std::to_string(kind->agents.size()) + " agents (";
      for (size_t i = 0; i < std::min(kNamed, kind->agents.size()); ++i)
        who += (i > 0 ? ", " : "") + kind->agents[i]->name;
      if (kind->agents.size() > kNamed)
        who += ", and " + std::to_string(kind->agents.size() - kNamed) + " more";
      who += ") ask for GPUs but run";
    }
    out.push_back(who + " agent-worker, the C++ reference agent, which trains on the CPU: " +
                  (kind == &host
                       ? std::string("the GPUs stay reserved and idle")
                       : std::string("it will refuse the nccl group a GPU agent gets (set "
                                     "backend: single for one rank or mpi to train on the CPU)")) +
                  ". Train on GPUs with the PyTorch agent (command: [python3, "
                  "examples/torch_ppo/train.py]), or set gpus: 0");
  }
  // Channels written for the policy snapshots' old topic: the agents publish
  // them as weight streams now, which such a channel does not govern.
  std::vector<std::string> old;
  for (const ChannelConfig& channel : config.channels) {
    if (channel.topic.starts_with("policies/")) old.push_back(channel.topic);
  }
  if (!old.empty()) {
    out.push_back("channel " + old.front() +
                  (old.size() > 1 ? " (and " + std::to_string(old.size() - 1) + " more)" : "") +
                  ": agent-worker and examples/torch_ppo publish their policies as weight streams "
                  "on weights/<agent>, not on policies/<agent>; write the channel as {topic: "
                  "\"weights/{agent}\", ...} or their snapshots are refused");
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
