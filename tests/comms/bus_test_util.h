// What the tests of a real broker on loopback share: starting one, and a
// client of an agent whose token comes from the same run secret.
#pragma once

#include <catch2/catch.hpp>
#include <cstdlib>
#include <memory>
#include <string>
#include <utility>

#include "comms/auth.h"
#include "comms/bus_client.h"
#include "comms/bus_server.h"

namespace agentrt::testing {

inline std::unique_ptr<BusServer> StartBus(BusServerOptions opts, const std::string& secret,
                                           BusAcl acl) {
  opts.host = "127.0.0.1";
  auto s = BusServer::Start(opts, secret, std::move(acl));
  INFO(s.status().ToString());
  REQUIRE(s.ok());
  return std::move(s).value();
}

inline std::unique_ptr<BusClient> ConnectBus(const std::string& address, const std::string& secret,
                                             const std::string& agent, BusClientOptions opts = {}) {
  auto c = BusClient::Connect(address, Credential{agent, DeriveAgentToken(secret, agent)},
                              std::move(opts));
  REQUIRE(c.ok());
  return std::move(c).value();
}

// A client as a process on another node than the broker's has it: nothing
// of the broker's files is read, every byte is streamed.
inline std::unique_ptr<BusClient> ConnectRemoteBus(const std::string& address,
                                                   const std::string& secret,
                                                   const std::string& agent) {
  struct Restore {  // the variable as it was, however this returns
    const char* was = std::getenv("AGENTRT_BUS_LOCAL_FILES");
    std::string value = was != nullptr ? was : "";
    bool set = was != nullptr;
    ~Restore() {
      if (set) {
        ::setenv("AGENTRT_BUS_LOCAL_FILES", value.c_str(), 1);
      } else {
        ::unsetenv("AGENTRT_BUS_LOCAL_FILES");
      }
    }
  } restore;
  ::setenv("AGENTRT_BUS_LOCAL_FILES", "0", 1);
  return ConnectBus(address, secret, agent);
}

}  // namespace agentrt::testing
