// The deterministic shard contents of the crash-consistency test (helper and test).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace agentrt::testing {

// The words of `rank`'s shard at `step`; the size varies from step to step.
inline std::vector<uint64_t> CrashPattern(int64_t step, int rank) {
  size_t words = 2048 + static_cast<size_t>((step * 7919 + rank * 104729) % 30000);
  std::vector<uint64_t> v(words);
  for (size_t i = 0; i < words; ++i)
    v[i] = static_cast<uint64_t>(step) * 1000003u + i * 31u + static_cast<uint64_t>(rank);
  return v;
}

}  // namespace agentrt::testing
