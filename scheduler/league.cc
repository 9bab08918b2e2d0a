#include "scheduler/league.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <functional>

#include "envs/rng.h"

namespace agentrt {
namespace {

using json = nlohmann::json;

std::string AppliedKey(const std::string& agent, uint64_t incarnation) {
  return agent + "/" + std::to_string(incarnation);
}

json SnapshotToJson(const LeagueSnapshot& s) {
  return {{"agent", s.agent},
          {"step", s.step},
          {"topic", s.topic},
          {"offset", s.offset},
          {"rating", s.rating}};
}

LeagueSnapshot SnapshotFromJson(const json& j) {
  LeagueSnapshot s;
  s.agent = j.at("agent").get<std::string>();
  s.step = j.at("step").get<int64_t>();
  s.topic = j.at("topic").get<std::string>();
  s.offset = j.at("offset").get<int64_t>();
  s.rating = j.value("rating", 0.0);
  return s;
}

json CellsToJson(const std::map<std::string, std::map<std::string, PayoffCell>>& cells) {
  json out = json::object();
  for (const auto& [agent, row] : cells) {
    json r = json::object();
    for (const auto& [other, c] : row) r[other] = {c.wins, c.losses, c.draws};
    out[agent] = std::move(r);
  }
  return out;
}

std::map<std::string, std::map<std::string, PayoffCell>> CellsFromJson(const json& j) {
  std::map<std::string, std::map<std::string, PayoffCell>> out;
  for (const auto& [agent, row] : j.items()) {
    for (const auto& [other, c] : row.items()) {
      out[agent][other] = {c.at(0).get<int64_t>(), c.at(1).get<int64_t>(), c.at(2).get<int64_t>()};
    }
  }
  return out;
}

}  // namespace

LeagueState::LeagueState(LeagueConfig config) : config_(std::move(config)) {
  for (const LeagueMember& m : config_.members) {
    ratings_[m.agent] = config_.initial_rating;
    next_freeze_[m.agent] = 0;  // the first snapshot offered is frozen
  }
}

double LeagueState::Rating(const std::string& agent) const {
  auto it = ratings_.find(agent);
  return it == ratings_.end() ? config_.initial_rating : it->second;
}

const std::vector<LeagueSnapshot>& LeagueState::frozen(const std::string& agent) const {
  static const std::vector<LeagueSnapshot> kNone;
  auto it = frozen_.find(agent);
  return it == frozen_.end() ? kNone : it->second;
}

bool LeagueState::Offer(const LeagueSnapshot& snapshot) {
  if (config_.FindMember(snapshot.agent) == nullptr || snapshot.offset < 0) return false;
  // Offsets only grow within a topic; steps may go back (a PBT exploit, a
  // restore from an older checkpoint), and the newest policy is the newest message.
  auto newest = newest_.find(snapshot.agent);
  if (newest != newest_.end() && newest->second.topic == snapshot.topic &&
      newest->second.offset >= snapshot.offset)
    return false;
  LeagueSnapshot s = snapshot;
  s.rating = Rating(s.agent);
  newest_[s.agent] = s;
  int64_t& next = next_freeze_[s.agent];
  if (s.step >= next) {
    std::vector<LeagueSnapshot>& frozen = frozen_[s.agent];
    frozen.push_back(s);
    if (static_cast<int>(frozen.size()) > config_.keep_snapshots) frozen.erase(frozen.begin());
    next = (s.step / config_.freeze_every_steps + 1) * config_.freeze_every_steps;
  }
  return true;
}

bool LeagueState::Forget(const std::string& topic, int64_t offset) {
  auto same = [&](const LeagueSnapshot& s) { return s.topic == topic && s.offset == offset; };
  bool changed = false;
  for (auto& [agent, list] : frozen_) changed |= std::erase_if(list, same) > 0;
  changed |= std::erase_if(newest_, [&](const auto& entry) { return same(entry.second); }) > 0;
  return changed;
}

bool LeagueState::ForgetAll() {
  const bool changed = !newest_.empty() || !frozen_.empty();
  newest_.clear();
  frozen_.clear();
  return changed;
}

bool LeagueState::Apply(const LeagueResult& r, double unix_s, std::string* why) {
  const LeagueMember* member = config_.FindMember(r.agent);
  if (member == nullptr) {
    *why = "agent " + r.agent + " is not a league member";
    return false;
  }
  if (std::find(member->opponents.begin(), member->opponents.end(), r.opponent) ==
      member->opponents.end()) {
    *why = fmt::format("agent {} reported a match against {}, not one of its opponents", r.agent,
                       r.opponent);
    return false;
  }
  if (r.wins < 0 || r.losses < 0 || r.draws < 0 || r.games() == 0) {
    *why = fmt::format("agent {} reported a match of {} wins, {} losses, {} draws", r.agent, r.wins,
                       r.losses, r.draws);
    return false;
  }
  if (r.opponent == r.agent) {
    *why = "agent " + r.agent + " reported a match against itself";
    return false;
  }
  uint64_t& seen = applied_[AppliedKey(r.agent, r.incarnation)];
  if (r.seq <= seen) {
    *why = fmt::format("result {}/{}/{} was applied already", r.agent, r.incarnation, r.seq);
    return false;
  }
  seen = r.seq;
  ++results_applied_;
  for (auto* table :
       {&payoff_[r.agent][r.opponent], &snapshot_payoff_[r.agent][r.opponent_snapshot]}) {
    table->wins += r.wins;
    table->losses += r.losses;
    table->draws += r.draws;
  }
  const double ra = Rating(r.agent);
  const double ro = Rating(r.opponent);
  const double expected = 1.0 / (1.0 + std::pow(10.0, (ro - ra) / 400.0));
  const double score =
      (static_cast<double>(r.wins) + 0.5 * static_cast<double>(r.draws)) / r.games();
  const double delta = config_.elo_k * (score - expected);
  ratings_[r.agent] = ra + delta;
  ratings_[r.opponent] = ro - delta;
  if (history_.size() >= kMaxHistory) {
    json thinned = json::array();
    for (size_t i = 0; i < history_.size(); i += 2) thinned.push_back(history_[i]);
    history_ = std::move(thinned);
  }
  history_.push_back({{"time", unix_s}, {"results", results_applied_}, {"ratings", ratings_}});
  return true;
}

double LeagueState::WinRate(const std::string& agent, const std::string& snapshot_id) const {
  PayoffCell c;
  if (auto row = snapshot_payoff_.find(agent); row != snapshot_payoff_.end()) {
    if (auto cell = row->second.find(snapshot_id); cell != row->second.end()) c = cell->second;
  }
  return (static_cast<double>(c.wins) + 0.5 * static_cast<double>(c.draws) + 0.5) /
         (static_cast<double>(c.games()) + 1.0);
}

Result<LeagueMatch> LeagueState::Pick(const LeagueMatchRequest& request) const {
  const LeagueMember* member = config_.FindMember(request.agent);
  if (member == nullptr) return NotFound("agent " + request.agent + " is not a league member");
  // One engine per request, seeded by the league seed and the request alone.
  Rng rng =
      Rng::FromParts({static_cast<uint64_t>(config_.seed), std::hash<std::string>{}(request.agent),
                      request.incarnation, request.match});
  const double u = rng.Uniform();
  const bool newest = member->matchmaking == "self" || u < member->newest_share;
  LeagueMatch match;
  // Candidates: (opponent, snapshot or none).
  struct Candidate {
    std::string opponent;
    std::optional<LeagueSnapshot> snapshot;
    double weight = 1.0;
  };
  std::vector<Candidate> candidates;
  if (!newest) {
    for (const std::string& opponent : member->opponents) {
      for (const LeagueSnapshot& s : frozen(opponent)) {
        double weight = 1.0;
        if (member->matchmaking == "pfsp") {
          const double p = WinRate(request.agent, s.Id());
          weight = (1.0 - p) * (1.0 - p);
        }
        candidates.push_back({opponent, s, weight});
      }
    }
    match.how = member->matchmaking;
  }
  if (candidates.empty()) {
    for (const std::string& opponent : member->opponents) {
      auto it = newest_.find(opponent);
      candidates.push_back(
          {opponent, it == newest_.end() ? std::nullopt : std::optional<LeagueSnapshot>(it->second),
           1.0});
    }
    match.how = "newest";
  }
  double total = 0;
  for (const Candidate& c : candidates) total += c.weight;
  if (!(total > 0)) {
    for (Candidate& c : candidates) c.weight = 1.0;
    total = static_cast<double>(candidates.size());
  }
  double x = rng.Uniform() * total;
  size_t pick = candidates.size() - 1;
  for (size_t i = 0; i < candidates.size(); ++i) {
    if (x < candidates[i].weight) {
      pick = i;
      break;
    }
    x -= candidates[i].weight;
  }
  match.opponent = candidates[pick].opponent;
  match.snapshot = candidates[pick].snapshot;
  return match;
}

json LeagueState::ToJson() const {
  json frozen = json::object();
  for (const auto& [agent, list] : frozen_) {
    json l = json::array();
    for (const LeagueSnapshot& s : list) l.push_back(SnapshotToJson(s));
    frozen[agent] = std::move(l);
  }
  json newest = json::object();
  for (const auto& [agent, s] : newest_) newest[agent] = SnapshotToJson(s);
  return {{"format", 1},
          {"results_applied", results_applied_},
          {"inbox_offset", inbox_offset},
          {"inbox_incarnation", inbox_incarnation},
          {"ratings", ratings_},
          {"payoff", CellsToJson(payoff_)},
          {"snapshot_payoff", CellsToJson(snapshot_payoff_)},
          {"newest", std::move(newest)},
          {"frozen", std::move(frozen)},
          {"next_freeze", next_freeze_},
          {"applied", applied_},
          {"history", history_}};
}

Result<LeagueState> LeagueState::FromJson(LeagueConfig config, const json& j) {
  LeagueState state(std::move(config));
  try {
    if (j.at("format").get<int>() != 1)
      return InvalidArgument(
          fmt::format("format {} (this agentrt reads 1)", j.at("format").dump()));
    state.results_applied_ = j.at("results_applied").get<int64_t>();
    state.inbox_offset = j.at("inbox_offset").get<int64_t>();
    state.inbox_incarnation = j.at("inbox_incarnation").get<uint64_t>();
    for (const auto& [agent, rating] : j.at("ratings").items()) {
      if (state.config_.FindMember(agent) == nullptr)
        return InvalidArgument("member " + agent + " is not in the league's config any more");
      state.ratings_[agent] = rating.get<double>();
    }
    state.payoff_ = CellsFromJson(j.at("payoff"));
    state.snapshot_payoff_ = CellsFromJson(j.at("snapshot_payoff"));
    for (const auto& [agent, s] : j.at("newest").items())
      state.newest_[agent] = SnapshotFromJson(s);
    for (const auto& [agent, list] : j.at("frozen").items()) {
      for (const json& s : list) state.frozen_[agent].push_back(SnapshotFromJson(s));
    }
    for (const auto& [agent, next] : j.at("next_freeze").items())
      state.next_freeze_[agent] = next.get<int64_t>();
    state.applied_ = j.at("applied").get<std::map<std::string, uint64_t>>();
    state.history_ = j.at("history");
    if (!state.history_.is_array()) return InvalidArgument("history: expected an array");
  } catch (const json::exception& e) {
    return InvalidArgument(std::string("not a league state: ") + e.what());
  }
  return state;
}

namespace {

std::vector<std::pair<double, std::string>> Ranked(const LeagueState& state) {
  std::vector<std::pair<double, std::string>> ranked;
  for (const auto& [agent, rating] : state.ratings()) ranked.emplace_back(-rating, agent);
  std::sort(ranked.begin(), ranked.end());
  return ranked;
}

std::string Number(const json& v) {
  return v.is_number() ? fmt::format("{:.4g}", v.get<double>()) : v.dump();
}

}  // namespace

std::string FormatLineageLine(const LineageRecord& l) {
  const PbtDecision& d = l.decision;
  std::string hps;
  for (const auto& [name, value] : d.new_hyperparameters.items()) {
    hps += fmt::format(" {} {} -> {}", name, Number(d.old_hyperparameters.value(name, json())),
                       Number(value));
  }
  return fmt::format("{} at step {}: {} ({}) <- {} ({}) step {}:{}{}", d.population, d.step,
                     d.recipient, Number(d.recipient_metric), d.donor, Number(d.donor_metric),
                     l.donor_step, hps, l.exploited() ? "" : " [" + l.outcome + ": " + l.why + "]");
}

std::string FormatRatingsLine(const LeagueState& state) {
  std::string out;
  for (const auto& [negative, agent] : Ranked(state)) {
    const LeagueMember* m = state.config().FindMember(agent);
    out += fmt::format("{}{} {:.0f} ({})", out.empty() ? "" : ", ", agent, -negative,
                       m != nullptr ? m->role : "?");
  }
  return out;
}

std::string FormatLeague(const LeagueState* state, const std::vector<LineageRecord>& lineage) {
  std::string out;
  if (state != nullptr) {
    out += fmt::format("league: {} results applied; Elo (K {}), {} frozen snapshots per agent\n",
                       state->results_applied(), state->config().elo_k,
                       state->config().keep_snapshots);
    size_t w = 5;
    for (const auto& [agent, rating] : state->ratings()) w = std::max(w, agent.size());
    out += fmt::format("{:<4} {:<{}} {:<16} {:>8} {:>8} {:>9}\n", "RANK", "AGENT", w, "ROLE",
                       "RATING", "GAMES", "SNAPSHOTS");
    int rank = 0;
    for (const auto& [negative, agent] : Ranked(*state)) {
      int64_t games = 0;
      if (auto row = state->payoff().find(agent); row != state->payoff().end()) {
        for (const auto& [other, cell] : row->second) games += cell.games();
      }
      const LeagueMember* m = state->config().FindMember(agent);
      out +=
          fmt::format("{:<4} {:<{}} {:<16} {:>8.1f} {:>8} {:>9}\n", ++rank, agent, w,
                      m != nullptr ? m->role : "?", -negative, games, state->frozen(agent).size());
    }
    out += "payoff (games the row's agent reported: wins-losses-draws against the column's):\n";
    std::vector<std::string> columns;
    for (const auto& [agent, rating] : state->ratings()) columns.push_back(agent);
    std::string head = fmt::format("{:<{}}", "", w);
    for (const std::string& c : columns) head += fmt::format("  {:>17}", c);
    out += head + "\n";
    for (const std::string& r : columns) {
      std::string row = fmt::format("{:<{}}", r, w);
      for (const std::string& c : columns) {
        std::string cell = "-";
        if (auto it = state->payoff().find(r); it != state->payoff().end()) {
          if (auto jt = it->second.find(c); jt != it->second.end()) {
            cell = fmt::format("{}-{}-{}", jt->second.wins, jt->second.losses, jt->second.draws);
          }
        }
        row += fmt::format("  {:>17}", cell);
      }
      out += row + "\n";
    }
  }
  if (!lineage.empty()) {
    out += fmt::format("pbt lineage ({} exploit{}):\n", lineage.size(),
                       lineage.size() == 1 ? "" : "s");
    for (const LineageRecord& l : lineage) out += "  " + FormatLineageLine(l) + "\n";
  }
  return out;
}

}  // namespace agentrt
