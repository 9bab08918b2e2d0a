#include "scheduler/pbt_service.h"

#include <fmt/format.h>

#include <filesystem>
#include <map>
#include <string>
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

}  // namespace

PbtService::PbtService(Plan* plan, RunDir dir, RunController* controller,
                       const LeagueService* league, const Clock* clock, RunObserver* observer)
    : plan_(plan),
      dir_(std::move(dir)),
      controller_(controller),
      league_(league),
      clock_(clock),
      observer_(observer),
      pbt_(plan->pbt, ArgsOf(*plan)) {}

PbtService::~PbtService() = default;

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
  std::error_code ec;
  std::filesystem::create_directories(dir_.LeagueDir(), ec);
  const Status appended = AppendLine(dir_.LineagePath(), line.ToJson().dump());
  if (!appended.ok()) observer_->Warn("agentctl run: warning: " + appended.message() + "\n");
}

}  // namespace agentrt
