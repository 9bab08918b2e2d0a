// agentrt::ChunkRunner — runs one function over [0, n) in chunks on a fixed set
// of threads, the caller included: the stepping engine of EnvPool and
// MultiAgentEnvPool.
//
//   ChunkRunner runner(num_envs, num_threads, [this](int begin, int end) { StepRange(begin, end);
//   }); runner.Run();   // every index stepped exactly once; returns when all are
//
// Chunks are claimed from a shared counter rather than fixed per thread, so a
// worker the OS has descheduled costs at most its in-flight chunk: the others
// take the rest. Which thread ran an index never changes the result. Run()
// spins briefly, then sleeps on a futex; it does not allocate.
//
// Thread-safety: Run() from one thread at a time (the owner's).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <thread>
#include <vector>

namespace agentrt {

class ChunkRunner {
 public:
  // `threads` is capped at `n` (and at least 1); threads - 1 workers start here.
  ChunkRunner(int n, int threads, std::function<void(int begin, int end)> fn);
  ~ChunkRunner();
  ChunkRunner(const ChunkRunner&) = delete;
  ChunkRunner& operator=(const ChunkRunner&) = delete;

  void Run();
  int threads() const { return threads_; }

 private:
  void RunChunks();  // claims and runs chunks until none are left
  void WorkerLoop();

  int n_;
  int threads_;
  std::function<void(int, int)> fn_;
  int chunk_size_ = 1;
  int num_chunks_ = 1;
  std::atomic<uint32_t> generation_{0};  // bumped once per Run (and to stop)
  std::atomic<int> next_chunk_{0};       // the next chunk to claim in this Run
  std::atomic<int> done_chunks_{0};      // chunks finished in this Run
  std::atomic<bool> stop_{false};
  std::vector<std::thread> workers_;
};

}  // namespace agentrt
