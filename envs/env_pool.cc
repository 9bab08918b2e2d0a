#include "envs/env_pool.h"

#include <algorithm>
#include <string>

namespace agentrt {
namespace {

// Spin this many rounds before sleeping on the futex: a batch step takes
// microseconds, a sleep/wake pair about as long again.
constexpr int kSpinRounds = 2000;

template <typename T, typename Pred>
void SpinThenWait(const std::atomic<T>& value, Pred done) {
  for (int i = 0; i < kSpinRounds; ++i) {
    if (done(value.load(std::memory_order_acquire))) return;
  }
  for (;;) {
    const T seen = value.load(std::memory_order_acquire);
    if (done(seen)) return;
    value.wait(seen, std::memory_order_acquire);
  }
}

}  // namespace

Result<std::unique_ptr<EnvPool>> EnvPool::Make(const Factory& factory,
                                               const EnvPoolOptions& options) {
  if (options.num_envs < 1) {
    return InvalidArgument("env pool: num_envs must be >= 1, got " +
                           std::to_string(options.num_envs));
  }
  if (options.num_threads < 1) {
    return InvalidArgument("env pool: num_threads must be >= 1, got " +
                           std::to_string(options.num_threads));
  }
  std::vector<std::unique_ptr<Env>> envs;
  for (int i = 0; i < options.num_envs; ++i) {
    Result<std::unique_ptr<Env>> env = factory();
    if (!env.ok()) return env.status().WithContext("env pool: building env " + std::to_string(i));
    if (i > 0 && ((*env)->observation_space() != envs.front()->observation_space() ||
                  (*env)->action_space() != envs.front()->action_space())) {
      return InvalidArgument("env pool: env " + std::to_string(i) +
                             " has other spaces than env 0; every copy must be alike");
    }
    envs.push_back(std::move(env).value());
  }
  return std::unique_ptr<EnvPool>(new EnvPool(std::move(envs), options));
}

EnvPool::EnvPool(std::vector<std::unique_ptr<Env>> envs, const EnvPoolOptions& options)
    : num_envs_(options.num_envs),
      num_threads_(std::min(options.num_threads, options.num_envs)),
      seed_(options.seed),
      obs_size_(envs.front()->observation_space().size()),
      act_size_(envs.front()->action_space().size()),
      envs_(std::move(envs)) {
  const auto n = static_cast<size_t>(num_envs_);
  obs_.assign(n * obs_size_, 0.0f);
  final_obs_.assign(n * obs_size_, 0.0f);
  actions_.assign(n * act_size_, 0.0f);
  rewards_.assign(n, 0.0f);
  episode_returns_.assign(n, 0.0f);
  running_returns_.assign(n, 0.0f);
  terminated_.assign(n, 0);
  truncated_.assign(n, 0);
  episode_lengths_.assign(n, 0);
  running_lengths_.assign(n, 0);
  // About 8 chunks per thread: small enough to rebalance, large enough that
  // claiming one (an atomic add) is noise next to stepping its envs.
  chunk_size_ = std::max(1, num_envs_ / (num_threads_ * 8));
  num_chunks_ = (num_envs_ + chunk_size_ - 1) / chunk_size_;
  for (int w = 1; w < num_threads_; ++w) workers_.emplace_back([this] { WorkerLoop(); });
}

EnvPool::~EnvPool() {
  stop_.store(true, std::memory_order_release);
  generation_.fetch_add(1, std::memory_order_acq_rel);
  generation_.notify_all();
  for (auto& t : workers_) t.join();
}

void EnvPool::Reset(std::optional<uint64_t> seed) {
  const uint64_t base = seed.value_or(seed_);
  for (int i = 0; i < num_envs_; ++i) {
    const auto k = static_cast<size_t>(i);
    envs_[k]->Reset(base + static_cast<uint64_t>(i),
                    std::span<float>(obs_).subspan(k * obs_size_, obs_size_));
    running_returns_[k] = 0.0f;
    running_lengths_[k] = 0;
    terminated_[k] = truncated_[k] = 0;
    rewards_[k] = 0.0f;
  }
}

void EnvPool::StepRange(int begin, int end) {
  for (int i = begin; i < end; ++i) {
    const auto k = static_cast<size_t>(i);
    const std::span<float> obs = std::span<float>(obs_).subspan(k * obs_size_, obs_size_);
    const StepResult r =
        envs_[k]->Step(std::span<const float>(actions_).subspan(k * act_size_, act_size_), obs);
    rewards_[k] = r.reward;
    terminated_[k] = r.terminated;
    truncated_[k] = r.truncated;
    running_returns_[k] += r.reward;
    running_lengths_[k] += 1;
    if (r.terminated || r.truncated) {
      std::copy(obs.begin(), obs.end(), final_obs_.begin() + static_cast<ptrdiff_t>(k * obs_size_));
      episode_returns_[k] = running_returns_[k];
      episode_lengths_[k] = running_lengths_[k];
      running_returns_[k] = 0.0f;
      running_lengths_[k] = 0;
      envs_[k]->Reset(std::nullopt, obs);
    }
  }
}

void EnvPool::Step() {
  if (num_threads_ == 1) {
    StepRange(0, num_envs_);
    return;
  }
  // Chunks are claimed from a shared counter rather than fixed per thread, so
  // a worker the OS has descheduled costs at most its in-flight chunk: the
  // others take the rest. Every env is stepped exactly once either way, so
  // results do not depend on which thread stepped it.
  done_chunks_.store(0, std::memory_order_relaxed);
  next_chunk_.store(0, std::memory_order_release);
  generation_.fetch_add(1, std::memory_order_acq_rel);
  generation_.notify_all();
  StepChunks();
  SpinThenWait(done_chunks_, [this](int d) { return d == num_chunks_; });
}

void EnvPool::StepChunks() {
  for (;;) {
    const int chunk = next_chunk_.fetch_add(1, std::memory_order_acq_rel);
    if (chunk >= num_chunks_) return;
    StepRange(chunk * chunk_size_, std::min(num_envs_, (chunk + 1) * chunk_size_));
    if (done_chunks_.fetch_add(1, std::memory_order_acq_rel) + 1 == num_chunks_) {
      done_chunks_.notify_one();
    }
  }
}

void EnvPool::WorkerLoop() {
  // Generations start at 0 before any worker exists; reading the counter here
  // instead would miss a Step() issued before this thread got scheduled. A
  // worker that wakes late finds the chunks taken (or takes the next Step's,
  // which are ready: Step() publishes them only after the actions are written).
  uint32_t seen = 0;
  for (;;) {
    SpinThenWait(generation_, [seen](uint32_t g) { return g != seen; });
    seen = generation_.load(std::memory_order_acquire);
    if (stop_.load(std::memory_order_acquire)) return;
    StepChunks();
  }
}

}  // namespace agentrt
