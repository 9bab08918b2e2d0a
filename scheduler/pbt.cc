#include "scheduler/pbt.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <functional>

#include "envs/rng.h"

namespace agentrt {
PbtScheduler::PbtScheduler(std::vector<PbtPopulation> populations,
                           const std::map<std::string, nlohmann::json>& args)
    : populations_(std::move(populations)) {
  for (const PbtPopulation& p : populations_) {
    for (const std::string& agent : p.agents) {
      Member& m = members_[agent];
      m.next_step = p.interval_steps;
      if (auto it = args.find(agent); it != args.end()) m.args = it->second;
    }
  }
}

const PbtPopulation* PbtScheduler::PopulationOf(const std::string& agent) const {
  for (const PbtPopulation& p : populations_) {
    if (std::find(p.agents.begin(), p.agents.end(), agent) != p.agents.end()) return &p;
  }
  return nullptr;
}

void PbtScheduler::SetRating(const std::string& agent, double rating) {
  const PbtPopulation* p = PopulationOf(agent);
  if (p != nullptr && p->metric == "rating") members_[agent].metric = rating;
}

std::optional<PbtDecision> PbtScheduler::OnReport(const std::string& agent, int64_t step,
                                                  const nlohmann::json& metrics) {
  const PbtPopulation* pop = PopulationOf(agent);
  if (pop == nullptr) return std::nullopt;
  Member& me = members_[agent];
  if (pop->metric != "rating") {
    auto it = metrics.find(pop->metric);
    if (it != metrics.end() && it->is_number()) me.metric = it->get<double>();
  }
  if (step < me.next_step) return std::nullopt;
  // Due: the next boundary past this step, whatever is decided now.
  me.next_step = (step / pop->interval_steps + 1) * pop->interval_steps;
  if (!me.metric || busy_.count(agent) > 0) return std::nullopt;

  std::vector<std::pair<double, std::string>> ranked;  // ascending: worst first
  for (const std::string& a : pop->agents) {
    const Member& m = members_[a];
    if (m.metric) ranked.emplace_back(*m.metric, a);
  }
  if (ranked.size() < 2) return std::nullopt;
  std::sort(ranked.begin(), ranked.end());
  const size_t k = std::max<size_t>(
      1,
      static_cast<size_t>(std::floor(static_cast<double>(ranked.size()) * pop->fraction + 1e-9)));
  size_t position = 0;
  while (ranked[position].second != agent) ++position;
  if (position >= k) return std::nullopt;  // not in the bottom fraction
  std::vector<std::string> donors;
  for (size_t i = ranked.size() - k; i < ranked.size(); ++i) {
    const std::string& d = ranked[i].second;
    // A tie with the recipient is no better than it.
    if (d != agent && busy_.count(d) == 0 && ranked[i].first > *me.metric) donors.push_back(d);
  }
  if (donors.empty()) return std::nullopt;

  Rng rng = Rng::FromParts({static_cast<uint64_t>(pop->seed), std::hash<std::string>{}(agent),
                            static_cast<uint64_t>(step)});
  PbtDecision d;
  d.population = pop->name;
  d.recipient = agent;
  d.donor = donors[rng.Below(donors.size())];
  d.step = step;
  d.recipient_metric = *me.metric;
  d.donor_metric = *members_[d.donor].metric;
  const nlohmann::json& donor_args = members_[d.donor].args;
  for (const PbtHyperparameter& h : pop->hyperparameters) {
    d.old_hyperparameters[h.name] = me.args.value(h.name, nlohmann::json());
    const double base = donor_args.value(h.name, h.min);
    double value = 0;
    if (rng.Uniform() < pop->resample_probability) {
      value = h.log_scale
                  ? std::exp(std::log(h.min) + rng.Uniform() * (std::log(h.max) - std::log(h.min)))
                  : rng.Uniform(h.min, h.max);
      d.explore[h.name] = "resampled";
    } else {
      const double factor = h.perturb[rng.Below(h.perturb.size())];
      value = base * factor;
      d.explore[h.name] = fmt::format("x{}", factor);
    }
    if (h.integer) {
      // An integer arg (epochs, minibatches) stays an integer the agent accepts.
      const double bounded = std::clamp(std::round(value), std::ceil(h.min), std::floor(h.max));
      d.new_hyperparameters[h.name] = static_cast<int64_t>(bounded);
    } else {
      // Six significant digits: 0.00072, not 0.0007199999999999999.
      const double rounded = std::stod(fmt::format("{:.6g}", value));
      d.new_hyperparameters[h.name] = std::clamp(rounded, h.min, h.max);
    }
  }
  busy_.insert(agent);
  busy_.insert(d.donor);
  return d;
}

void PbtScheduler::Done(const PbtDecision& decision, const nlohmann::json& args, int64_t step) {
  Member& m = members_[decision.recipient];
  m.args = args;
  m.metric.reset();
  // Judged again after interval_steps of training of its own on the new weights.
  if (const PbtPopulation* pop = PopulationOf(decision.recipient))
    m.next_step = step + pop->interval_steps;
  busy_.erase(decision.recipient);
  busy_.erase(decision.donor);
}

void PbtScheduler::Dropped(const PbtDecision& decision) {
  busy_.erase(decision.recipient);
  busy_.erase(decision.donor);
}

}  // namespace agentrt
