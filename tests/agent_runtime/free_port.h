// A port for a test's rendezvous: below the kernel's ephemeral range (which
// starts at 32768), so no outgoing connection of a parallel test takes it
// between the probe and its use; above agentctl's default port range
// (cluster.ports 20000-29999), which parallel demo runs lease; and bindable now.
#pragma once

#include <random>

#include "plan/port_lease.h"

namespace agentrt::testing {

inline int FreeTestPort() {
  static std::mt19937 rng(std::random_device{}());
  std::uniform_int_distribution<int> pick(30000, 32700);
  for (int attempt = 0; attempt < 1000; ++attempt) {
    const int port = pick(rng);
    if (PortBindable(port)) return port;
  }
  return 0;
}

}  // namespace agentrt::testing
