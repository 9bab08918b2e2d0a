// What the bus tests share: starting a real broker on loopback, a client of
// an agent whose token comes from the same run secret, and reading a topic
// of a Broker in the test's own process.
#pragma once

#include <catch2/catch.hpp>
#include <chrono>
#include <cstdlib>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "comms/auth.h"
#include "comms/broker.h"
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

// Every message `agent` reads from `topic` of a Broker in this process,
// from `start` on (no wait); when `start` expired, *expired_earliest (if
// given) is the earliest offset held.
inline std::vector<bus::v1::Message> ReadTopic(Broker& b, const std::string& agent,
                                               const std::string& topic,
                                               const bus::v1::StartAt& start,
                                               int64_t* expired_earliest = nullptr) {
  bus::v1::SubscribeRequest req;
  req.set_topic(topic);
  *req.mutable_start() = start;
  req.set_incarnation(b.incarnation());
  bus::v1::SubscribeResponse::Header header;
  auto reader = b.OpenTopicReader(agent, req, &header);
  INFO(reader.status().ToString());
  REQUIRE(reader.ok());
  std::vector<bus::v1::Message> out;
  for (;;) {
    bus::v1::SubscribeResponse resp;
    int64_t earliest = -1;
    const auto outcome = b.Read(&reader.value(), std::chrono::milliseconds(0), &resp, &earliest);
    if (outcome == Broker::ReadOutcome::kExpired && expired_earliest) *expired_earliest = earliest;
    if (outcome != Broker::ReadOutcome::kMessages) break;
    for (const auto& m : resp.messages()) out.push_back(m);
  }
  return out;
}

}  // namespace agentrt::testing
