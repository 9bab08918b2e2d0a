#include "envs/env_pool.h"

#include <catch2/catch.hpp>
#include <vector>

#include "envs/cartpole.h"
#include "envs/dummy.h"
#include "envs/registry.h"

namespace {

std::unique_ptr<agentrt::EnvPool> MakePool(const char* env, int num_envs, int threads,
                                           uint64_t seed) {
  auto pool =
      agentrt::EnvPool::Make([env] { return agentrt::GlobalEnvRegistry().MakeEnv(env, nullptr); },
                             {.num_envs = num_envs, .num_threads = threads, .seed = seed});
  REQUIRE(pool.ok());
  return std::move(pool).value();
}

// Observations, rewards and flags of `steps` steps under a fixed action pattern.
std::vector<float> Trace(agentrt::EnvPool& pool, int steps) {
  pool.Reset();
  std::vector<float> trace(pool.observations().begin(), pool.observations().end());
  for (int t = 0; t < steps; ++t) {
    for (int i = 0; i < pool.num_envs(); ++i)
      pool.actions()[i] = static_cast<float>((t * 7 + i * 3) % 5 % 2);
    pool.Step();
    trace.insert(trace.end(), pool.observations().begin(), pool.observations().end());
    trace.insert(trace.end(), pool.rewards().begin(), pool.rewards().end());
    for (int i = 0; i < pool.num_envs(); ++i) {
      trace.push_back(pool.terminated()[i]);
      trace.push_back(pool.truncated()[i]);
    }
  }
  return trace;
}

}  // namespace

TEST_CASE("env pool with the same seed gives the same trajectories on 1 and 3 threads") {
  auto one = MakePool("cartpole", 7, 1, 123);
  auto three = MakePool("cartpole", 7, 3, 123);
  CHECK(three->num_threads() == 3);
  const auto a = Trace(*one, 300);
  CHECK(a == Trace(*three, 300));
  CHECK(a == Trace(*one, 300));  // Reset() reseeds: repeatable
  auto other = MakePool("cartpole", 7, 3, 124);
  CHECK(a != Trace(*other, 300));
}

TEST_CASE("env pool env i is seeded with seed + i, like a lone env") {
  auto pool = MakePool("cartpole", 4, 2, 50);
  pool->Reset();
  agentrt::CartPole lone;
  std::vector<float> obs(4);
  lone.Reset(52, obs);
  for (size_t k = 0; k < 4; ++k) CHECK(pool->observations()[2 * 4 + k] == obs[k]);
}

TEST_CASE("env pool auto-resets a finished env and keeps its final observation and return") {
  auto pool = MakePool("cartpole", 3, 2, 7);
  pool->Reset();
  std::vector<float> expected_return(3, 0.0f);
  int finished = 0;
  for (int t = 0; t < 200 && finished < 3; ++t) {
    for (int i = 0; i < 3; ++i) pool->actions()[i] = 1.0f;  // always right: falls in ~10 steps
    pool->Step();
    for (size_t i = 0; i < 3; ++i) {
      expected_return[i] += pool->rewards()[i];
      if (!pool->terminated()[i]) continue;
      ++finished;
      CHECK(pool->episode_returns()[i] == expected_return[i]);
      CHECK(pool->episode_lengths()[i] == static_cast<int>(expected_return[i]));
      expected_return[i] = 0.0f;
      // The final observation is past a threshold; the new one is a fresh start.
      const float* fin = pool->final_observations().data() + i * 4;
      CHECK((std::abs(fin[0]) > 2.4f || std::abs(fin[2]) > 0.2094f));
      const float* now = pool->observations().data() + i * 4;
      for (int k = 0; k < 4; ++k) CHECK(std::abs(now[k]) <= 0.05f);
    }
  }
  CHECK(finished >= 3);
}

TEST_CASE("env pool rejects bad sizes and reports the failing env") {
  auto none =
      agentrt::EnvPool::Make([] { return agentrt::MakeCartPole(nullptr); }, {.num_envs = 0});
  REQUIRE_FALSE(none.ok());
  CHECK_THAT(none.status().message(), Catch::Contains("num_envs"));
  auto failing = agentrt::EnvPool::Make(
      [] {
        return agentrt::GlobalEnvRegistry().MakeEnv("cartpole", {{"bogus", 1}});
      },
      {.num_envs = 2});
  REQUIRE_FALSE(failing.ok());
  CHECK_THAT(failing.status().message(), Catch::Contains("building env 0"));
  CHECK_THAT(failing.status().message(), Catch::Contains("bogus"));
}

TEST_CASE("env pool steps the dummy env with per-env actions") {
  auto pool = MakePool("dummy", 5, 2, 1);
  pool->Reset();
  for (int t = 0; t < 40; ++t) {
    // Name the lit index: every step pays 1.
    for (int i = 0; i < 5; ++i) {
      const float* o = pool->observations().data() + i * 4;
      int lit = 0;
      for (int k = 0; k < 4; ++k) {
        if (o[k] == 1.0f) lit = k;
      }
      pool->actions()[i] = static_cast<float>(lit);
    }
    pool->Step();
    for (int i = 0; i < 5; ++i) REQUIRE(pool->rewards()[i] == 1.0f);
  }
  CHECK(pool->episode_returns()[0] == 16.0f);  // every env has finished 2 episodes of 16
}
