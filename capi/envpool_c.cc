// Env pools through the C API: the registry's envs, single- or multi-agent,
// with the pool's own buffers handed out for zero-copy views.
#include <memory>
#include <string>
#include <type_traits>

#include "capi/c_api_internal.h"
#include "envs/env_pool.h"
#include "envs/multi_agent_env_pool.h"
#include "envs/registry.h"

struct agentrt_envpool {
  std::string name;
  std::unique_ptr<agentrt::EnvPool> single;
  std::unique_ptr<agentrt::MultiAgentEnvPool> multi;
  std::vector<std::string> agent_names;
};

namespace {

// Buffer `which` of an EnvPool or a MultiAgentEnvPool (their accessors have the
// same names; only the multi-agent pool has `active`). False: no such buffer.
template <typename Pool>
bool BufferOf(Pool& p, int which, void** data, size_t* count) {
  auto give = [&](auto span) {
    *data = const_cast<void*>(static_cast<const void*>(span.data()));
    *count = span.size();
    return true;
  };
  switch (which) {
    case AGENTRT_BUFFER_OBSERVATIONS:
      return give(p.observations());
    case AGENTRT_BUFFER_FINAL_OBSERVATIONS:
      return give(p.final_observations());
    case AGENTRT_BUFFER_ACTIONS:
      return give(p.actions());
    case AGENTRT_BUFFER_REWARDS:
      return give(p.rewards());
    case AGENTRT_BUFFER_TERMINATED:
      return give(p.terminated());
    case AGENTRT_BUFFER_TRUNCATED:
      return give(p.truncated());
    case AGENTRT_BUFFER_EPISODE_RETURNS:
      return give(p.episode_returns());
    case AGENTRT_BUFFER_EPISODE_LENGTHS:
      return give(p.episode_lengths());
    case AGENTRT_BUFFER_ACTIVE:
      if constexpr (std::is_same_v<Pool, agentrt::MultiAgentEnvPool>) return give(p.active());
      return false;
    default:
      return false;
  }
}

nlohmann::json SpaceJson(const agentrt::Space& s) {
  nlohmann::json j = {{"kind", s.is_discrete() ? "discrete" : "box"},
                      {"n", s.n()},
                      {"shape", s.shape()},
                      {"size", s.size()},
                      {"repr", s.ToString()}};
  if (!s.is_discrete()) {
    // JSON has no infinity: unbounded entries are null.
    auto bounds = [](const std::vector<float>& v) {
      nlohmann::json out = nlohmann::json::array();
      for (float x : v) out.push_back(std::isfinite(x) ? nlohmann::json(x) : nlohmann::json());
      return out;
    };
    j["low"] = bounds(s.low());
    j["high"] = bounds(s.high());
  }
  return j;
}

}  // namespace

extern "C" {

int agentrt_envpool_create(const char* name, const char* params_json, int num_envs, int num_threads,
                           uint64_t seed, agentrt_envpool** out) {
  AGENTRT_C_REQUIRE(name, "name");
  AGENTRT_C_REQUIRE(out, "out");
  *out = nullptr;
  return Guard("agentrt_envpool_create", [&] {
    nlohmann::json params;
    if (Status s = agentrt::capi::ParseJsonArg(params_json, "params", &params); !s.ok())
      return Fail(s);
    const agentrt::EnvRegistry& registry = agentrt::GlobalEnvRegistry();
    if (!registry.Contains(name)) {
      // The registry's own message names the envs there are.
      return Fail(registry.MakeEnv(name, params).status());
    }
    agentrt::EnvPoolOptions options;
    options.num_envs = num_envs;
    options.num_threads = num_threads;
    options.seed = seed;
    auto pool = std::make_unique<agentrt_envpool>();
    pool->name = name;
    if (registry.IsMultiAgent(name)) {
      auto made = agentrt::MultiAgentEnvPool::Make(
          [&] { return registry.MakeMultiAgentEnv(name, params); }, options);
      if (!made.ok()) return Fail(made.status());
      pool->multi = std::move(made).value();
      for (int a = 0; a < pool->multi->num_agents(); ++a) {
        pool->agent_names.emplace_back(pool->multi->env(0).agent_name(a));
      }
    } else {
      auto made = agentrt::EnvPool::Make([&] { return registry.MakeEnv(name, params); }, options);
      if (!made.ok()) return Fail(made.status());
      pool->single = std::move(made).value();
    }
    *out = pool.release();
    return Ok();
  });
}

void agentrt_envpool_close(agentrt_envpool* pool) { delete pool; }

int agentrt_envpool_spec(const agentrt_envpool* pool, char** json_out) {
  AGENTRT_C_REQUIRE(pool, "env pool");
  return Guard("agentrt_envpool_spec", [&] {
    const bool multi = pool->multi != nullptr;
    const agentrt::Space& obs =
        multi ? pool->multi->observation_space() : pool->single->observation_space();
    const agentrt::Space& act = multi ? pool->multi->action_space() : pool->single->action_space();
    return JsonOut(
        {{"env", pool->name},
         {"num_envs", multi ? pool->multi->num_envs() : pool->single->num_envs()},
         {"num_threads", multi ? pool->multi->num_threads() : pool->single->num_threads()},
         {"num_agents", multi ? pool->multi->num_agents() : 0},
         {"agent_names", pool->agent_names},
         {"obs_size", obs.size()},
         {"act_size", act.size()},
         {"observation_space", SpaceJson(obs)},
         {"action_space", SpaceJson(act)}},
        json_out);
  });
}

int agentrt_envpool_reset(agentrt_envpool* pool, int has_seed, uint64_t seed) {
  AGENTRT_C_REQUIRE(pool, "env pool");
  return Guard("agentrt_envpool_reset", [&] {
    const std::optional<uint64_t> s = has_seed != 0 ? std::optional<uint64_t>(seed) : std::nullopt;
    if (pool->multi) {
      pool->multi->Reset(s);
    } else {
      pool->single->Reset(s);
    }
    return Ok();
  });
}

int agentrt_envpool_step(agentrt_envpool* pool) {
  AGENTRT_C_REQUIRE(pool, "env pool");
  if (pool->multi) {
    pool->multi->Step();
  } else {
    pool->single->Step();
  }
  return AGENTRT_OK;
}

int agentrt_envpool_buffer(agentrt_envpool* pool, int which, void** data, size_t* count) {
  AGENTRT_C_REQUIRE(pool, "env pool");
  AGENTRT_C_REQUIRE(data, "data");
  AGENTRT_C_REQUIRE(count, "count");
  const bool found = pool->multi ? BufferOf(*pool->multi, which, data, count)
                                 : BufferOf(*pool->single, which, data, count);
  if (found) return Ok();
  if (which == AGENTRT_BUFFER_ACTIVE && !pool->multi) {
    return Fail(agentrt::InvalidArgument("env '" + pool->name +
                                         "' is single-agent: it has no per-seat active buffer"));
  }
  return Fail(agentrt::InvalidArgument("no env pool buffer " + std::to_string(which)));
}

}  // extern "C"
