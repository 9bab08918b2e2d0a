#include "tools/agent-worker/settings.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <optional>

#include "envs/params.h"
#include "envs/registry.h"

namespace agentrt::worker {

Result<WorkerSettings> WorkerSettings::FromArgs(const nlohmann::json& args,
                                                const std::string& owner) {
  Params p(args, owner);
  WorkerSettings s;
  s.trainer.Read(p);
  WorkerSettings& out = s;
  AGENTRT_WORKER_SETTINGS(AGENTRT_PARAM_READ)
  if (s.algo != "ppo")
    p.Invalid("algo",
              "must be \"ppo\" (the only algorithm agent-worker has), got \"" + s.algo + "\"");
  if (!s.trainer.env_args.is_object() && !s.trainer.env_args.is_null())
    p.Invalid("env_args", "must be a mapping");
  if (!s.role.empty()) {
    // A side of the env's world (envs/world_sides.h).
    const std::optional<WorldSides> sides = GlobalEnvRegistry().SidesOf(s.trainer.env);
    if (!sides) {
      p.Invalid("role", "is only for a multi-agent world with sides to play; env " + s.trainer.env +
                            " has none, got \"" + s.role + "\"");
    } else if (sides->SideOf(s.role) < 0) {
      p.Invalid("role", fmt::format("must be \"{}\", got \"{}\"",
                                    fmt::join(sides->roles, "\" or \""), s.role));
    }
  }
  if (s.snapshot_every < 1) p.Invalid("snapshot_every", "must be at least 1");
  if (s.eval_episodes < 0) p.Invalid("eval_episodes", "must not be negative");
  if (s.report_every < 1) p.Invalid("report_every", "must be at least 1");
  if (s.match_every < 1) p.Invalid("match_every", "must be at least 1");
  AGENTRT_RETURN_IF_ERROR(p.Finish());
  if (Status v = s.trainer.ppo.Validate(); !v.ok()) return v.WithContext(owner);
  if (s.trainer.env_args.is_null()) s.trainer.env_args = nlohmann::json::object();
  return s;
}

std::optional<std::pair<std::string, std::string>> CheckArgs(const nlohmann::json& args) {
  Result<WorkerSettings> s = WorkerSettings::FromArgs(args, "agent-worker args");
  if (s.ok()) return std::nullopt;
  return std::make_pair(Params::KeyOfError(s.status()), s.status().message());
}

int Seating::SideOfSeat(int seat) const {
  for (size_t i = 0; i < first.size(); ++i) {
    if (seat >= first[i] && seat < first[i] + count[i]) return static_cast<int>(i);
  }
  return -1;
}

namespace {

// The sides of `settings`'s env; an error naming the agent when it has none.
Result<WorldSides> SidesOfEnv(const std::string& me, const WorkerSettings& settings) {
  std::optional<WorldSides> sides = GlobalEnvRegistry().SidesOf(settings.trainer.env);
  if (!sides) {
    return InvalidArgument("agent " + me + ": env " + settings.trainer.env +
                           " has no sides to play");
  }
  return std::move(*sides);
}

// The seating of `settings`'s world of `sides` with `world_args` (sized), this
// agent on its role's side; the seats of each side from the world itself.
Result<Seating> SidesOfWorld(const std::string& me, const WorkerSettings& settings,
                             WorldSides sides, nlohmann::json world_args) {
  const std::string& env = settings.trainer.env;
  Seating s;
  s.sides = std::move(sides);
  s.side = s.sides.SideOf(settings.role);
  if (s.side < 0) {
    return InvalidArgument("agent " + me + ": env " + env + " is multi-agent: args need role: " +
                           fmt::format("{}", fmt::join(s.sides.roles, " or role: ")));
  }
  AGENTRT_ASSIGN_OR_RETURN(auto world, GlobalEnvRegistry().MakeMultiAgentEnv(env, world_args));
  s.count = world->side_seats();
  if (s.count.size() != s.sides.roles.size()) {
    return Internal("env " + env + " has " + std::to_string(s.count.size()) +
                    " sides of seats for " + std::to_string(s.sides.roles.size()) + " roles");
  }
  int next = 0;
  for (int n : s.count) {
    s.first.push_back(next);
    next += n;
  }
  s.world_args = std::move(world_args);
  return s;
}

}  // namespace

Result<Seating> SeatLeague(const std::string& me, const WorkerSettings& settings) {
  AGENTRT_ASSIGN_OR_RETURN(WorldSides sides, SidesOfEnv(me, settings));
  Result<nlohmann::json> one_each = sides.one_each(settings.trainer.env_args);
  if (!one_each.ok()) return InvalidArgument("agent " + me + ": " + one_each.status().message());
  AGENTRT_ASSIGN_OR_RETURN(Seating s,
                           SidesOfWorld(me, settings, std::move(sides), std::move(*one_each)));
  s.control = s.first[static_cast<size_t>(s.side)];
  for (size_t i = 0; i < s.first.size(); ++i) {
    // The league's pick plays every other side's seat.
    if (static_cast<int>(i) != s.side) s.others[s.first[i]] = std::string(kLeagueServiceName);
  }
  s.world_args["control"] = s.control;
  return s;
}

Result<Seating> SeatWorld(const Plan& plan, const std::string& me, const WorkerSettings& settings) {
  AGENTRT_ASSIGN_OR_RETURN(WorldSides sides, SidesOfEnv(me, settings));
  // The plan's agents of this env, by side, in plan order.
  std::vector<std::vector<std::string>> players(sides.roles.size());
  for (const AgentPlan& a : plan.agents) {
    if (!a.args.is_object() || a.args.value("env", "") != settings.trainer.env) continue;
    const int side = sides.SideOf(a.args.value("role", ""));
    if (side >= 0) players[static_cast<size_t>(side)].push_back(a.name);
  }
  std::vector<int> counts;
  for (const auto& side : players) counts.push_back(static_cast<int>(side.size()));
  nlohmann::json world_args = sides.sized(settings.trainer.env_args, counts);
  AGENTRT_ASSIGN_OR_RETURN(Seating s,
                           SidesOfWorld(me, settings, std::move(sides), std::move(world_args)));
  s.control = -1;
  for (size_t side = 0; side < players.size(); ++side) {
    const std::vector<std::string>& agents = players[side];
    for (size_t i = 0; i < agents.size() && static_cast<int>(i) < s.count[side]; ++i) {
      const int seat = s.first[side] + static_cast<int>(i);
      if (agents[i] == me) {
        s.control = seat;
      } else {
        s.others[seat] = agents[i];
      }
    }
  }
  if (s.control < 0) {
    std::string sizes;
    for (size_t i = 0; i < s.count.size(); ++i)
      sizes += fmt::format("{}{} {}", i == 0 ? "" : " and ", s.count[i], s.sides.roles[i]);
    return InvalidArgument("agent " + me + ": no " + settings.role + " seat left in a world of " +
                           sizes + " seats (env_args)");
  }
  s.world_args["control"] = s.control;
  return s;
}

}  // namespace agentrt::worker
