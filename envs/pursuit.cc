#include "envs/pursuit.h"

#include <algorithm>
#include <cassert>
#include <climits>
#include <cstdlib>

#include "envs/params.h"

namespace agentrt {

Result<PursuitConfig> PursuitConfig::FromJson(const nlohmann::json& params) {
  Params p(params, "env pursuit");
  PursuitConfig c;
  PursuitConfig& out = c;
  AGENTRT_PURSUIT_SETTINGS(AGENTRT_PARAM_READ)
  if (!params.is_object() || params.value("height", nlohmann::json()).is_null()) c.height = c.width;
  if (c.width < 2) p.Invalid("width", "must be >= 2");
  if (c.height < 2) p.Invalid("height", "must be >= 2");
  if (c.predators < 1) p.Invalid("predators", "must be >= 1");
  if (c.prey < 1) p.Invalid("prey", "must be >= 1");
  if (c.obs_radius < 0) p.Invalid("obs_radius", "must be >= 0");
  if (c.capture_k < 1 || c.capture_k > c.predators) {
    p.Invalid("capture_k", "must be between 1 and the number of predators (" +
                               std::to_string(c.predators) + ")");
  }
  if (c.capture_range < 0) p.Invalid("capture_range", "must be >= 0");
  if (c.max_steps < 1) p.Invalid("max_steps", "must be >= 1");
  AGENTRT_RETURN_IF_ERROR(p.Finish());
  return c;
}

Pursuit::Pursuit(const PursuitConfig& config)
    : config_(config),
      observation_space_(
          Space::Box({3 * (2 * config.obs_radius + 1) * (2 * config.obs_radius + 1) + 3}, 0.0f,
                     static_cast<float>(config.predators + config.prey))),
      action_space_(Space::Discrete(5)) {
  const int n = num_agents();
  for (int i = 0; i < n; ++i) {
    names_.push_back(i < config_.predators ? "predator_" + std::to_string(i)
                                           : "prey_" + std::to_string(i - config_.predators));
  }
  pos_.resize(static_cast<size_t>(n));
  active_.assign(static_cast<size_t>(n), 1);
  before_.assign(static_cast<size_t>(n), 0);
  predator_grid_.assign(static_cast<size_t>(config_.width) * static_cast<size_t>(config_.height),
                        0.0f);
  prey_grid_.assign(static_cast<size_t>(config_.width) * static_cast<size_t>(config_.height), 0.0f);
  catchers_.reserve(static_cast<size_t>(config_.predators));
}

int Pursuit::Distance(Cell a, Cell b) const { return std::abs(a.x - b.x) + std::abs(a.y - b.y); }

int Pursuit::NearestPreyDistance(int predator) const {
  int best = INT_MAX;
  for (int j = config_.predators; j < num_agents(); ++j) {
    if (active_[j]) best = std::min(best, Distance(pos_[predator], pos_[j]));
  }
  return best;
}

int Pursuit::NearestPredatorDistance(int prey) const {
  int best = INT_MAX;
  for (int j = 0; j < config_.predators; ++j) best = std::min(best, Distance(pos_[prey], pos_[j]));
  return best;
}

void Pursuit::Reset(std::optional<uint64_t> seed, std::span<float> obs) {
  if (seed) rng_.Seed(*seed);
  const auto w = static_cast<uint64_t>(config_.width);
  const auto h = static_cast<uint64_t>(config_.height);
  for (int i = 0; i < num_agents(); ++i) {
    active_[i] = 1;
    pos_[i] = {static_cast<int>(rng_.Below(w)), static_cast<int>(rng_.Below(h))};
  }
  // Place each prey out of capture range of every predator when the grid
  // allows it (a bounded number of tries keeps tiny grids working).
  for (int j = config_.predators; j < num_agents(); ++j) {
    for (int tries = 0; tries < 64 && NearestPredatorDistance(j) <= config_.capture_range;
         ++tries) {
      pos_[j] = {static_cast<int>(rng_.Below(w)), static_cast<int>(rng_.Below(h))};
    }
  }
  captures_ = 0;
  elapsed_ = 0;
  Observe(obs);
}

MultiAgentEnv::StepOutcome Pursuit::Step(std::span<const float> actions, std::span<float> obs,
                                         std::span<float> rewards) {
  const int n = num_agents();
  const int predators = config_.predators;
  for (int i = 0; i < n; ++i) {
    rewards[i] = 0.0f;
    if (!active_[i]) continue;
    before_[i] = i < predators ? NearestPreyDistance(i) : NearestPredatorDistance(i);
  }
  for (int i = 0; i < n; ++i) {
    if (!active_[i]) continue;
    const int move = std::clamp(static_cast<int>(actions[i]), 0, 4);
    // The cell each Move leads to, by Move's value; walls stop an agent.
    static constexpr int kDx[] = {0, 0, 0, -1, 1};
    static constexpr int kDy[] = {0, -1, 1, 0, 0};
    Cell& c = pos_[i];
    c.x = std::clamp(c.x + kDx[move], 0, config_.width - 1);
    c.y = std::clamp(c.y + kDy[move], 0, config_.height - 1);
  }
  // Shaping is measured against the prey that were free before this step's
  // captures, so the capturing move itself is not penalised.
  for (int i = 0; i < n; ++i) {
    if (!active_[i]) continue;
    if (i < predators) {
      const int after = NearestPreyDistance(i);
      rewards[i] += config_.shaping * static_cast<float>(before_[i] - after) - config_.step_penalty;
    } else {
      const int after = NearestPredatorDistance(i);
      rewards[i] += config_.shaping * static_cast<float>(after - before_[i]) + config_.step_penalty;
    }
  }
  for (int j = predators; j < n; ++j) {
    if (!active_[j]) continue;
    catchers_.clear();
    for (int i = 0; i < predators; ++i) {
      if (Distance(pos_[i], pos_[j]) <= config_.capture_range) catchers_.push_back(i);
    }
    if (static_cast<int>(catchers_.size()) < config_.capture_k) continue;
    for (int i : catchers_) rewards[i] += config_.capture_reward;
    rewards[j] -= config_.capture_reward;
    active_[j] = 0;
    ++captures_;
  }
  ++elapsed_;
  StepOutcome out;
  out.terminated = captures_ == config_.prey;
  out.truncated = !out.terminated && elapsed_ >= config_.max_steps;
  Observe(obs);
  return out;
}

void Pursuit::RebuildGrid() {
  std::fill(predator_grid_.begin(), predator_grid_.end(), 0.0f);
  std::fill(prey_grid_.begin(), prey_grid_.end(), 0.0f);
  for (int i = 0; i < num_agents(); ++i) {
    if (!active_[i]) continue;
    const size_t cell = static_cast<size_t>(pos_[i].y) * static_cast<size_t>(config_.width) +
                        static_cast<size_t>(pos_[i].x);
    (is_predator(i) ? predator_grid_ : prey_grid_)[cell] += 1.0f;
  }
}

void Pursuit::Observe(std::span<float> obs) {
  RebuildGrid();
  const int r = config_.obs_radius;
  const int side = 2 * r + 1;
  const size_t plane = static_cast<size_t>(side) * static_cast<size_t>(side);
  const size_t obs_size = observation_space_.size();
  assert(obs.size() >= obs_size * static_cast<size_t>(num_agents()));
  for (int i = 0; i < num_agents(); ++i) {
    float* o = obs.data() + static_cast<size_t>(i) * obs_size;
    if (!active_[i]) {
      std::fill(o, o + obs_size, 0.0f);
      continue;
    }
    for (int dy = -r; dy <= r; ++dy) {
      for (int dx = -r; dx <= r; ++dx) {
        const size_t k =
            static_cast<size_t>(dy + r) * static_cast<size_t>(side) + static_cast<size_t>(dx + r);
        const int x = pos_[i].x + dx;
        const int y = pos_[i].y + dy;
        const bool outside = x < 0 || y < 0 || x >= config_.width || y >= config_.height;
        const size_t cell = outside ? 0 : static_cast<size_t>(y * config_.width + x);
        o[k] = outside ? 1.0f : 0.0f;
        o[plane + k] = outside ? 0.0f : predator_grid_[cell];
        o[2 * plane + k] = outside ? 0.0f : prey_grid_[cell];
      }
    }
    o[3 * plane] = static_cast<float>(pos_[i].x) / static_cast<float>(config_.width - 1);
    o[3 * plane + 1] = static_cast<float>(pos_[i].y) / static_cast<float>(config_.height - 1);
    o[3 * plane + 2] = is_predator(i) ? 1.0f : 0.0f;
  }
}

Result<std::unique_ptr<MultiAgentEnv>> MakePursuit(const nlohmann::json& params) {
  AGENTRT_ASSIGN_OR_RETURN(PursuitConfig config, PursuitConfig::FromJson(params));
  return std::unique_ptr<MultiAgentEnv>(std::make_unique<Pursuit>(config));
}

WorldSides PursuitSides() {
  WorldSides sides;
  sides.roles = {"predator", "prey"};
  sides.sized = [](nlohmann::json params, const std::vector<int>& players) {
    if (!params.is_object()) params = nlohmann::json::object();
    const int capture_k = params.value("capture_k", PursuitConfig{}.capture_k);
    params["predators"] = params.value("predators", std::max(capture_k, players.at(0)));
    params["prey"] = params.value("prey", std::max(1, players.at(1)));
    return params;
  };
  sides.one_each = [](nlohmann::json params) -> Result<nlohmann::json> {
    if (!params.is_object()) params = nlohmann::json::object();
    if (params.value("predators", 1) != 1 || params.value("prey", 1) != 1 ||
        params.value("capture_k", 1) != 1) {
      return InvalidArgument(
          "league play is one predator against one prey: env_args predators, prey and capture_k "
          "must be 1 (or unset)");
    }
    params["predators"] = 1;
    params["prey"] = 1;
    params["capture_k"] = 1;
    return params;
  };
  sides.scoring_side = 0;
  sides.score = "capture";
  return sides;
}

}  // namespace agentrt
