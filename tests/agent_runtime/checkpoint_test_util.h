// Checkpoints of global slices for the checkpoint tests: a float array split
// over the ranks of a group (threads as ranks), saved and restored at any
// world size.
#pragma once

#include <catch2/catch.hpp>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "agent_runtime/checkpointer.h"

namespace agentrt::testing {

inline CheckpointOptions GlobalOptions(const std::string& dir, int rank, int world) {
  return {.dir = dir, .agent = "learner-0", .rank = rank, .world_size = world, .interval_s = 0};
}

// A global array of `n` floats split over `world` ranks in uneven blocks (rank
// r holds [Split(n, world, r), Split(n, world, r + 1))), and a step counter
// saved by rank 0 alone: the shape of ZeRO state.
inline uint64_t Split(uint64_t n, int world, int r) {
  return n * static_cast<uint64_t>(r) * static_cast<uint64_t>(r + 1) /
         (static_cast<uint64_t>(world) * static_cast<uint64_t>(world + 1));
}

inline float Value(int64_t step, uint64_t i) {
  return static_cast<float>(step) * 1e4f + static_cast<float>(i);
}

// Runs fn(rank) on `world` threads, each a rank with its own Checkpointer.
template <typename Fn>
void OnRanks(int world, Fn fn) {
  std::vector<std::thread> ranks;
  for (int r = 0; r < world; ++r) ranks.emplace_back([&fn, r] { fn(r); });
  for (auto& t : ranks) t.join();
}

inline void SaveGlobal(const std::string& root, int world, int64_t step, uint64_t n) {
  std::vector<Status> results(static_cast<size_t>(world));
  OnRanks(world, [&](int r) {
    auto c = Checkpointer::Create(GlobalOptions(root, r, world));
    if (!c.ok()) {
      results[static_cast<size_t>(r)] = c.status();
      return;
    }
    const uint64_t lo = Split(n, world, r), hi = Split(n, world, r + 1);
    std::vector<float> mine(hi - lo);
    for (uint64_t i = lo; i < hi; ++i) mine[i - lo] = Value(step, i);
    CheckpointState s;
    s.AddSlice("w", mine.data(), "float32", sizeof(float), {static_cast<int64_t>(n)}, lo, hi - lo);
    if (r == 0) s.AddSlice("count", &step, "int64", sizeof step, {1}, 0, 1);
    results[static_cast<size_t>(r)] = (*c)->Save(step, s);
  });
  for (const Status& s : results) REQUIRE(s.ok());
}

// Every rank of `world` restores its own block of "w" and the counter.
inline void RestoreGlobal(const std::string& root, int world, int64_t step, uint64_t n,
                          bool verify_all = true) {
  std::vector<std::string> errors(static_cast<size_t>(world));
  OnRanks(world, [&](int r) {
    auto& error = errors[static_cast<size_t>(r)];
    auto o = GlobalOptions(root, r, world);
    o.verify_all_shards = verify_all;
    auto c = Checkpointer::Create(o);
    auto restored = c.ok() ? (*c)->Restore() : Result<RestoreResult>(c.status());
    if (!restored.ok() || !restored->restored() || restored->step != step ||
        restored->saved == nullptr) {
      error = "rank " + std::to_string(r) + ": not restored at step " + std::to_string(step) +
              (restored.ok() ? " " + restored->Describe() : ": " + restored.status().message());
      return;
    }
    const uint64_t lo = Split(n, world, r), hi = Split(n, world, r + 1);
    std::vector<float> mine(hi - lo);
    Status read = restored->saved->Read("w", lo, hi - lo, mine.data());
    int64_t count = -1;
    if (read.ok()) read = restored->saved->Read("count", 0, 1, &count);
    if (!read.ok()) {
      error = read.message();
      return;
    }
    for (uint64_t i = lo; i < hi; ++i) {
      if (mine[i - lo] != Value(step, i)) {
        error = "rank " + std::to_string(r) + ": element " + std::to_string(i) + " differs";
        return;
      }
    }
    if (count != step) error = "rank " + std::to_string(r) + ": counter " + std::to_string(count);
  });
  for (const auto& e : errors) CHECK(e == "");
}

}  // namespace agentrt::testing
