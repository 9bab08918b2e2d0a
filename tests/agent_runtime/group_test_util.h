// What the group and optimizer tests share: seeded random vectors, and the
// MPI world of a test process that mpirun started.
#pragma once

#include <catch2/catch.hpp>
#include <cstdint>
#include <memory>
#include <random>
#include <utility>
#include <vector>

#include "agent_runtime/group.h"

namespace agentrt {

// n normal draws of standard deviation `scale`, the same for the same seed.
inline std::vector<float> RandomVector(size_t n, uint32_t seed, float scale) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = dist(gen);
  return v;
}

// The process's MPI group for `agent`, made on first use (one per process).
inline Group& MpiWorld(const char* agent) {
  static std::unique_ptr<Group> group = [agent] {
    GroupOptions o;
    o.backend = GroupBackend::kMpi;
    o.agent = agent;
    auto g = MakeGroup(o);
    if (!g.ok()) FAIL(g.status().ToString());
    return std::move(g).value();
  }();
  return *group;
}

}  // namespace agentrt
