// agent-worker's league play (tools/agent-worker/league_play.h) against the
// real league service on a real gRPC bus over loopback: a snapshot the league
// hands out after the stream's retention dropped it.
#include <catch2/catch.hpp>
#include <chrono>
#include <string>

#include "comms/auth.h"
#include "comms/bus_client.h"
#include "comms/bus_server.h"
#include "comms/weight_stream.h"
#include "plan/config.h"
#include "scheduler/league_service.h"
#include "tests/common/temp_dir.h"
#include "tools/agent-worker/league_play.h"

namespace agentrt::worker {
namespace {

using namespace std::chrono_literals;
constexpr char kSecret[] = "league-play-test-secret";

TEST_CASE("a snapshot dropped by the stream's retention is reported and another one plays") {
  testing::TempDir tmp("agentrt-league-play");
  BusAcl acl;
  acl.agents = {"h0", "r", kLeagueServiceName};
  // r's stream keeps one message: a newer one drops the one before.
  acl.channels = {{WeightStreamTopic("r"), {"r"}, {"h0"}, 1}};
  BusServerOptions o;
  o.host = "127.0.0.1";
  auto server = BusServer::Start(o, kSecret, acl);
  REQUIRE(server.ok());
  const std::string address = "127.0.0.1:" + std::to_string((*server)->port());
  auto client = [&](const std::string& agent) {
    auto c = BusClient::Connect(address, {agent, DeriveAgentToken(kSecret, agent)});
    REQUIRE(c.ok());
    REQUIRE((*c)->WaitForReady(10s).ok());
    return std::move(*c);
  };
  LeagueConfig config;
  config.members = {{"h0", "main", "pfsp", 0.0, {"r"}}, {"r", "main", "pfsp", 0.0, {"h0"}}};
  LeagueServiceOptions so;
  so.bus_address = address;
  so.credential = {kLeagueServiceName, DeriveAgentToken(kSecret, kLeagueServiceName)};
  so.state_path = tmp.Path("league/state.json");
  auto service = LeagueService::Start(config, so);
  REQUIRE(service.ok());

  auto r = client("r");
  auto h0 = client("h0");
  for (int i = 0; i < 2; ++i) REQUIRE(r->Publish(WeightStreamTopic("r"), "version").ok());
  // r offers the message at offset 0, no longer held: the league freezes it
  // and hands it to h0 first.
  LeaguePlay r_play(r.get(), "r", 0, 2s);
  REQUIRE(r_play.Next(SnapshotRef{WeightStreamTopic("r"), 0, 0}, 0).ok());
  REQUIRE((*service)->Committed()["frozen"]["r"].size() == 1);

  LeaguePlay play(h0.get(), "h0", 0, 2s);
  auto a = play.Next(std::nullopt, 0);
  INFO(a.status().ToString());
  REQUIRE(a.ok());
  CHECK(a->opponent == "r");
  CHECK(a->snapshot_id == "r@initial");  // r@0 reported gone: nothing else is catalogued
  CHECK_FALSE(a->policy.has_value());
  CHECK(play.matches() == 1);
  CHECK((*service)->Committed()["frozen"]["r"].empty());
  CHECK((*service)->refused() == 0);
}

}  // namespace
}  // namespace agentrt::worker
