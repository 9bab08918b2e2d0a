// The pool's step path does not allocate: this binary replaces the global
// operator new/delete and counts every allocation while stepping.
#include <atomic>
#include <catch2/catch.hpp>
#include <cstdlib>
#include <new>

#include "envs/env_pool.h"
#include "envs/registry.h"

// GCC cannot see that malloc/free are the replaced operators' own pair.
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"

namespace {
std::atomic<long> g_allocations{0};
}

void* operator new(std::size_t size) {
  g_allocations.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(size == 0 ? 1 : size)) return p;
  throw std::bad_alloc();
}
void* operator new[](std::size_t size) { return operator new(size); }
void* operator new(std::size_t size, const std::nothrow_t&) noexcept {
  g_allocations.fetch_add(1, std::memory_order_relaxed);
  return std::malloc(size == 0 ? 1 : size);
}
void* operator new[](std::size_t size, const std::nothrow_t& tag) noexcept {
  return operator new(size, tag);
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }

TEST_CASE("the counter sees allocations (the test can fail)") {
  const long before = g_allocations.load();
  auto* v = new std::vector<int>(100);
  delete v;
  CHECK(g_allocations.load() - before >= 2);
}

TEST_CASE("env pool Step does not allocate, with auto-resets, on 2 threads") {
  for (const char* name : {"cartpole", "pursuit", "dummy"}) {
    INFO(name);
    auto pool = agentrt::EnvPool::Make(
        [name] { return agentrt::GlobalEnvRegistry().MakeEnv(name, nullptr); },
        {.num_envs = 16, .num_threads = 2, .seed = 3});
    REQUIRE(pool.ok());
    agentrt::EnvPool& p = **pool;
    p.Reset();
    p.Step();  // first step warms up anything lazy in the threads
    long episodes = 0;
    const long before = g_allocations.load();
    for (int t = 0; t < 2000; ++t) {
      for (int i = 0; i < p.num_envs(); ++i) p.actions()[i] = static_cast<float>((t + i) % 2);
      p.Step();
      for (int i = 0; i < p.num_envs(); ++i) episodes += p.terminated()[i] || p.truncated()[i];
    }
    const long allocations = g_allocations.load() - before;
    CHECK(allocations == 0);
    CHECK(episodes > 16);  // auto-resets happened inside the counted window
  }
}
