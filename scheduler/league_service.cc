#include "scheduler/league_service.h"

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>

#include "common/clock.h"
#include "common/file_util.h"
#include "comms/telemetry.h"
#include "comms/weight_stream.h"

namespace agentrt {
namespace {

using json = nlohmann::json;

std::optional<LeagueSnapshot> OfferOf(const std::string& agent, const json& request,
                                      uint64_t bus_incarnation) {
  const auto it = request.find("snapshot");
  if (it == request.end() || !it->is_object()) return std::nullopt;
  // A version of another log than the bus's (a broker that came back without
  // its log): its offset names another message, or none.
  const uint64_t from = it->value("bus_incarnation", uint64_t{0});
  if (from != 0 && from != bus_incarnation) return std::nullopt;
  LeagueSnapshot s;
  s.agent = agent;
  s.topic = it->value("topic", "");
  s.offset = it->value("offset", int64_t{-1});
  s.step = it->value("step", int64_t{0});
  // Only a version of the member's own weight stream (the broker let only
  // the member publish there) stands for the member.
  if (s.topic != WeightStreamTopic(agent) || s.offset < 0) return std::nullopt;
  return s;
}

}  // namespace

Result<LeagueState> ReadLeagueState(const LeagueConfig& config, const std::string& path) {
  AGENTRT_ASSIGN_OR_RETURN(std::string text, ReadWholeFile(path, size_t{256} << 20));
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return DataLoss("league state " + path + ": not valid JSON");
  Result<LeagueState> state = LeagueState::FromJson(config, j);
  if (!state.ok()) return state.status().WithContext("league state " + path);
  return state;
}

Result<std::unique_ptr<LeagueService>> LeagueService::Start(const LeagueConfig& config,
                                                            LeagueServiceOptions options) {
  Result<LeagueState> loaded = ReadLeagueState(config, options.state_path);
  if (!loaded.ok() && loaded.status().code() != StatusCode::kNotFound) return loaded.status();
  const bool resumed = loaded.ok();
  std::unique_ptr<LeagueService> service(
      new LeagueService(resumed ? std::move(*loaded) : LeagueState(config), std::move(options)));
  std::error_code ec;
  std::filesystem::create_directories(
      std::filesystem::path(service->options_.state_path).parent_path(), ec);
  service->committed_ = service->state_.ToJson();
  service->ratings_ = service->state_.ratings();
  AGENTRT_ASSIGN_OR_RETURN(
      service->bus_, BusClient::Connect(service->options_.bus_address, service->options_.credential,
                                        service->options_.bus));
  LeagueService* self = service.get();
  const StartAt from =
      resumed ? StartAt::Offset(service->state_.inbox_offset, service->state_.inbox_incarnation)
              : StartAt::Earliest();
  AGENTRT_ASSIGN_OR_RETURN(
      auto id, service->bus_->Receive(from, [self](const BusMessage& m) { self->OnMessage(m); }));
  (void)id;
  return service;
}

LeagueService::~LeagueService() { bus_.reset(); }  // ends the inbox stream first

json LeagueService::Committed() const {
  std::lock_guard<std::mutex> lock(mu_);
  return committed_;
}

double LeagueService::Rating(const std::string& agent) const {
  std::lock_guard<std::mutex> lock(ratings_mu_);
  auto it = ratings_.find(agent);
  return it == ratings_.end() ? state_.config().initial_rating : it->second;
}

std::string LeagueService::last_error() const {
  std::lock_guard<std::mutex> lock(mu_);
  return last_error_;
}

void LeagueService::Refuse(const std::string& why) {
  refused_.fetch_add(1);
  last_error_ = why;
}

Status LeagueService::Commit() {
  json state = state_.ToJson();
  Status s =
      WriteFileAtomic(options_.state_path, state.dump() + "\n", {.mode = 0644, .sync_dir = true});
  if (!s.ok()) {
    commit_failures_.fetch_add(1);
    last_error_ = s.ToString();
    return s;
  }
  committed_ = std::move(state);
  std::lock_guard<std::mutex> lock(ratings_mu_);
  ratings_ = state_.ratings();
  return Status::Ok();
}

json LeagueService::Handle(const BusMessage& m, const json& request, uint64_t bus_incarnation,
                           bool* changed) {
  const std::string agent = request.value("agent", "");
  if (agent != m.publisher()) {
    Refuse(fmt::format("a request from {} names agent '{}'", m.publisher(), agent));
    return {{"error", "the request's agent must be its sender, " + m.publisher()}};
  }
  if (auto offer = OfferOf(agent, request, bus_incarnation))
    *changed = state_.Offer(*offer) || *changed;
  const std::string op = request.value("op", "");
  if (op == "match") {
    // A snapshot the league handed this agent and it could not fetch: the
    // stream's retention dropped it. It leaves the catalogue, so that the
    // pick below, and every later one, names another. The agent's word, as
    // its results are; only an opponent's stream can be named.
    if (const auto gone = request.find("gone"); gone != request.end() && gone->is_object()) {
      const std::string topic = gone->value("topic", "");
      const LeagueMember* member = state_.config().FindMember(agent);
      const bool opponent =
          member != nullptr &&
          std::any_of(member->opponents.begin(), member->opponents.end(),
                      [&](const std::string& o) { return WeightStreamTopic(o) == topic; });
      if (opponent) {
        *changed = state_.Forget(topic, gone->value("offset", int64_t{-1})) || *changed;
      } else {
        Refuse(fmt::format("agent {} reported a snapshot of '{}' gone, not an opponent's stream",
                           agent, topic));
      }
    }
    LeagueMatchRequest r{agent, request.value("incarnation", uint64_t{0}),
                         request.value("match", uint64_t{0})};
    Result<LeagueMatch> match = state_.Pick(r);
    if (!match.ok()) {
      Refuse(match.status().ToString());
      return {{"error", match.status().message()}};
    }
    json snapshot = nullptr;
    if (match->snapshot) {
      snapshot = {{"topic", match->snapshot->topic},
                  {"offset", match->snapshot->offset},
                  {"step", match->snapshot->step}};
    }
    return {{"opponent", match->opponent},
            {"snapshot", snapshot},
            {"snapshot_id", match->SnapshotId()},
            {"how", match->how}};
  }
  if (op == "result") {
    LeagueResult r;
    r.agent = agent;
    r.incarnation = request.value("incarnation", uint64_t{0});
    r.seq = request.value("seq", uint64_t{0});
    r.opponent = request.value("opponent", "");
    r.opponent_snapshot = request.value("opponent_snapshot", "");
    r.step = request.value("step", int64_t{0});
    r.wins = request.value("wins", int64_t{0});
    r.losses = request.value("losses", int64_t{0});
    r.draws = request.value("draws", int64_t{0});
    std::string why;
    if (state_.Apply(r, UnixTimeSeconds(), &why)) {
      *changed = true;
      return {{"applied", true}};
    }
    // A duplicate is an answer, not a refusal: the agent retried after a lost reply.
    if (why.find("applied already") == std::string::npos) Refuse(why);
    return {{"applied", false}, {"why", why}};
  }
  Refuse(fmt::format("agent {} sent an unknown op '{}'", agent, op));
  return {{"error", "unknown op '" + op + "'; expected match or result"}};
}

void LeagueService::OnMessage(const BusMessage& m) {
  json reply;
  {
    std::lock_guard<std::mutex> lock(mu_);
    json request = json::parse(m.payload(), nullptr, /*allow_exceptions=*/false);
    LeagueState before = state_;  // what stands if this request cannot be committed
    // A broker that came back without its log (a new incarnation) holds none
    // of the catalogue's snapshots, and its offsets name other messages. The
    // new incarnation is committed with the emptied catalogue, or neither.
    const uint64_t incarnation = bus_->SubscriptionIncarnation();
    const bool voided = state_.inbox_incarnation != 0 && incarnation != state_.inbox_incarnation;
    if (voided) state_.ForgetAll();
    bool changed = voided;
    if (request.is_discarded() || !request.is_object()) {
      Refuse(fmt::format("a request from {} is not a JSON object", m.publisher()));
      reply = {{"error", "expected a JSON object"}};
    } else {
      try {
        reply = Handle(m, request, incarnation, &changed);
      } catch (const json::exception& e) {
        // A field of the wrong type (a number as a string...): refused, nothing changed.
        state_ = before;
        if (voided) state_.ForgetAll();
        changed = voided;
        Refuse(fmt::format("a request from {} has a field of the wrong type: {}", m.publisher(),
                           e.what()));
        reply = {{"error", std::string("a field has the wrong type: ") + e.what()}};
      }
    }
    state_.inbox_offset = m.offset() + 1;
    state_.inbox_incarnation = incarnation;
    if (changed) {
      if (Status s = Commit(); !s.ok()) {
        // Not durable: nothing of it stands, and the agent, told so, retries.
        state_ = std::move(before);
        reply = {{"error", "the league could not commit its state: " + s.ToString()}};
      }
    }
  }
  if (m.request_id() != 0)
    bus_->Reply(m.request_id(), reply.dump(), "application/json").IgnoreError();
}

}  // namespace agentrt
