#include "learners/ppo_trainer.h"

#include <algorithm>
#include <chrono>
#include <cstring>

namespace agentrt {
namespace {

constexpr char kTrainerMagic[8] = {'A', 'G', 'P', 'P', 'O', 'T', 'R', '1'};

uint64_t EnvSeed(const PpoConfig& ppo, int rank, int64_t env_steps) {
  // Distinct streams per rank, and fresh ones after a resume.
  return ppo.seed * 1000003ULL + static_cast<uint64_t>(rank) * 100000ULL +
         static_cast<uint64_t>(env_steps) * 7919ULL;
}

}  // namespace

nlohmann::json TrainerMetrics::ToJson() const {
  return {{"env_steps", env_steps},
          {"episodes", episodes},
          {"episode_return_mean", episode_return_mean},
          {"episode_length_mean", episode_length_mean},
          {"steps_per_s", steps_per_s},
          {"updates", ppo.updates},
          {"lr", ppo.lr},
          {"pg_loss", ppo.pg_loss},
          {"v_loss", ppo.v_loss},
          {"entropy", ppo.entropy},
          {"approx_kl", ppo.approx_kl},
          {"clip_fraction", ppo.clip_fraction},
          {"explained_variance", ppo.explained_variance},
          {"grad_norm", ppo.grad_norm}};
}

Result<std::unique_ptr<PpoTrainer>> PpoTrainer::Make(const PpoTrainerConfig& config, Group& group,
                                                     PpoTrainerOptions options) {
  AGENTRT_RETURN_IF_ERROR(config.ppo.Validate());
  std::unique_ptr<PpoTrainer> t(new PpoTrainer(config, group, options.learn));
  EnvPool::Factory factory = std::move(options.env_factory);
  if (!factory) {
    const EnvRegistry& registry =
        options.registry != nullptr ? *options.registry : GlobalEnvRegistry();
    const nlohmann::json env_args = config.env_args;
    const std::string env = config.env;
    factory = [&registry, env, env_args] { return registry.MakeEnv(env, env_args); };
  }
  AGENTRT_ASSIGN_OR_RETURN(t->pool_,
                           EnvPool::Make(factory, {.num_envs = config.ppo.num_envs,
                                                   .num_threads = config.env_threads,
                                                   .seed = EnvSeed(config.ppo, group.rank(), 0)}));
  if (!t->pool_->action_space().is_discrete()) {
    return InvalidArgument("ppo trainer: env " + config.env + " has action space " +
                           t->pool_->action_space().ToString() + "; PPO here needs a Discrete one");
  }
  AGENTRT_ASSIGN_OR_RETURN(t->learner_, PpoLearner::Make(config.ppo, t->pool_->observation_space(),
                                                         t->pool_->action_space(), group));
  t->pool_->Reset();
  return t;
}

TrainerMetrics PpoTrainer::WindowMetrics() const {
  TrainerMetrics m;
  m.env_steps = env_steps_;
  m.episodes = episodes_;
  m.window_episodes = static_cast<int>(window_.size());
  for (const auto& [ret, len] : window_) {
    m.episode_return_mean += ret / static_cast<float>(window_.size());
    m.episode_length_mean += static_cast<float>(len) / static_cast<float>(window_.size());
  }
  return m;
}

Status PpoTrainer::Iterate(TrainerMetrics* metrics, std::span<float> agree) {
  const auto start = std::chrono::steady_clock::now();
  EnvPool& pool = *pool_;
  float ended = 0.0f, terminated = 0.0f;
  for (int t = 0; t < config_.ppo.rollout_steps; ++t) {
    learner_->ActAndRecord(pool.observations(), pool.actions());
    pool.Step();
    learner_->RecordStep(pool.rewards(), pool.terminated(), pool.truncated(),
                         pool.final_observations());
    for (int i = 0; i < pool.num_envs(); ++i) {
      const auto k = static_cast<size_t>(i);
      if (!pool.terminated()[k] && !pool.truncated()[k]) continue;
      ended += 1.0f;
      if (pool.terminated()[k]) terminated += 1.0f;
      window_.emplace_back(pool.episode_returns()[k], pool.episode_lengths()[k]);
      if (static_cast<int>(window_.size()) > config_.episode_window) window_.pop_front();
    }
  }
  PpoMetrics ppo;
  AGENTRT_RETURN_IF_ERROR(learn_ ? learner_->Update(pool.observations(), &ppo)
                                 : learner_->Skip(&ppo));
  env_steps_ +=
      static_cast<int64_t>(config_.ppo.rollout_steps) * config_.ppo.num_envs * group_.size();

  // Episode statistics (this rank's window, averaged over the ranks that have
  // one; this iteration's episodes, summed) and the caller's values, in one
  // all-reduce.
  constexpr size_t kStats = 5;
  stats_.assign(kStats + agree.size(), 0.0f);
  stats_[2] = window_.empty() ? 0.0f : 1.0f;
  for (const auto& [ret, len] : window_) {
    stats_[0] += ret / static_cast<float>(window_.size());
    stats_[1] += static_cast<float>(len) / static_cast<float>(window_.size());
  }
  stats_[3] = ended;
  stats_[4] = terminated;
  std::copy(agree.begin(), agree.end(), stats_.begin() + kStats);
  if (group_.size() > 1) {
    AGENTRT_RETURN_IF_ERROR(
        group_.AllReduce(stats_.data(), stats_.size(), DataType::kFloat32, ReduceOp::kSum)
            .WithContext("ppo trainer: all-reducing episode statistics"));
  }
  std::copy(stats_.begin() + kStats, stats_.end(), agree.begin());
  episodes_ += static_cast<int64_t>(stats_[3]);
  if (metrics == nullptr) return Status::Ok();
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  metrics->env_steps = env_steps_;
  metrics->episodes = episodes_;
  metrics->iteration_episodes = static_cast<int64_t>(stats_[3]);
  metrics->terminated_fraction = stats_[3] > 0.0f ? stats_[4] / stats_[3] : 0.0f;
  metrics->episode_return_mean = stats_[2] > 0.0f ? stats_[0] / stats_[2] : 0.0f;
  metrics->episode_length_mean = stats_[2] > 0.0f ? stats_[1] / stats_[2] : 0.0f;
  metrics->window_episodes = static_cast<int>(window_.size());
  metrics->steps_per_s = static_cast<double>(config_.ppo.rollout_steps) * config_.ppo.num_envs *
                         group_.size() / seconds;
  metrics->ppo = ppo;
  return Status::Ok();
}

std::vector<uint8_t> PpoTrainer::SaveState() const {
  std::vector<uint8_t> out(kTrainerMagic, kTrainerMagic + 8);
  auto put = [&out](const auto& v) {
    const auto* p = reinterpret_cast<const uint8_t*>(&v);
    out.insert(out.end(), p, p + sizeof v);
  };
  put(env_steps_);
  put(episodes_);
  put(static_cast<uint64_t>(window_.size()));
  for (const auto& [ret, len] : window_) {
    put(ret);
    put(len);
  }
  const std::vector<uint8_t> learner = learner_->SaveState();
  out.insert(out.end(), learner.begin(), learner.end());
  return out;
}

Status PpoTrainer::LoadState(std::span<const uint8_t> state) {
  size_t at = 0;
  auto get = [&](auto& v) {
    if (state.size() - at < sizeof v) return false;
    std::memcpy(&v, state.data() + at, sizeof v);
    at += sizeof v;
    return true;
  };
  if (state.size() < 8 || std::memcmp(state.data(), kTrainerMagic, 8) != 0) {
    return DataLoss("ppo trainer: state does not start with the trainer magic");
  }
  at = 8;
  int64_t env_steps = 0, episodes = 0;
  uint64_t window = 0;
  if (!get(env_steps) || !get(episodes) || !get(window) || window > 1000000) {
    return DataLoss("ppo trainer: state is truncated (header)");
  }
  std::deque<std::pair<float, int32_t>> w;
  for (uint64_t i = 0; i < window; ++i) {
    float ret = 0.0f;
    int32_t len = 0;
    if (!get(ret) || !get(len)) return DataLoss("ppo trainer: state is truncated (episodes)");
    w.emplace_back(ret, len);
  }
  AGENTRT_RETURN_IF_ERROR(learner_->LoadState(state.subspan(at)));
  env_steps_ = env_steps;
  episodes_ = episodes;
  window_ = std::move(w);
  pool_->Reset(EnvSeed(config_.ppo, group_.rank(), env_steps_));
  return Status::Ok();
}

void PpoTrainer::AddTo(CheckpointState& state) {
  learner_->AddTo(state, "ppo.");
  if (group_.rank() == 0) {
    saved_common_ = {env_steps_, episodes_};
    state.AddSlice("trainer.common", saved_common_.data(), "int64", sizeof(int64_t), {2}, 0, 2);
  }
  // The row: the number of episodes, then (return, length) of each, padded
  // to the window's capacity so that every rank's row has one size.
  const size_t capacity = static_cast<size_t>(std::max(config_.episode_window, 0));
  saved_window_.assign(sizeof(uint64_t) + capacity * 8, 0);
  const uint64_t count = std::min(window_.size(), capacity);
  std::memcpy(saved_window_.data(), &count, sizeof count);
  size_t at = sizeof count;
  for (size_t i = window_.size() - count; i < window_.size(); ++i, at += 8) {
    std::memcpy(saved_window_.data() + at, &window_[i].first, 4);
    std::memcpy(saved_window_.data() + at + 4, &window_[i].second, 4);
  }
  state.AddRankRow("trainer.window", saved_window_.data(), saved_window_.size(), group_.rank(),
                   group_.size());
}

bool PpoTrainer::SavedIn(const SavedStep& saved) { return saved.Find("trainer.common") != nullptr; }

Status PpoTrainer::LoadFrom(const SavedStep& saved) {
  const std::string where = "ppo trainer: restore from " + saved.path();
  std::array<int64_t, 2> common{};
  AGENTRT_RETURN_IF_ERROR(saved.Read("trainer.common", 0, 2, common.data()).WithContext(where));
  std::vector<std::byte> row;
  AGENTRT_ASSIGN_OR_RETURN(const bool had_rank,
                           saved.ReadRankRow("trainer.window", group_.rank(), &row));
  std::deque<std::pair<float, int32_t>> w;
  if (had_rank) {
    uint64_t count = 0;
    if (row.size() < sizeof count) return DataLoss(where + ": a \"trainer.window\" row is short");
    std::memcpy(&count, row.data(), sizeof count);
    if (count > (row.size() - sizeof count) / 8) {
      return DataLoss(where + ": a \"trainer.window\" row says " + std::to_string(count) +
                      " episodes but holds at most " + std::to_string((row.size() - 8) / 8));
    }
    for (size_t i = 0, at = sizeof count; i < count; ++i, at += 8) {
      std::pair<float, int32_t> e;
      std::memcpy(&e.first, row.data() + at, 4);
      std::memcpy(&e.second, row.data() + at + 4, 4);
      w.push_back(e);
    }
    while (static_cast<int>(w.size()) > config_.episode_window) w.pop_front();
  }
  AGENTRT_RETURN_IF_ERROR(learner_->LoadFrom(saved, "ppo."));
  env_steps_ = common[0];
  episodes_ = common[1];
  window_ = std::move(w);
  pool_->Reset(EnvSeed(config_.ppo, group_.rank(), env_steps_));
  return Status::Ok();
}

}  // namespace agentrt
