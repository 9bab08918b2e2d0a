// LeaguePlay: agent-worker's side of the controller's league service
// (scheduler/league_service.h), for an agent that is a league member.
//
// `incarnation` names this process's result stream (the bus publisher id: unique
// per process). A match is the training episodes played between two requests: the league
// picks the opponent (and the snapshot of it) that plays the other side's
// seat; the episodes' outcomes are counted here (AddGames) and reported when
// the next match is asked for. Results are numbered 1, 2, ... in this
// incarnation and sent in order, each until the league acknowledges it (a
// duplicate counts as acknowledged), so the league applies each exactly once.
// A league that does not answer costs a bounded wait: the current opponent
// stays and the unsent results wait for the next request.
//
// Thread-safety: none; the training thread calls it.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "common/status.h"
#include "comms/bus_client.h"
#include "learners/policy_snapshot.h"

namespace agentrt::worker {

// A published snapshot of this agent: where the league can point others to it.
struct SnapshotRef {
  std::string topic;
  int64_t offset = -1;
  int64_t step = 0;
  // The broker incarnation whose log holds it, as the member's bus client
  // last saw it (0: unknown): the league ignores an offer from another.
  uint64_t bus_incarnation = 0;
};

struct LeagueAssignment {
  std::string opponent;
  std::string snapshot_id;               // "<agent>@<step>" or "<agent>@initial"
  std::optional<PolicySnapshot> policy;  // none: the opponent's initial policy plays
  std::string how;                       // newest | uniform | pfsp
};

class LeaguePlay {
 public:
  LeaguePlay(BusClient* bus, std::string agent, uint64_t incarnation,
             std::chrono::milliseconds timeout = std::chrono::seconds(5));

  // Games of the current match.
  void AddGames(int64_t wins, int64_t losses, int64_t draws);
  // Ends the current match (queued as a result if it had games), sends every
  // queued result it can, and asks for the next opponent.
  Result<LeagueAssignment> Next(const std::optional<SnapshotRef>& own, int64_t step);
  // Sends the queued results (the last match included); at the end of training.
  Status Finish(const std::optional<SnapshotRef>& own, int64_t step);

  const std::optional<LeagueAssignment>& current() const { return current_; }
  int64_t matches() const { return static_cast<int64_t>(match_); }
  int64_t results_acknowledged() const { return acknowledged_; }
  size_t results_pending() const { return pending_.size(); }

 private:
  void EndMatch(const std::optional<SnapshotRef>& own, int64_t step);
  Status SendPending();
  Result<nlohmann::json> Ask(nlohmann::json request);

  BusClient* bus_;
  std::string agent_;
  uint64_t incarnation_;
  std::chrono::milliseconds timeout_;
  uint64_t match_ = 0;
  uint64_t seq_ = 0;
  int64_t wins_ = 0, losses_ = 0, draws_ = 0;
  std::optional<LeagueAssignment> current_;
  std::deque<nlohmann::json> pending_;  // results not yet acknowledged, in order
  int64_t acknowledged_ = 0;
};

}  // namespace agentrt::worker
