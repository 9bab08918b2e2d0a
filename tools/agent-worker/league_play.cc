#include "tools/agent-worker/league_play.h"

#include "plan/config.h"

namespace agentrt::worker {
namespace {

nlohmann::json RefToJson(const SnapshotRef& ref) {
  return {{"topic", ref.topic},
          {"offset", ref.offset},
          {"step", ref.step},
          {"bus_incarnation", ref.bus_incarnation}};
}

}  // namespace

LeaguePlay::LeaguePlay(BusClient* bus, std::string agent, uint64_t incarnation,
                       std::chrono::milliseconds timeout)
    : bus_(bus), agent_(std::move(agent)), incarnation_(incarnation), timeout_(timeout) {}

void LeaguePlay::AddGames(int64_t wins, int64_t losses, int64_t draws) {
  wins_ += wins;
  losses_ += losses;
  draws_ += draws;
}

Result<nlohmann::json> LeaguePlay::Ask(nlohmann::json request) {
  AGENTRT_ASSIGN_OR_RETURN(BusReply reply, bus_->Request(kLeagueServiceName, request.dump(),
                                                         timeout_, "application/json"));
  nlohmann::json answer = nlohmann::json::parse(reply.payload, nullptr, false);
  if (!answer.is_object()) return Internal("the league answered with something not JSON");
  if (answer.contains("error"))
    return FailedPrecondition("the league refused: " + answer["error"].get<std::string>());
  return answer;
}

void LeaguePlay::EndMatch(const std::optional<SnapshotRef>& own, int64_t step) {
  if (current_ && wins_ + losses_ + draws_ > 0) {
    nlohmann::json result = {{"op", "result"},
                             {"agent", agent_},
                             {"incarnation", incarnation_},
                             {"seq", ++seq_},
                             {"opponent", current_->opponent},
                             {"opponent_snapshot", current_->snapshot_id},
                             {"step", step},
                             {"wins", wins_},
                             {"losses", losses_},
                             {"draws", draws_}};
    if (own) result["snapshot"] = RefToJson(*own);
    pending_.push_back(std::move(result));
  }
  wins_ = losses_ = draws_ = 0;
}

Status LeaguePlay::SendPending() {
  while (!pending_.empty()) {
    AGENTRT_ASSIGN_OR_RETURN(nlohmann::json answer, Ask(pending_.front()));
    (void)answer;  // applied, or a duplicate of one applied: acknowledged either way
    pending_.pop_front();
    ++acknowledged_;
  }
  return Status::Ok();
}

Result<LeagueAssignment> LeaguePlay::Next(const std::optional<SnapshotRef>& own, int64_t step) {
  EndMatch(own, step);
  AGENTRT_RETURN_IF_ERROR(SendPending());
  nlohmann::json request = {
      {"op", "match"}, {"agent", agent_}, {"incarnation", incarnation_}, {"match", match_ + 1}};
  if (own) request["snapshot"] = RefToJson(*own);
  // A snapshot handed out but no longer on the bus (the stream's retention
  // dropped it) is named in the next request, which takes it out of the
  // league's catalogue and picks again; a few times at most.
  constexpr int kPicks = 4;
  for (int pick = 1;; ++pick) {
    AGENTRT_ASSIGN_OR_RETURN(nlohmann::json answer, Ask(request));
    LeagueAssignment a;
    a.opponent = answer.value("opponent", "");
    a.snapshot_id = answer.value("snapshot_id", "");
    a.how = answer.value("how", "");
    if (a.opponent.empty()) return Internal("the league named no opponent");
    if (const auto& s = answer["snapshot"]; s.is_object()) {
      const std::string topic = s.value("topic", "");
      const int64_t offset = s.value("offset", int64_t{-1});
      // Only the broker's OUT_OF_RANGE says the message is gone; nothing
      // within the timeout (a slow link) is no reason to forget it.
      Result<std::vector<BusMessage>> messages = bus_->Fetch(topic, offset, 1, timeout_);
      if (!messages.ok() && messages.status().code() == StatusCode::kOutOfRange) {
        if (pick == kPicks) return messages.status();
        request["gone"] = {{"topic", topic}, {"offset", offset}};
        continue;
      }
      if (!messages.ok()) return messages.status();
      if (messages->empty() || messages->front().offset() != offset)
        return NotFound("snapshot " + a.snapshot_id + " (" + topic + " offset " +
                        std::to_string(offset) + ") did not come within " +
                        std::to_string(timeout_.count()) + " ms");
      AGENTRT_ASSIGN_OR_RETURN(PolicySnapshot policy, DecodeSnapshot(messages->front()));
      a.policy = std::move(policy);
    }
    ++match_;
    current_ = a;
    return a;
  }
}

Status LeaguePlay::Finish(const std::optional<SnapshotRef>& own, int64_t step) {
  EndMatch(own, step);
  return SendPending();
}

}  // namespace agentrt::worker
