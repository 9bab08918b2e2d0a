// Replaces the global operator new/delete to count every allocation, for the
// tests that prove a hot path allocates nothing (the env pool's step, the
// flight recorder, the bus broker's publish and delivery). Include it in
// exactly one source file of a test binary (replacement operators are
// program-wide), and compare AllocationCount() before and after. It brings
// its own test case, proving the counter counts (so a "0" can fail).
#pragma once

#include <atomic>
#include <catch2/catch.hpp>
#include <cstdlib>
#include <new>
#include <vector>

namespace agentrt::testing {
inline std::atomic<long> g_allocation_count{0};
inline long AllocationCount() { return g_allocation_count.load(std::memory_order_relaxed); }
}  // namespace agentrt::testing

// GCC cannot see that malloc/free are the replaced operators' own pair.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"

void* operator new(std::size_t size) {
  agentrt::testing::g_allocation_count.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(size == 0 ? 1 : size)) return p;
  throw std::bad_alloc();
}
void* operator new[](std::size_t size) { return operator new(size); }
void* operator new(std::size_t size, const std::nothrow_t&) noexcept {
  agentrt::testing::g_allocation_count.fetch_add(1, std::memory_order_relaxed);
  return std::malloc(size == 0 ? 1 : size);
}
void* operator new[](std::size_t size, const std::nothrow_t& tag) noexcept {
  return operator new(size, tag);
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }

#pragma GCC diagnostic pop

TEST_CASE("the allocation counter counts (an allocation-free result can fail)") {
  const long before = agentrt::testing::AllocationCount();
  auto* v = new std::vector<int>(100);
  delete v;
  CHECK(agentrt::testing::AllocationCount() - before >= 2);
}
