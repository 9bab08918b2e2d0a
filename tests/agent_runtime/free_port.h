// A port for a test's rendezvous: below the kernel's ephemeral range (which
// starts at 32768), so no outgoing connection of a parallel test takes it
// between the probe and its use; above agentctl's default port range
// (cluster.ports 20000-29999), which parallel demo runs lease; bindable now;
// and leased machine-wide (plan/port_lease.h) for the rest of the test
// process, so neither another test taking a port this way nor a run that
// leases its ports (agentctl, the run driver's tests) is given it meanwhile.
#pragma once

#include <unistd.h>

#include <memory>
#include <random>
#include <string>

#include "plan/port_lease.h"

namespace agentrt::testing {

inline int FreeTestPort() {
  static std::mt19937 rng(std::random_device{}());
  static const std::unique_ptr<PortLeases> leases = [] {
    auto opened = PortLeases::Open("test process " + std::to_string(::getpid()));
    return opened.ok() ? std::move(opened).value() : nullptr;
  }();
  std::uniform_int_distribution<int> pick(30000, 32700);
  for (int attempt = 0; attempt < 1000; ++attempt) {
    const int port = pick(rng);
    if (!PortBindable(port)) continue;
    if (leases == nullptr || leases->Acquire(port, port).ok()) return port;
  }
  return 0;
}

}  // namespace agentrt::testing
