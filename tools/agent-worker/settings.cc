#include "tools/agent-worker/settings.h"

#include <fstream>

#include "envs/params.h"

namespace agentrt::worker {

Result<WorkerSettings> WorkerSettings::FromArgs(const nlohmann::json& args, const std::string& owner) {
  Params p(args, owner);
  WorkerSettings s;
  s.env = p.Get("env", s.env);
  s.env_args = p.Get("env_args", s.env_args);
  s.algo = p.Get("algo", s.algo);
  s.role = p.Get("role", s.role);
  s.snapshot_every = p.Get("snapshot_every", s.snapshot_every);
  s.eval_episodes = p.Get("eval_episodes", s.eval_episodes);
  s.checkpoint_interval_s = p.Get("checkpoint_interval_s", s.checkpoint_interval_s);
  s.env_threads = p.Get("env_threads", s.env_threads);
  s.report_every = p.Get("report_every", s.report_every);
  s.ppo.Read(p);
  if (s.algo != "ppo") p.Invalid("algo", "must be \"ppo\" (the only algorithm agent-worker has), got \"" + s.algo + "\"");
  if (!s.env_args.is_object() && !s.env_args.is_null()) p.Invalid("env_args", "must be a mapping");
  if (!s.role.empty() && s.role != "predator" && s.role != "prey") {
    p.Invalid("role", "must be \"predator\" or \"prey\", got \"" + s.role + "\"");
  }
  if (s.snapshot_every < 1) p.Invalid("snapshot_every", "must be at least 1");
  if (s.eval_episodes < 0) p.Invalid("eval_episodes", "must not be negative");
  if (s.env_threads < 1) p.Invalid("env_threads", "must be at least 1");
  if (s.report_every < 1) p.Invalid("report_every", "must be at least 1");
  AGENTRT_RETURN_IF_ERROR(p.Finish());
  if (Status v = s.ppo.Validate(); !v.ok()) return v.WithContext(owner);
  if (s.env_args.is_null()) s.env_args = nlohmann::json::object();
  return s;
}

Result<std::vector<PlanAgentArgs>> ReadPlanAgents(const std::string& path) {
  std::ifstream in(path);
  if (!in) return NotFound("cannot open " + path + " (agent-worker is meant to be started by agentctl run)");
  const nlohmann::json plan = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (!plan.is_object()) return InvalidArgument(path + ": not a JSON object");
  if (!plan.contains("agents") || !plan["agents"].is_array()) return InvalidArgument(path + ": no agents list");
  std::vector<PlanAgentArgs> agents;
  const auto& list = plan["agents"];
  for (size_t i = 0; i < list.size(); ++i) {
    const auto& a = list[i];
    const std::string where = path + ": agents[" + std::to_string(i) + "]";
    try {
      PlanAgentArgs entry;
      entry.name = a.at("name").get<std::string>();
      entry.ranks = a.value("ranks", 1);
      entry.backend = a.value("backend", "");
      if (a.contains("args") && !a["args"].is_null()) entry.args = a["args"];
      if (a.contains("checkpoint") && a["checkpoint"].is_object()) {
        entry.checkpoint_interval_s = a["checkpoint"].value("interval_s", -1.0);
        entry.checkpoint_keep_last = a["checkpoint"].value("keep_last", 0);
      }
      agents.push_back(std::move(entry));
    } catch (const nlohmann::json::exception& e) {
      return InvalidArgument(where + ": " + e.what());
    }
  }
  return agents;
}

Result<Seating> SeatPursuit(const std::vector<PlanAgentArgs>& agents, const std::string& me,
                            const WorkerSettings& settings) {
  std::vector<std::string> predators, prey;
  for (const auto& a : agents) {
    if (!a.args.is_object() || a.args.value("env", "") != settings.env) continue;
    const std::string role = a.args.value("role", "");
    if (role == "predator") predators.push_back(a.name);
    if (role == "prey") prey.push_back(a.name);
  }
  if (settings.role.empty()) {
    return InvalidArgument("agent " + me + ": env " + settings.env +
                           " is multi-agent: args need role: predator or role: prey");
  }
  Seating s;
  s.world_args = settings.env_args;
  const int capture_k = s.world_args.value("capture_k", 2);
  s.predators = s.world_args.value("predators", std::max<int>(capture_k, static_cast<int>(predators.size())));
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
                           std::to_string(s.predators) + " predators and " + std::to_string(s.prey) +
                           " prey (env_args predators/prey)");
  }
  s.world_args["control"] = s.control;
  return s;
}

}  // namespace agentrt::worker
