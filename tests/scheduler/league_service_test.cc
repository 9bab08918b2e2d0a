// The league service (scheduler/league_service.h) on a real gRPC bus over
// loopback: requests and replies, exactly-once results across a restart of
// the service, forged senders, a state file that cannot be read.
#include "scheduler/league_service.h"

#include <catch2/catch.hpp>
#include <chrono>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "comms/auth.h"
#include "comms/bus_client.h"
#include "comms/bus_server.h"
#include "plan/config.h"
#include "tests/common/temp_dir.h"

namespace agentrt {
namespace {

using namespace std::chrono_literals;
constexpr char kSecret[] = "league-test-secret";

LeagueConfig Config() {
  LeagueConfig c;
  c.members = {{"h0", "main", "pfsp", 0.0, {"r"}}, {"r", "main", "pfsp", 0.0, {"h0"}}};
  return c;
}

struct Bus {
  std::unique_ptr<BusServer> server;
  Bus() {
    BusAcl acl;
    acl.agents = {"h0", "r", kLeagueServiceName};
    BusServerOptions o;
    o.host = "127.0.0.1";
    auto s = BusServer::Start(o, kSecret, acl);
    REQUIRE(s.ok());
    server = std::move(*s);
  }
  std::string address() const { return "127.0.0.1:" + std::to_string(server->port()); }
  std::unique_ptr<BusClient> Client(const std::string& agent) const {
    auto c = BusClient::Connect(address(), {agent, DeriveAgentToken(kSecret, agent)});
    REQUIRE(c.ok());
    return std::move(*c);
  }
};

std::unique_ptr<LeagueService> StartService(const Bus& bus, const std::string& state_path) {
  LeagueServiceOptions o;
  o.bus_address = bus.address();
  o.credential = {kLeagueServiceName, DeriveAgentToken(kSecret, kLeagueServiceName)};
  o.state_path = state_path;
  auto s = LeagueService::Start(Config(), o);
  INFO(s.status().ToString());
  REQUIRE(s.ok());
  return std::move(*s);
}

nlohmann::json Ask(BusClient& client, const nlohmann::json& request) {
  auto reply = client.Request(kLeagueServiceName, request.dump(), 10s);
  INFO(reply.status().ToString());
  REQUIRE(reply.ok());
  CHECK(reply->replier == kLeagueServiceName);
  return nlohmann::json::parse(reply->payload);
}

nlohmann::json ResultOf(const std::string& agent, uint64_t seq) {
  return {{"op", "result"}, {"agent", agent},  {"incarnation", 0},
          {"seq", seq},     {"opponent", "r"}, {"opponent_snapshot", "r@initial"},
          {"wins", 3},      {"losses", 1},     {"draws", 0}};
}

TEST_CASE("the league answers matches, applies each result once, and survives its restart") {
  testing::TempDir tmp("agentrt-league");
  const std::string state = tmp.Path("league/state.json");
  Bus bus;
  auto h0 = bus.Client("h0");
  REQUIRE(h0->WaitForReady(10s).ok());
  double rating_after_one = 0;
  {
    auto service = StartService(bus, state);
    nlohmann::json match = Ask(*h0, {{"op", "match"}, {"agent", "h0"}, {"match", 1}});
    CHECK(match["opponent"] == "r");
    CHECK(match["snapshot"].is_null());  // r has published nothing yet
    CHECK(match["snapshot_id"] == "r@initial");
    CHECK(Ask(*h0, ResultOf("h0", 1))["applied"] == true);
    // The reply came after the commit: the file has it.
    auto committed = ReadLeagueState(Config(), state);
    REQUIRE(committed.ok());
    CHECK(committed->results_applied() == 1);
    rating_after_one = committed->Rating("h0");
    CHECK(rating_after_one > 1000);
    // A retry (its reply lost) is acknowledged and not applied again.
    nlohmann::json again = Ask(*h0, ResultOf("h0", 1));
    CHECK(again["applied"] == false);
    CHECK(again["why"].get<std::string>().find("applied already") != std::string::npos);
    // A result that names another agent than its sender is refused.
    nlohmann::json forged = Ask(*h0, ResultOf("r", 1));
    CHECK(forged.contains("error"));
    CHECK(service->refused() == 1);
    // A snapshot offered with a request enters the catalogue.
    nlohmann::json offer = {{"op", "match"},
                            {"agent", "h0"},
                            {"match", 2},
                            {"snapshot", {{"topic", "weights/h0"}, {"offset", 3}, {"step", 64}}}};
    Ask(*h0, offer);
    CHECK(service->Committed()["newest"]["h0"]["offset"] == 3);
    // A version of another agent's stream does not stand for the member.
    nlohmann::json foreign = offer;
    foreign["match"] = 3;
    foreign["snapshot"] = {{"topic", "weights/r"}, {"offset", 7}, {"step", 96}};
    Ask(*h0, foreign);
    CHECK(service->Committed()["newest"]["h0"]["offset"] == 3);
  }
  // A new service (agentctl resume, a requeue) starts from the committed state.
  auto service = StartService(bus, state);
  CHECK(service->Committed()["results_applied"] == 1);
  CHECK(service->Rating("h0") == Approx(rating_after_one));
  CHECK(Ask(*h0, ResultOf("h0", 1))["applied"] == false);
  CHECK(Ask(*h0, ResultOf("h0", 2))["applied"] == true);
  CHECK(service->Committed()["results_applied"] == 2);
  auto r = bus.Client("r");
  nlohmann::json r_match = Ask(*r, {{"op", "match"}, {"agent", "r"}, {"match", 1}});
  CHECK(r_match["opponent"] == "h0");
  CHECK(r_match["snapshot"]["offset"] == 3);  // h0's snapshot, offered before the restart
}

// A match request of `agent`, offering its newest snapshot (offset >= 0: the
// message at that offset of weights/<agent>, of broker incarnation
// `incarnation`, 0 unknown) and naming a snapshot it found gone (gone_topic).
nlohmann::json MatchRequest(const std::string& agent, uint64_t match, int64_t offset = -1,
                            int64_t step = 0, uint64_t incarnation = 0,
                            const std::string& gone_topic = "", int64_t gone_offset = -1) {
  nlohmann::json r = {{"op", "match"}, {"agent", agent}, {"match", match}};
  if (offset >= 0) {
    r["snapshot"] = {{"topic", "weights/" + agent},
                     {"offset", offset},
                     {"step", step},
                     {"bus_incarnation", incarnation}};
  }
  if (!gone_topic.empty()) r["gone"] = {{"topic", gone_topic}, {"offset", gone_offset}};
  return r;
}

TEST_CASE("a snapshot an agent could not fetch leaves the catalogue; a new broker empties it") {
  testing::TempDir tmp("agentrt-league");
  const std::string state = tmp.Path("league/state.json");
  uint64_t old_incarnation = 0;
  {
    Bus bus;
    old_incarnation = bus.server->incarnation();
    auto service = StartService(bus, state);
    auto h0 = bus.Client("h0");
    auto r = bus.Client("r");
    REQUIRE(r->WaitForReady(10s).ok());
    Ask(*r, MatchRequest("r", 1, 5, 0));
    nlohmann::json first = Ask(*h0, MatchRequest("h0", 1));
    REQUIRE(first["snapshot_id"] == "r@0");
    // Its own snapshot, or another member's that is no opponent of it, an
    // agent cannot take out.
    Ask(*h0, MatchRequest("h0", 2, -1, 0, 0, "weights/h0", 5));
    CHECK(service->refused() == 1);
    CHECK(service->Committed()["frozen"]["r"].size() == 1);
    // h0 could not fetch r@0: named in its next request, it is gone before the pick.
    nlohmann::json again = Ask(*h0, MatchRequest("h0", 1, -1, 0, 0, "weights/r", 5));
    CHECK(again["snapshot_id"] == "r@initial");
    CHECK(again["snapshot"].is_null());
    CHECK(service->Committed()["frozen"]["r"].empty());
    CHECK(service->Committed()["newest"].empty());
    CHECK(service->refused() == 1);
    // A newer one offered: it plays.
    Ask(*r, MatchRequest("r", 2, 9, 40));
    CHECK(Ask(*h0, MatchRequest("h0", 3))["snapshot_id"] == "r@40");
  }
  // A broker without the old log (another incarnation: durability memory):
  // offset 9 of weights/r there is another message, or none.
  Bus fresh;
  auto service = StartService(fresh, state);
  auto h0 = fresh.Client("h0");
  REQUIRE(h0->WaitForReady(10s).ok());
  nlohmann::json match = Ask(*h0, MatchRequest("h0", 4));
  CHECK(match["snapshot_id"] == "r@initial");
  CHECK(service->Committed()["newest"].empty());
  CHECK(service->Committed()["inbox_incarnation"] == fresh.server->incarnation());
  // A member's newest of the old log is ignored; one of the new log stands.
  auto r = fresh.Client("r");
  Ask(*r, MatchRequest("r", 3, 9, 40, old_incarnation));
  CHECK(service->Committed()["newest"].empty());
  Ask(*r, MatchRequest("r", 4, 0, 40, fresh.server->incarnation()));
  CHECK(service->Committed()["newest"]["r"]["offset"] == 0);
}

TEST_CASE("a league state file that cannot be read back stops the service with its path") {
  testing::TempDir tmp("agentrt-league");
  const std::string state = tmp.Path("state.json");
  std::ofstream(state) << "{\"format\": 1, \"ratings\": ";  // torn by hand
  Bus bus;
  LeagueServiceOptions o;
  o.bus_address = bus.address();
  o.credential = {kLeagueServiceName, DeriveAgentToken(kSecret, kLeagueServiceName)};
  o.state_path = state;
  auto s = LeagueService::Start(Config(), o);
  REQUIRE_FALSE(s.ok());
  CHECK_THAT(s.status().message(), Catch::Matchers::Contains(state));
}

}  // namespace
}  // namespace agentrt
