#include "scheduler/pbt_service.h"

#include <fmt/format.h>

#include <filesystem>
#include <map>
#include <set>
#include <string>
#include <tuple>
#include <utility>

#include "agent_runtime/checkpointer.h"
#include "common/file_util.h"
#include "comms/telemetry.h"
#include "plan/records.h"
#include "scheduler/league_service.h"
#include "scheduler/run_driver.h"

namespace agentrt {
namespace {

// Every member's current args, which PBT's decisions start from.
std::map<std::string, nlohmann::json> ArgsOf(const Plan& plan) {
  std::map<std::string, nlohmann::json> args;
  for (const AgentPlan& a : plan.agents) args[a.name] = a.args;
  return args;
}

// One line of RUN_DIR/league/lineage.jsonl, its folder made if need be.
Status AppendLineage(const RunDir& dir, const LineageRecord& line) {
  std::error_code ec;
  std::filesystem::create_directories(dir.LeagueDir(), ec);
  return AppendLine(dir.LineagePath(), line.ToJson().dump());
}

}  // namespace

void RecoverExploits(Plan* plan, const RunDir& dir, RunObserver* observer) {
  if (plan->pbt.empty()) return;
  auto lines = ReadLineageFile(dir.LineagePath());
  if (!lines.ok()) {
    observer->Warn("agentctl run: warning: pbt: " + lines.status().message() + "\n");
    return;
  }
  // An exploit is its recipient, donor, adopted step and the time of its decision
  // (two exploits may adopt the same step of one donor).
  std::set<std::tuple<std::string, std::string, int64_t, double>> written;
  for (const LineageRecord& l : *lines) {
    if (l.exploited())
      written.insert({l.decision.recipient, l.decision.donor, l.donor_step, l.time});
  }
  std::set<std::string> members;  // only their checkpoints can hold an exploit
  for (const PbtPopulation& p : plan->pbt) members.insert(p.agents.begin(), p.agents.end());
  bool plan_changed = false;
  for (AgentPlan& a : plan->agents) {
    if (!members.count(a.name)) continue;
    auto newest = NewestCheckpoint(dir.Resolve(a.checkpoint_dir), a.name);
    if (!newest.ok() || !newest->metadata.is_object()) continue;
    const nlohmann::json from = newest->metadata.value("adopted_from", nlohmann::json::object());
    const nlohmann::json note = from.value("note", nlohmann::json());
    // Only this run's own exploits (a checkpoint brought from another run keeps its note).
    if (!note.is_object() || note.value("lineage", "") != dir.LineagePath()) continue;
    auto line = LineageRecord::FromJson(note);
    if (!line.ok() || line->decision.recipient != a.name) continue;
    line->donor_step = from.value("step", int64_t{-1});
    if (written.count({a.name, line->decision.donor, line->donor_step, line->time}) != 0) continue;
    line->why = "recovered on resume: the controller died before it wrote this line";
    for (const auto& [name, value] : line->decision.new_hyperparameters.items())
      a.args[name] = value;
    plan_changed = true;
    const Status appended = AppendLineage(dir, *line);
    if (!appended.ok()) observer->Warn("agentctl run: warning: " + appended.message() + "\n");
    observer->Event(fmt::format("pbt {}: {}'s exploit of {}'s step {} recovered: {}",
                                line->decision.population, a.name, line->decision.donor,
                                line->donor_step, line->decision.new_hyperparameters.dump()));
  }
  if (!plan_changed) return;
  const Status written_plan = WriteRunPlan(*plan, dir.path());
  if (!written_plan.ok()) observer->Warn("agentctl run: warning: " + written_plan.message() + "\n");
}

PbtService::PbtService(Plan* plan, RunDir dir, RunController* controller,
                       const LeagueService* league, const Clock* clock, RunObserver* observer)
    : plan_(plan),
      dir_(std::move(dir)),
      controller_(controller),
      league_(league),
      clock_(clock),
      observer_(observer),
      pbt_(plan->pbt, ArgsOf(*plan)) {}

PbtService::~PbtService() {
  WriteLineage();
  if (!unwritten_.empty()) {
    observer_->Warn(fmt::format(
        "agentctl run: warning: pbt: {} lineage line(s) could not be written to {}; exploits "
        "the adopted checkpoints record get theirs on the next start\n",
        unwritten_.size(), dir_.LineagePath()));
  }
}

void PbtService::WriteLineage() {
  while (!unwritten_.empty()) {
    const LineageRecord& line = unwritten_.front();
    bool written = false;
    if (lineage_failing_) {  // an earlier try may have written it before failing
      auto lines = ReadLineageFile(dir_.LineagePath());
      if (lines.ok()) {
        const std::string text = line.ToJson().dump();
        for (const LineageRecord& l : *lines) written |= l.ToJson().dump() == text;
      }
    }
    const Status appended = written ? Status::Ok() : AppendLineage(dir_, line);
    if (!appended.ok()) {
      if (!lineage_failing_) {
        observer_->Warn(fmt::format(
            "agentctl run: warning: pbt: {}; the line of {}'s exploit is kept and written when "
            "the file takes it\n",
            appended.message(), line.decision.recipient));
      }
      lineage_failing_ = true;
      return;
    }
    unwritten_.erase(unwritten_.begin());
    if (lineage_failing_ && unwritten_.empty()) {
      lineage_failing_ = false;
      observer_->Event("pbt: " + dir_.LineagePath() +
                       " takes lines again: the kept ones are written");
    }
  }
}

struct PbtService::PendingExploit {
  PbtDecision decision;
  double asked_s = 0;
  int64_t donor_step = -1;  // the donor's step when asked: a checkpoint this new is fresh
  bool replacing = false;   // the recipient is being torn down
  bool done = false;        // Execute ran
};

void PbtService::OnReport(const TelemetryMessage& m) {
  const AgentStatus* s = controller_->status().FindAgent(m.agent);
  // Reports of an earlier incarnation (the weights an exploit replaced) do not count.
  if (s == nullptr || m.restart_count != s->restarts || m.rank != 0) return;
  if (league_) pbt_.SetRating(m.agent, league_->Rating(m.agent));
  std::optional<PbtDecision> d = pbt_.OnReport(m.agent, m.step, m.metrics);
  if (!d) return;
  const AgentStatus* donor = controller_->status().FindAgent(d->donor);
  observer_->Event(fmt::format(
      "pbt {}: {} ({} {:.4g} at step {}) is in the bottom of its population: it restarts from "
      "{}'s checkpoint ({:.4g}) with {}",
      d->population, d->recipient, pbt_.PopulationOf(d->recipient)->metric, d->recipient_metric,
      d->step, d->donor, d->donor_metric, d->new_hyperparameters.dump()));
  auto pending = std::make_unique<PendingExploit>();
  pending->decision = std::move(*d);
  pending->asked_s = clock_->NowSeconds();
  if (donor != nullptr) pending->donor_step = donor->step;
  // A fresh checkpoint of the donor's current weights (its runtime saves on SIGUSR2).
  // If the signal fails the exploit times out and is reported as such.
  controller_->RequestCheckpoint(pending->decision.donor).IgnoreError();
  exploits_.push_back(std::move(pending));
}

void PbtService::Advance() {
  WriteLineage();
  const double now = clock_->NowSeconds();
  for (auto& p : exploits_) {
    if (p->replacing) continue;
    const PbtDecision& d = p->decision;
    const AgentStatus* donor = controller_->status().FindAgent(d.donor);
    const PbtPopulation* pop = pbt_.PopulationOf(d.recipient);
    const bool fresh = donor != nullptr && donor->last_checkpoint_step &&
                       *donor->last_checkpoint_step >= p->donor_step;
    const bool donor_running = donor != nullptr && donor->state == AgentState::kRunning;
    if (!fresh && donor_running && now - p->asked_s < pop->checkpoint_wait_s) continue;
    PendingExploit* self = p.get();
    const Status replaced =
        controller_->Replace(d.recipient,
                             fmt::format("pbt: restarting from {}'s checkpoint with {}", d.donor,
                                         d.new_hyperparameters.dump()),
                             [this, self] {
                               Execute(self->decision);
                               self->done = true;
                             });
    if (replaced.ok()) {
      p->replacing = true;
    } else {
      observer_->Event(fmt::format("pbt {}: {} is not replaced: {}", d.population, d.recipient,
                                   replaced.message()));
      pbt_.Dropped(d);
      p->done = true;
    }
  }
  std::erase_if(exploits_, [](const std::unique_ptr<PendingExploit>& p) { return p->done; });
}

void PbtService::Execute(const PbtDecision& d) {
  AgentPlan* recipient = plan_->FindAgent(d.recipient);
  const AgentPlan* donor = plan_->FindAgent(d.donor);
  LineageRecord line;
  line.time = UnixTimeSeconds();
  line.decision = d;
  Result<AdoptResult> adopted = NotFound("no such agent in the plan");
  if (recipient != nullptr && donor != nullptr) {
    AdoptOptions o;
    o.from_dir = dir_.Resolve(donor->checkpoint_dir);
    o.from_agent = donor->name;
    o.to_dir = dir_.Resolve(recipient->checkpoint_dir);
    o.to_agent = recipient->name;
    o.world_size = recipient->ranks;
    // The record rides in the adopted checkpoint until its line is written
    // (RecoverExploits).
    LineageRecord note = line;
    note.outcome = LineageRecord::kExploited;
    o.note = note.ToJson();
    o.note["lineage"] = dir_.LineagePath();
    adopted = AdoptCheckpoint(o);
  }
  if (!adopted.ok()) {
    // Nothing changed: it relaunches from its own checkpoint with its own args.
    observer_->Warn(fmt::format("agentctl run: pbt {}: {} keeps its own weights: {}\n",
                                d.population, d.recipient, adopted.status().message()));
    line.outcome = LineageRecord::kFailed;
    line.why = adopted.status().message();
    pbt_.Dropped(d);
  } else {
    for (const auto& [name, value] : d.new_hyperparameters.items()) recipient->args[name] = value;
    const Status written = WriteRunPlan(*plan_, dir_.path());
    if (!written.ok()) observer_->Warn("agentctl run: warning: " + written.message() + "\n");
    line.outcome = LineageRecord::kExploited;
    line.donor_step = adopted->step;
    for (const std::string& w : adopted->warnings)
      observer_->Warn(fmt::format("agentctl run: pbt {}: {}: {}\n", d.population, d.recipient, w));
    line.archived = adopted->archived;
    pbt_.Done(d, recipient->args, adopted->step);
    observer_->Event(fmt::format("pbt {}: {} now has {}'s weights of step {} and {}", d.population,
                                 d.recipient, d.donor, adopted->step,
                                 d.new_hyperparameters.dump()));
  }
  unwritten_.push_back(std::move(line));
  WriteLineage();
}

}  // namespace agentrt
