// The league's state and rules, pure logic: no bus, no files, no
// clock (times are passed in). The league service (scheduler/league_service.h)
// drives it from the bus and commits it to RUN_DIR/league/state.json.
//
// What it keeps:
//   - the catalogue: per member, its newest policy snapshot (a bus reference:
//     topic + offset, with the agent's env step) and up to keep_snapshots
//     frozen ones (one frozen every freeze_every_steps of the agent's steps);
//   - the payoff table: games won/lost/drawn per (member, opponent member) and
//     per (member, opponent snapshot), the latter for PFSP;
//   - Elo ratings per member, and their history;
//   - which results were applied: a result carries (agent, incarnation, seq),
//     an agent sends them in order and waits for each to be acknowledged, so
//     the highest seq per (agent, incarnation) is enough to apply each once.
//
// Matchmaking is a pure function of the state, the league seed and the
// request (agent, incarnation, match number): the same state and request give
// the same opponent, whatever else runs.
//
// Elo: a match of n games with score S (wins + draws/2) against an opponent
// rated Ro moves the member by elo_k * (S/n - E), E = 1 / (1 + 10^((Ro - R)/400)),
// and the opponent agent by the opposite (zero-sum, one match = one step,
// however many games it had).
//
// Thread-safety: none; the service serialises calls.
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"
#include "plan/config.h"
#include "plan/records.h"

namespace agentrt {

// A policy snapshot the league can hand out: where its bytes are on the bus.
struct LeagueSnapshot {
  std::string agent;
  int64_t step = 0;     // the agent's env step when it was published
  std::string topic;    // its agent's weight stream, weights/<agent>
  int64_t offset = -1;  // its message in that topic: version offset + 1
  double rating = 0;    // the agent's rating when the snapshot was taken (frozen ones)
  std::string Id() const { return agent + "@" + std::to_string(step); }
};

struct LeagueResult {
  std::string agent;  // who reports: the member that played
  uint64_t incarnation = 0;
  uint64_t seq = 0;  // 1, 2, ... per (agent, incarnation)
  std::string opponent;
  std::string opponent_snapshot;  // LeagueSnapshot::Id(), or "<agent>@initial" (no snapshot yet)
  int64_t step = 0;               // the reporter's env step at the end of the match
  int64_t wins = 0;
  int64_t losses = 0;
  int64_t draws = 0;
  int64_t games() const { return wins + losses + draws; }
};

struct LeagueMatchRequest {
  std::string agent;
  uint64_t incarnation = 0;
  uint64_t match = 0;  // the agent's match counter in this incarnation
};

// The opponent of one match: an agent, and the snapshot that plays it (none:
// the opponent has published nothing yet; its seat plays the initial policy).
struct LeagueMatch {
  std::string opponent;
  std::optional<LeagueSnapshot> snapshot;
  std::string how;  // "newest", "uniform", "pfsp"
  std::string SnapshotId() const { return snapshot ? snapshot->Id() : opponent + "@initial"; }
};

struct PayoffCell {
  int64_t wins = 0;
  int64_t losses = 0;
  int64_t draws = 0;
  int64_t games() const { return wins + losses + draws; }
};

class LeagueState {
 public:
  explicit LeagueState(LeagueConfig config);

  // The member's newest published snapshot; frozen into the catalogue when
  // its step has reached the member's next freeze step. An offer of an older
  // message (a lower offset) than the newest known is ignored. Returns whether
  // anything changed.
  bool Offer(const LeagueSnapshot& snapshot);

  // Takes the snapshot whose message is (topic, offset) out of the
  // catalogue, frozen and newest alike: the message is no longer on the bus
  // (the stream's retention dropped it). By message, not by id: an id's step
  // can come again (a PBT exploit, a restore). Its payoff rows stay. Returns
  // whether anything changed.
  bool Forget(const std::string& topic, int64_t offset);
  // Takes every snapshot out of the catalogue: the bus's log that held them
  // is gone (a broker restarted without it, a new incarnation, whose offsets
  // name other messages). Ratings, payoff and freeze steps stay.
  bool ForgetAll();

  // Applies a result once: false (and nothing changes) for a duplicate or an
  // unknown member/opponent (then `why` says which). `unix_s` stamps history.
  bool Apply(const LeagueResult& result, double unix_s, std::string* why);

  // The opponent of `request`'s next match, by the member's matchmaking.
  Result<LeagueMatch> Pick(const LeagueMatchRequest& request) const;

  // PFSP's win probability of `agent` against a snapshot id: (wins + draws/2 +
  // 1/2) / (games + 1), 1/2 before any game.
  double WinRate(const std::string& agent, const std::string& snapshot_id) const;

  const LeagueConfig& config() const { return config_; }
  const std::map<std::string, double>& ratings() const { return ratings_; }
  double Rating(const std::string& agent) const;
  const std::map<std::string, std::map<std::string, PayoffCell>>& payoff() const { return payoff_; }
  const std::vector<LeagueSnapshot>& frozen(const std::string& agent) const;
  int64_t results_applied() const { return results_applied_; }

  // Where the service's inbox resumes (stored with the state).
  int64_t inbox_offset = 0;
  uint64_t inbox_incarnation = 0;

  // The whole state as JSON (state.json); FromJson checks it against `config`
  // (a member the config no longer has is an error naming it).
  nlohmann::json ToJson() const;
  static Result<LeagueState> FromJson(LeagueConfig config, const nlohmann::json& json);

 private:
  std::vector<std::pair<std::string, double>> Candidates(const LeagueMember& member,
                                                         bool newest_only) const;

  LeagueConfig config_;
  std::map<std::string, double> ratings_;
  std::map<std::string, LeagueSnapshot> newest_;
  std::map<std::string, std::vector<LeagueSnapshot>> frozen_;  // oldest first
  std::map<std::string, int64_t> next_freeze_;
  std::map<std::string, std::map<std::string, PayoffCell>> payoff_;           // agent -> opponent
  std::map<std::string, std::map<std::string, PayoffCell>> snapshot_payoff_;  // agent -> snapshot
  std::map<std::string, uint64_t> applied_;  // "<agent>/<incarnation>" -> highest seq
  int64_t results_applied_ = 0;
  // Ratings after each applied result (time, results so far, ratings);
  // thinned to every other point when it reaches kMaxHistory.
  nlohmann::json history_ = nlohmann::json::array();
  static constexpr size_t kMaxHistory = 2000;
};

// `agentctl league` / `agentctl status`: the ratings table (best first) with
// roles, games and frozen snapshots, the payoff table (wins-losses-draws of
// each row against each column) and the PBT lineage. `state` may be null (a
// run with PBT and no league).
std::string FormatLeague(const LeagueState* state, const std::vector<LineageRecord>& lineage);
// One PBT exploit of the lineage: "carts at step 30720: slow (20.4) <- cart-2
// (413.3) step 25600: lr 1e-06 -> 0.0006".
std::string FormatLineageLine(const LineageRecord& exploit);
// One line per member, best first ("hunter-0 1308 (main)"), for the status view.
std::string FormatRatingsLine(const LeagueState& state);

}  // namespace agentrt
