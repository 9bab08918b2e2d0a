// agentrt::EnvRegistry — builds environments by name from JSON parameters, so
// agent-worker can turn a plan's `args: {env: cartpole, env_args: {...}}` into
// an env. Built-ins: "cartpole", "dummy" (single-agent), "pursuit"
// (multi-agent).
//
// MakeEnv on a multi-agent name returns a SingleAgentView (envs/single_agent_view.h)
// of it: the agent named by the parameter "control" (default: agent 0) is the
// learner's; the others act uniformly at random until
// SingleAgentView::set_others_policy installs a policy for them.
//
// Thread-safety: all methods may be called from any thread (a mutex guards the
// table; factories themselves run outside it).
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "envs/env.h"
#include "envs/world_sides.h"

namespace agentrt {

using EnvFactory = std::function<Result<std::unique_ptr<Env>>(const nlohmann::json& params)>;
using MultiAgentEnvFactory =
    std::function<Result<std::unique_ptr<MultiAgentEnv>>(const nlohmann::json& params)>;

class EnvRegistry {
 public:
  // An empty registry (see WithBuiltins / GlobalEnvRegistry for the built-ins).
  EnvRegistry() = default;
  EnvRegistry(const EnvRegistry& other);
  // A registry holding cartpole, dummy and pursuit.
  static EnvRegistry WithBuiltins();

  // ALREADY_EXISTS when the name is taken (by either kind).
  Status RegisterEnv(std::string name, EnvFactory factory);
  // `sides`: how agents play the world (roles empty: a world without sides).
  Status RegisterMultiAgentEnv(std::string name, MultiAgentEnvFactory factory,
                               WorldSides sides = {});

  // NOT_FOUND names the known envs; the factory's own errors come back as they are.
  Result<std::unique_ptr<Env>> MakeEnv(std::string_view name,
                                       const nlohmann::json& params = nullptr) const;
  // Only for multi-agent names.
  Result<std::unique_ptr<MultiAgentEnv>> MakeMultiAgentEnv(
      std::string_view name, const nlohmann::json& params = nullptr) const;

  bool Contains(std::string_view name) const;
  bool IsMultiAgent(std::string_view name) const;
  // The sides of multi-agent env `name`; nullopt for a world without sides
  // or a name that is not a multi-agent env.
  std::optional<WorldSides> SidesOf(std::string_view name) const;
  // Sorted.
  std::vector<std::string> Names() const;

 private:
  // AlreadyExists when either kind has `name`. The caller holds mu_.
  Status NameFree(const std::string& name) const;

  std::string Known() const;  // caller holds mu_

  mutable std::mutex mu_;
  std::map<std::string, EnvFactory, std::less<>> single_;
  std::map<std::string, MultiAgentEnvFactory, std::less<>> multi_;
  std::map<std::string, WorldSides, std::less<>> sides_;
};

// The process-wide registry, created with the built-ins on first use. Register
// your own envs here before agent-worker (or your trainer) looks them up.
EnvRegistry& GlobalEnvRegistry();

}  // namespace agentrt
