// The league service: the controller's side of league training.
//
// It is a client of the run's own bus under the identity kLeagueServiceName
// (plan/config.h; AclFromPlan admits it when the plan has a league) and
// answers requests in its inbox, one at a time, in offset order:
//
//   {"op": "match", "agent", "incarnation", "match", "snapshot"?, "gone"?}
//       -> {"opponent", "snapshot": {"topic", "offset", "step"} | null, "snapshot_id", "how"}
//   ("gone": {"topic", "offset"} of a snapshot this agent was handed and
//   could not fetch, its message dropped by the stream's retention: it leaves
//   the catalogue before the pick, LeagueState::Forget. A broker that
//   restarted without its log empties the catalogue, LeagueState::ForgetAll.)
//   {"op": "result", "agent", "incarnation", "seq", "opponent", "opponent_snapshot",
//    "step", "wins", "losses", "draws", "snapshot"?}
//       -> {"applied": true} | {"applied": false, "why"}
//   ("snapshot": the requester's newest published policy {"topic", "offset", "step",
//   "bus_incarnation"?}; one of another broker incarnation than the bus's is ignored.)
//
// The `agent` of a request must be its authenticated sender (Message.publisher).
// Every change (a result applied, a snapshot offered) is committed to
// RUN_DIR/league/state.json (LeagueState::ToJson, with the inbox offset after
// the request) before the reply goes out: a temp file, fsync, rename, fsync of
// the directory, as checkpoints commit. A restarted service (agentctl resume,
// a requeue) loads the committed state and resumes its inbox after the last
// request it committed, so a result is applied exactly once whether the crash
// came before the commit (the request is read again) or after it (the agent
// retries, the duplicate is refused).
//
// Thread-safety: requests are handled on the bus client's thread; the
// accessors may be called from any thread.
#pragma once

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>

#include "common/status.h"
#include "comms/auth.h"
#include "comms/bus_client.h"
#include "scheduler/league.h"

namespace agentrt {

struct LeagueServiceOptions {
  std::string bus_address;  // host:port of the run's bus
  Credential credential;    // kLeagueServiceName's token
  std::string state_path;   // RunDir::LeagueStatePath()
  BusClientOptions bus;
};

// The committed league state at `path`: NotFound when the run has none yet;
// an error naming the file when it cannot be read back.
Result<LeagueState> ReadLeagueState(const LeagueConfig& config, const std::string& path);

class LeagueService {
 public:
  // Loads the committed state (if any) and starts answering requests.
  static Result<std::unique_ptr<LeagueService>> Start(const LeagueConfig& config,
                                                      LeagueServiceOptions options);
  ~LeagueService();
  LeagueService(const LeagueService&) = delete;
  LeagueService& operator=(const LeagueService&) = delete;

  // The state as last committed (LeagueState::ToJson).
  nlohmann::json Committed() const;
  double Rating(const std::string& agent) const;
  // Requests refused (bad JSON, a forged agent, an unknown member) and
  // commits that failed (the reply then says so; the agent retries).
  int64_t refused() const { return refused_.load(); }
  int64_t commit_failures() const { return commit_failures_.load(); }
  std::string last_error() const;

 private:
  LeagueService(LeagueState state, LeagueServiceOptions options)
      : state_(std::move(state)), options_(std::move(options)) {}
  void OnMessage(const BusMessage& message);
  // `bus_incarnation`: the broker incarnation the request was read from.
  nlohmann::json Handle(const BusMessage& message, const nlohmann::json& request,
                        uint64_t bus_incarnation, bool* changed);
  Status Commit();
  void Refuse(const std::string& why);

  mutable std::mutex mu_;
  LeagueState state_;         // guarded by mu_
  nlohmann::json committed_;  // guarded by mu_
  std::string last_error_;    // guarded by mu_
  // The committed ratings, for Rating() without waiting for a commit in progress.
  mutable std::mutex ratings_mu_;
  std::map<std::string, double> ratings_;  // guarded by ratings_mu_
  LeagueServiceOptions options_;
  std::unique_ptr<BusClient> bus_;
  SubscriptionId inbox_ = 0;
  std::atomic<int64_t> refused_{0};
  std::atomic<int64_t> commit_failures_{0};
};

}  // namespace agentrt
