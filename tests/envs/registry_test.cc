#include "envs/registry.h"

#include <catch2/catch.hpp>
#include <vector>

#include "envs/dummy.h"

TEST_CASE("the registry builds the built-in envs by name with parameters") {
  agentrt::EnvRegistry r = agentrt::EnvRegistry::WithBuiltins();
  CHECK(r.Names() == std::vector<std::string>{"cartpole", "dummy", "pursuit"});
  CHECK(r.IsMultiAgent("pursuit"));
  CHECK_FALSE(r.IsMultiAgent("cartpole"));
  auto dummy = r.MakeEnv("dummy", {{"n", 6}});
  REQUIRE(dummy.ok());
  CHECK((*dummy)->action_space().n() == 6);
  auto pursuit = r.MakeMultiAgentEnv("pursuit", {{"predators", 3}, {"capture_k", 3}});
  REQUIRE(pursuit.ok());
  CHECK((*pursuit)->num_agents() == 4);
}

TEST_CASE("the registry names what it knows when asked for an unknown env") {
  agentrt::EnvRegistry r = agentrt::EnvRegistry::WithBuiltins();
  auto missing = r.MakeEnv("cartpol");
  REQUIRE_FALSE(missing.ok());
  CHECK(missing.status().code() == agentrt::StatusCode::kNotFound);
  CHECK_THAT(missing.status().message(), Catch::Contains("cartpol"));
  CHECK_THAT(missing.status().message(), Catch::Contains("cartpole, dummy, pursuit"));
  auto single = r.MakeMultiAgentEnv("cartpole");
  REQUIRE_FALSE(single.ok());
  CHECK_THAT(single.status().message(), Catch::Contains("single-agent"));
}

TEST_CASE("a user env registers once and is then built like a built-in") {
  agentrt::EnvRegistry r;
  CHECK(r.RegisterEnv("lights", agentrt::MakeDummyEnv).ok());
  const agentrt::Status again = r.RegisterEnv("lights", agentrt::MakeDummyEnv);
  CHECK(again.code() == agentrt::StatusCode::kAlreadyExists);
  auto env = r.MakeEnv("lights", {{"length", 2}});
  REQUIRE(env.ok());
  std::vector<float> obs(4);
  (*env)->Reset(0, obs);
  const float a = 0.0f;
  CHECK_FALSE((*env)->Step({&a, 1}, obs).truncated);
  CHECK((*env)->Step({&a, 1}, obs).truncated);
}

TEST_CASE("the dummy env pays 1 exactly when the lit index is named") {
  agentrt::DummyEnv env(5, 100);
  std::vector<float> obs(5);
  env.Reset(11, obs);
  for (int t = 0; t < 50; ++t) {
    const int lit = env.lit();
    REQUIRE(obs[static_cast<size_t>(lit)] == 1.0f);
    const float right = static_cast<float>(lit);
    const float wrong = static_cast<float>((lit + 1) % 5);
    REQUIRE(env.Step({t % 2 ? &right : &wrong, 1}, obs).reward == (t % 2 ? 1.0f : 0.0f));
  }
}
