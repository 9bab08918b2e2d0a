// PBT in a running run, a service of the run driver: metrics reports go to the
// PbtScheduler (scheduler/pbt.h); an exploit it decides waits for a fresh
// checkpoint of the donor (or checkpoint_wait_s), then replaces the recipient:
// while it is down, the donor's checkpoint is adopted into the recipient's
// directory, its new args go to plan.json and a line to lineage.jsonl.
#pragma once

#include <memory>
#include <vector>

#include "common/clock.h"
#include "plan/plan.h"
#include "plan/run_dir.h"
#include "scheduler/pbt.h"
#include "scheduler/run_controller.h"

namespace agentrt {

class LeagueService;
class RunObserver;
struct TelemetryMessage;

// Exploits a controller that died mid-exploit adopted but never wrote a
// lineage line for (the adopted checkpoint keeps the record,
// AdoptOptions::note): each gets its line in lineage.jsonl now, marked
// "recovered", and its recipient the new hyperparameters in `plan` and
// plan.json. Run on every start, before the agents launch; nothing to do on a
// fresh run. Problems are warnings: PBT goes on.
void RecoverExploits(Plan* plan, const RunDir& dir, RunObserver* observer);

class PbtService {
 public:
  // `plan` (whose args an exploit changes), `controller`, `clock` and
  // `observer` outlive the service; `league` (may be null) gives ratings.
  PbtService(Plan* plan, RunDir dir, RunController* controller, const LeagueService* league,
             const Clock* clock, RunObserver* observer);
  ~PbtService();

  // A metrics report (rank 0 of the current incarnation counts): may decide
  // an exploit and ask the donor for a checkpoint.
  void OnReport(const TelemetryMessage& m);
  // Exploits whose donor checkpoint is ready (or waited for long enough)
  // replace their recipient; lineage lines the file refused before are
  // written now if it takes them.
  void Advance();

 private:
  struct PendingExploit;
  // Runs while the recipient is down.
  void Execute(const PbtDecision& d);
  // Appends the kept lineage lines in order, as far as the file takes them:
  // one that cannot be written (a full disk) is said once and kept for the
  // next call (Advance, the destructor), so that lineage.jsonl gets every
  // exploit's line once, in order, while the controller lives on. A line that
  // an append wrote before failing (its fsync) is not written again.
  void WriteLineage();

  Plan* plan_;
  RunDir dir_;
  RunController* controller_;
  const LeagueService* league_;
  const Clock* clock_;
  RunObserver* observer_;
  PbtScheduler pbt_;
  std::vector<std::unique_ptr<PendingExploit>> exploits_;
  std::vector<LineageRecord> unwritten_;  // lineage lines not appended yet, in order
  bool lineage_failing_ = false;          // said: the file refuses lines
};

}  // namespace agentrt
