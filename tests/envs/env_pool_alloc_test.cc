// The pool's step path does not allocate: this binary replaces the global
// operator new/delete and counts every allocation while stepping.
#include <catch2/catch.hpp>

#include "envs/env_pool.h"
#include "envs/registry.h"
#include "tests/common/counting_new.h"

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
    const long before = agentrt::testing::AllocationCount();
    for (int t = 0; t < 2000; ++t) {
      for (int i = 0; i < p.num_envs(); ++i) p.actions()[i] = static_cast<float>((t + i) % 2);
      p.Step();
      for (int i = 0; i < p.num_envs(); ++i) episodes += p.terminated()[i] || p.truncated()[i];
    }
    const long allocations = agentrt::testing::AllocationCount() - before;
    CHECK(allocations == 0);
    CHECK(episodes > 16);  // auto-resets happened inside the counted window
  }
}
