// Plans for tests: a complete, valid Plan (as MakePlan would write it) from
// agent names and channels, so tests that need a plan.json write a real one
// through WritePlanFile instead of hand-made JSON.
#pragma once

#include <string>
#include <vector>

#include "plan/plan.h"

namespace agentrt::testing {

struct TestAgent {
  std::string name;
  int ranks = 1;
  GroupBackend backend = GroupBackend::kSingle;
  nlohmann::json args = nlohmann::json::object();
};

// One node ("localhost"), CPU agents, port blocks of 16 from 20016, the bus on 20000.
inline Plan TestPlan(const std::string& run, const std::vector<TestAgent>& agents,
                     const std::vector<ChannelPlan>& channels = {}) {
  Plan plan;
  plan.run = run;
  plan.bus.host = "localhost";
  plan.bus.port = 20000;
  plan.bus.settings.port = 20000;
  for (size_t i = 0; i < agents.size(); ++i) {
    AgentPlan a;
    a.name = agents[i].name;
    a.index = static_cast<int>(i);
    a.ranks = agents[i].ranks;
    Placement p;
    p.node = "localhost";
    for (int r = 0; r < a.ranks; ++r) p.ranks.push_back(r);
    a.placement.push_back(p);
    a.ports = {"localhost", 20016 + 16 * static_cast<int>(i), 20031 + 16 * static_cast<int>(i)};
    a.master_addr = "localhost";
    a.master_port = a.ports.first;
    a.checkpoint_dir = "checkpoints/" + a.name;
    a.backend = agents[i].backend;
    a.command = {"agent-worker"};
    a.args = agents[i].args;
    plan.agents.push_back(std::move(a));
  }
  plan.channels = channels;
  return plan;
}

inline Plan TestPlan(const std::string& run, const std::vector<std::string>& names,
                     const std::vector<ChannelPlan>& channels = {}) {
  std::vector<TestAgent> agents;
  for (const auto& n : names) agents.push_back({n});
  return TestPlan(run, agents, channels);
}

}  // namespace agentrt::testing
