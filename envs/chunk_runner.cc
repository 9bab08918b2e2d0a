#include "envs/chunk_runner.h"

#include <algorithm>

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

ChunkRunner::ChunkRunner(int n, int threads, std::function<void(int, int)> fn)
    : n_(n), threads_(std::max(1, std::min(threads, n))), fn_(std::move(fn)) {
  // About 8 chunks per thread: small enough to rebalance, large enough that
  // claiming one (an atomic add) is noise next to running it.
  chunk_size_ = std::max(1, n_ / (threads_ * 8));
  num_chunks_ = (n_ + chunk_size_ - 1) / chunk_size_;
  for (int w = 1; w < threads_; ++w) workers_.emplace_back([this] { WorkerLoop(); });
}

ChunkRunner::~ChunkRunner() {
  stop_.store(true, std::memory_order_release);
  generation_.fetch_add(1, std::memory_order_acq_rel);
  generation_.notify_all();
  for (auto& t : workers_) t.join();
}

void ChunkRunner::Run() {
  if (threads_ == 1) {
    fn_(0, n_);
    return;
  }
  done_chunks_.store(0, std::memory_order_relaxed);
  next_chunk_.store(0, std::memory_order_release);
  generation_.fetch_add(1, std::memory_order_acq_rel);
  generation_.notify_all();
  RunChunks();
  SpinThenWait(done_chunks_, [this](int d) { return d == num_chunks_; });
}

void ChunkRunner::RunChunks() {
  for (;;) {
    const int chunk = next_chunk_.fetch_add(1, std::memory_order_acq_rel);
    if (chunk >= num_chunks_) return;
    fn_(chunk * chunk_size_, std::min(n_, (chunk + 1) * chunk_size_));
    if (done_chunks_.fetch_add(1, std::memory_order_acq_rel) + 1 == num_chunks_) {
      done_chunks_.notify_one();
    }
  }
}

void ChunkRunner::WorkerLoop() {
  // Generations start at 0 before any worker exists; reading the counter here
  // instead would miss a Run() issued before this thread got scheduled. A
  // worker that wakes late finds the chunks taken (or takes the next Run's,
  // which are ready: Run() publishes them only after the inputs are written).
  uint32_t seen = 0;
  for (;;) {
    SpinThenWait(generation_, [seen](uint32_t g) { return g != seen; });
    seen = generation_.load(std::memory_order_acquire);
    if (stop_.load(std::memory_order_acquire)) return;
    RunChunks();
  }
}

}  // namespace agentrt
