// A port for a test's rendezvous: below the kernel's ephemeral range (which
// starts at 32768), so no outgoing connection of a parallel test takes it
// between the probe and its use; above agentctl's default port range
// (cluster.ports 20000-29999), which parallel demo runs lease; and bindable now.
#pragma once

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <random>

namespace agentrt::testing {

inline int FreeTestPort() {
  static std::mt19937 rng(std::random_device{}());
  std::uniform_int_distribution<int> pick(30000, 32700);
  for (int attempt = 0; attempt < 1000; ++attempt) {
    const int port = pick(rng);
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_ANY);
    addr.sin_port = htons(static_cast<uint16_t>(port));
    const bool free = ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
    ::close(fd);
    if (free) return port;
  }
  return 0;
}

}  // namespace agentrt::testing
