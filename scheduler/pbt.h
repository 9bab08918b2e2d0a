// Population-based training's decisions (Jaderberg et al. 2017), pure logic:
// no processes, no files. RunDriver feeds it the agents' metric reports and
// carries out what it decides (scheduler/run_driver.h: the donor checkpoints,
// the recipient is torn down, AdoptCheckpoint, new args in plan.json, relaunch,
// a line in RUN_DIR/league/lineage.jsonl).
//
// Every `interval_steps` of a member's own env steps (the first report at or
// past its next boundary) the population is ranked by the members' latest
// metric (higher is better; members that have reported none yet are left
// out). A member in the bottom `fraction` (at least one member) exploits: a
// donor is drawn uniformly from the top `fraction`, and explores: each
// declared hyperparameter becomes the donor's value times one of `perturb`,
// or, with `resample_probability`, a fresh draw from [min, max] (log-uniform
// with log_scale), clamped to [min, max]. The draws are seeded by the
// population's seed, the member and its step: the same reports give the same
// decisions.
//
// A member is in at most one exploit at a time (as recipient or donor); its
// metric is forgotten when it has been replaced (its next report is of its
// new weights), and it is next judged interval_steps after the adopted step.
//
// Thread-safety: none.
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "plan/config.h"
#include "plan/records.h"

namespace agentrt {

class PbtScheduler {
 public:
  // `args`: every member's current agent args (from the plan), where the
  // hyperparameters are read.
  PbtScheduler(std::vector<PbtPopulation> populations,
               const std::map<std::string, nlohmann::json>& args);

  // One metrics report of `agent` at env step `step`. A decision when the
  // member is due, in the bottom fraction, and neither it nor a donor is busy.
  std::optional<PbtDecision> OnReport(const std::string& agent, int64_t step,
                                      const nlohmann::json& metrics);
  // For metric `rating`: the league's rating of `agent` (kept until the next).
  void SetRating(const std::string& agent, double rating);

  // The decision was carried out: the recipient now has `args` and trains on
  // from `step` (the adopted checkpoint's). Frees both members.
  void Done(const PbtDecision& decision, const nlohmann::json& args, int64_t step);
  // The decision was dropped (no donor checkpoint, the recipient had ended...).
  void Dropped(const PbtDecision& decision);

  const PbtPopulation* PopulationOf(const std::string& agent) const;
  const std::vector<PbtPopulation>& populations() const { return populations_; }

 private:
  struct Member {
    std::optional<double> metric;
    int64_t next_step = 0;  // judged at the first report at or past this step
    nlohmann::json args = nlohmann::json::object();
  };
  std::vector<PbtPopulation> populations_;
  std::map<std::string, Member> members_;
  std::set<std::string> busy_;
};

}  // namespace agentrt
