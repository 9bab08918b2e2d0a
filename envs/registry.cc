#include "envs/registry.h"

#include <algorithm>

#include "envs/cartpole.h"
#include "envs/dummy.h"
#include "envs/pursuit.h"
#include "envs/single_agent_view.h"

namespace agentrt {

EnvRegistry::EnvRegistry(const EnvRegistry& other) {
  std::lock_guard<std::mutex> lock(other.mu_);
  single_ = other.single_;
  multi_ = other.multi_;
  sides_ = other.sides_;
}

EnvRegistry EnvRegistry::WithBuiltins() {
  EnvRegistry r;
  // Distinct names into an empty registry: these cannot clash.
  r.RegisterEnv("cartpole", MakeCartPole).IgnoreError();
  r.RegisterEnv("dummy", MakeDummyEnv).IgnoreError();
  r.RegisterMultiAgentEnv("pursuit", MakePursuit, PursuitSides()).IgnoreError();
  return r;
}

Status EnvRegistry::NameFree(const std::string& name) const {
  if (single_.count(name) || multi_.count(name)) {
    return {StatusCode::kAlreadyExists, "env '" + name + "' is already registered"};
  }
  return Status::Ok();
}

Status EnvRegistry::RegisterEnv(std::string name, EnvFactory factory) {
  std::lock_guard<std::mutex> lock(mu_);
  AGENTRT_RETURN_IF_ERROR(NameFree(name));
  single_.emplace(std::move(name), std::move(factory));
  return Status::Ok();
}

Status EnvRegistry::RegisterMultiAgentEnv(std::string name, MultiAgentEnvFactory factory,
                                          WorldSides sides) {
  std::lock_guard<std::mutex> lock(mu_);
  AGENTRT_RETURN_IF_ERROR(NameFree(name));
  // Factory and sides under one lock: nobody sees the env without its sides.
  if (!sides.roles.empty()) sides_.emplace(name, std::move(sides));
  multi_.emplace(std::move(name), std::move(factory));
  return Status::Ok();
}

std::optional<WorldSides> EnvRegistry::SidesOf(std::string_view name) const {
  std::lock_guard<std::mutex> lock(mu_);
  if (auto it = sides_.find(name); it != sides_.end()) return it->second;
  return std::nullopt;
}

std::string EnvRegistry::Known() const {
  std::string out;
  for (const auto& [name, f] : single_) out += (out.empty() ? "" : ", ") + name;
  for (const auto& [name, f] : multi_) out += (out.empty() ? "" : ", ") + name;
  return out;
}

Result<std::unique_ptr<Env>> EnvRegistry::MakeEnv(std::string_view name,
                                                  const nlohmann::json& params) const {
  EnvFactory single;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (auto it = single_.find(name); it != single_.end()) {
      single = it->second;
    } else if (!multi_.count(name)) {
      return NotFound("unknown env '" + std::string(name) + "' (known: " + Known() + ")");
    }
  }
  if (single) return single(params);

  // A multi-agent env seen by one agent: "control" picks the agent by name or index.
  nlohmann::json world_params = params.is_object() ? params : nlohmann::json::object();
  nlohmann::json control = world_params.value("control", nlohmann::json(0));
  world_params.erase("control");
  AGENTRT_ASSIGN_OR_RETURN(std::unique_ptr<MultiAgentEnv> world,
                           MakeMultiAgentEnv(name, world_params));
  int controlled = -1;
  if (control.is_number_integer()) {
    controlled = control.get<int>();
  } else if (control.is_string()) {
    for (int i = 0; i < world->num_agents(); ++i) {
      if (world->agent_name(i) == control.get<std::string>()) controlled = i;
    }
  }
  if (controlled < 0 || controlled >= world->num_agents()) {
    std::string names;
    for (int i = 0; i < world->num_agents(); ++i) {
      names += (i ? ", " : "") + std::string(world->agent_name(i));
    }
    return InvalidArgument("env " + std::string(name) + ": parameter 'control' names no agent: " +
                           control.dump() + " (agents: " + names + ")");
  }
  return std::unique_ptr<Env>(std::make_unique<SingleAgentView>(std::move(world), controlled));
}

Result<std::unique_ptr<MultiAgentEnv>> EnvRegistry::MakeMultiAgentEnv(
    std::string_view name, const nlohmann::json& params) const {
  MultiAgentEnvFactory factory;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = multi_.find(name);
    if (it == multi_.end()) {
      if (single_.count(name)) {
        return InvalidArgument("env '" + std::string(name) + "' is single-agent; use MakeEnv");
      }
      return NotFound("unknown env '" + std::string(name) + "' (known: " + Known() + ")");
    }
    factory = it->second;
  }
  return factory(params);
}

bool EnvRegistry::Contains(std::string_view name) const {
  std::lock_guard<std::mutex> lock(mu_);
  return single_.count(name) || multi_.count(name);
}

bool EnvRegistry::IsMultiAgent(std::string_view name) const {
  std::lock_guard<std::mutex> lock(mu_);
  return multi_.count(name) != 0;
}

std::vector<std::string> EnvRegistry::Names() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::string> out;
  for (const auto& [name, f] : single_) out.push_back(name);
  for (const auto& [name, f] : multi_) out.push_back(name);
  std::sort(out.begin(), out.end());
  return out;
}

EnvRegistry& GlobalEnvRegistry() {
  static EnvRegistry* registry = new EnvRegistry(EnvRegistry::WithBuiltins());
  return *registry;
}

}  // namespace agentrt
