#include "tools/agent-worker/settings.h"

#include "envs/params.h"

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
  if (!s.role.empty() && s.role != "predator" && s.role != "prey") {
    p.Invalid("role", "must be \"predator\" or \"prey\", got \"" + s.role + "\"");
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

Result<Seating> SeatLeague(const std::string& me, const WorkerSettings& settings) {
  if (settings.role != "predator" && settings.role != "prey") {
    return InvalidArgument("agent " + me + ": env " + settings.trainer.env +
                           " is multi-agent: args need role: predator or role: prey");
  }
  Seating s;
  s.world_args = settings.trainer.env_args;
  if (s.world_args.value("predators", 1) != 1 || s.world_args.value("prey", 1) != 1 ||
      s.world_args.value("capture_k", 1) != 1) {
    return InvalidArgument("agent " + me +
                           ": league play is one predator against one prey: env_args predators, "
                           "prey and capture_k must be 1 (or unset)");
  }
  s.world_args["predators"] = 1;
  s.world_args["prey"] = 1;
  s.world_args["capture_k"] = 1;
  s.predators = 1;
  s.prey = 1;
  s.control = settings.role == "predator" ? 0 : 1;
  s.others[1 - s.control] = std::string(kLeagueServiceName);  // the league's pick plays it
  s.world_args["control"] = s.control;
  return s;
}

Result<Seating> SeatPursuit(const Plan& plan, const std::string& me,
                            const WorkerSettings& settings) {
  std::vector<std::string> predators, prey;
  for (const AgentPlan& a : plan.agents) {
    if (!a.args.is_object() || a.args.value("env", "") != settings.trainer.env) continue;
    const std::string role = a.args.value("role", "");
    if (role == "predator") predators.push_back(a.name);
    if (role == "prey") prey.push_back(a.name);
  }
  if (settings.role.empty()) {
    return InvalidArgument("agent " + me + ": env " + settings.trainer.env +
                           " is multi-agent: args need role: predator or role: prey");
  }
  Seating s;
  s.world_args = settings.trainer.env_args;
  const int capture_k = s.world_args.value("capture_k", 2);
  s.predators =
      s.world_args.value("predators", std::max<int>(capture_k, static_cast<int>(predators.size())));
  s.prey = s.world_args.value("prey", std::max<int>(1, static_cast<int>(prey.size())));
  s.world_args["predators"] = s.predators;
  s.world_args["prey"] = s.prey;
  auto seat_of = [&](const std::vector<std::string>& side, int first, int count) {
    for (size_t i = 0; i < side.size() && static_cast<int>(i) < count; ++i) {
      const int seat = first + static_cast<int>(i);
      if (side[i] == me) {
        s.control = seat;
      } else {
        s.others[seat] = side[i];
      }
    }
  };
  s.control = -1;
  seat_of(predators, 0, s.predators);
  seat_of(prey, s.predators, s.prey);
  if (s.control < 0) {
    return InvalidArgument("agent " + me + ": no " + settings.role + " seat left in a world of " +
                           std::to_string(s.predators) + " predators and " +
                           std::to_string(s.prey) + " prey (env_args predators/prey)");
  }
  s.world_args["control"] = s.control;
  return s;
}

}  // namespace agentrt::worker
