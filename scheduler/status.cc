#include "scheduler/status.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <ctime>
#include <vector>

#include "common/file_util.h"

namespace agentrt {

namespace {
constexpr std::string_view kAgentStates[] = {"pending",   "running", "restarting",
                                             "succeeded", "failed",  "stopped"};
constexpr std::string_view kRunStates[] = {"running", "succeeded", "failed", "stopped"};

template <typename E, size_t N>
Result<E> ParseEnum(const std::string& s, const std::string_view (&names)[N], const char* what) {
  for (size_t i = 0; i < N; ++i) {
    if (names[i] == s) return static_cast<E>(i);
  }
  return InvalidArgument(std::string("status: unknown ") + what + " '" + s + "'");
}

std::string FormatMetric(const nlohmann::json& v) {
  if (v.is_number_integer()) return std::to_string(v.get<int64_t>());
  if (v.is_number()) return fmt::format("{:.4g}", v.get<double>());
  if (v.is_string()) return v.get<std::string>();
  return v.dump();
}
}  // namespace

std::string_view AgentStateName(AgentState state) { return kAgentStates[static_cast<int>(state)]; }
std::string_view RunStateName(RunState state) { return kRunStates[static_cast<int>(state)]; }
bool IsTerminal(AgentState state) {
  return state == AgentState::kSucceeded || state == AgentState::kFailed ||
         state == AgentState::kStopped;
}

const AgentStatus* RunStatus::FindAgent(std::string_view name) const {
  for (const auto& a : agents) {
    if (a.name == name) return &a;
  }
  return nullptr;
}

std::string_view ShownRunState(const RunStatus& status, bool controller_alive) {
  if (status.state == RunState::kRunning && !controller_alive) return "controller_gone";
  return RunStateName(status.state);
}

nlohmann::ordered_json RunStatusToJson(const RunStatus& status) {
  nlohmann::ordered_json j;
  j["run"] = status.run;
  j["state"] = RunStateName(status.state);
  j["agents"] = nlohmann::ordered_json::array();
  for (const auto& a : status.agents) {
    nlohmann::ordered_json aj;
    aj["name"] = a.name;
    aj["state"] = AgentStateName(a.state);
    aj["restarts"] = a.restarts;
    if (a.replacements > 0) aj["replacements"] = a.replacements;
    if (a.resumes > 0) aj["resumes"] = a.resumes;
    aj["ranks"] = nlohmann::ordered_json::array();
    for (const auto& r : a.ranks) {
      nlohmann::ordered_json rj;
      rj["rank"] = r.rank;
      rj["pid"] = r.pid;
      rj["node"] = r.node;
      rj["exit_code"] = r.exit_code ? nlohmann::ordered_json(*r.exit_code) : nullptr;
      rj["heard_unix_s"] = r.heard_unix_s ? nlohmann::ordered_json(*r.heard_unix_s) : nullptr;
      aj["ranks"].push_back(rj);
    }
    if (a.planned_ranks > 0) aj["planned_ranks"] = a.planned_ranks;
    aj["last_checkpoint_step"] =
        a.last_checkpoint_step ? nlohmann::ordered_json(*a.last_checkpoint_step) : nullptr;
    aj["metrics"] = a.metrics.is_object() ? a.metrics : nlohmann::json::object();
    aj["step"] = a.step;
    aj["steps_per_s"] = a.steps_per_s;
    aj["master_port"] = a.master_port;
    aj["reason"] = a.reason;
    if (!a.log_tail.empty()) aj["log_tail"] = a.log_tail;
    aj["log_dir"] = a.log_dir;
    aj["restored_step"] = a.restored_step ? nlohmann::ordered_json(*a.restored_step) : nullptr;
    aj["skipped_checkpoints"] = a.skipped_checkpoints;
    aj["flops_per_sample"] = a.flops_per_sample;
    aj["achieved_flops"] = a.achieved_flops;
    aj["peak_flops"] = a.peak_flops;
    aj["collective_share"] = a.collective_share;
    j["agents"].push_back(aj);
  }
  j["run_dir"] = status.run_dir;
  j["controller_pid"] = status.controller_pid;
  j["started_unix_s"] = status.started_unix_s;
  j["updated_unix_s"] = status.updated_unix_s;
  j["node_failures"] = nlohmann::ordered_json::array();
  for (const NodeFailure& f : status.node_failures) {
    j["node_failures"].push_back({{"node", f.node},
                                  {"time", f.unix_s},
                                  {"agent", f.agent},
                                  {"moved_to", f.moved_to},
                                  {"shrunk", f.shrunk}});
  }
  j["requeue_reason"] = status.requeue_reason;
  if (status.bus) j["bus"] = status.bus->ToJson();
  return j;
}

Result<RunStatus> RunStatusFromJson(const nlohmann::json& j) {
  try {
    RunStatus s;
    s.run = j.at("run").get<std::string>();
    AGENTRT_ASSIGN_OR_RETURN(
        s.state, ParseEnum<RunState>(j.at("state").get<std::string>(), kRunStates, "run state"));
    for (const auto& aj : j.at("agents")) {
      AgentStatus a;
      a.name = aj.at("name").get<std::string>();
      AGENTRT_ASSIGN_OR_RETURN(a.state, ParseEnum<AgentState>(aj.at("state").get<std::string>(),
                                                              kAgentStates, "agent state"));
      a.restarts = aj.at("restarts").get<int>();
      a.replacements = aj.value("replacements", 0);
      a.resumes = aj.value("resumes", 0);
      for (const auto& rj : aj.at("ranks")) {
        RankStatus r;
        r.rank = rj.at("rank").get<int>();
        r.pid = rj.at("pid").get<int64_t>();
        r.node = rj.value("node", "");
        if (rj.contains("exit_code") && !rj["exit_code"].is_null())
          r.exit_code = rj["exit_code"].get<int>();
        if (rj.contains("heard_unix_s") && rj["heard_unix_s"].is_number())
          r.heard_unix_s = rj["heard_unix_s"].get<double>();
        a.ranks.push_back(r);
      }
      a.planned_ranks = aj.value("planned_ranks", 0);
      if (aj.contains("last_checkpoint_step") && !aj["last_checkpoint_step"].is_null()) {
        a.last_checkpoint_step = aj["last_checkpoint_step"].get<int64_t>();
      }
      a.metrics = aj.value("metrics", nlohmann::json::object());
      a.step = aj.value("step", int64_t{-1});
      a.steps_per_s = aj.value("steps_per_s", 0.0);
      a.master_port = aj.value("master_port", 0);
      a.reason = aj.value("reason", "");
      a.log_tail = aj.value("log_tail", std::vector<std::string>{});
      a.log_dir = aj.value("log_dir", "");
      if (aj.contains("restored_step") && !aj["restored_step"].is_null()) {
        a.restored_step = aj["restored_step"].get<int64_t>();
      }
      a.skipped_checkpoints = aj.value("skipped_checkpoints", std::vector<int64_t>{});
      a.flops_per_sample = aj.value("flops_per_sample", 0.0);
      a.achieved_flops = aj.value("achieved_flops", 0.0);
      a.peak_flops = aj.value("peak_flops", 0.0);
      a.collective_share = aj.value("collective_share", -1.0);
      s.agents.push_back(std::move(a));
    }
    s.run_dir = j.value("run_dir", "");
    s.controller_pid = j.value("controller_pid", int64_t{0});
    s.started_unix_s = j.value("started_unix_s", 0.0);
    s.updated_unix_s = j.value("updated_unix_s", 0.0);
    if (j.contains("node_failures") && j["node_failures"].is_array()) {
      for (const auto& fj : j["node_failures"]) {
        s.node_failures.push_back({fj.value("node", ""), fj.value("time", 0.0),
                                   fj.value("agent", ""), fj.value("moved_to", ""),
                                   fj.value("shrunk", false)});
      }
    }
    s.requeue_reason = j.value("requeue_reason", "");
    // The bus block is for display: one that does not read is left out
    // rather than making the whole status unreadable.
    if (j.contains("bus")) {
      if (auto bus = BusSnapshot::FromJson(j["bus"]); bus.ok()) s.bus = std::move(bus).value();
    }
    return s;
  } catch (const nlohmann::json::exception& e) {
    return InvalidArgument(std::string("status: malformed JSON: ") + e.what());
  }
}

Result<RunStatus> ReadRunStatusFile(const std::string& path) {
  AGENTRT_ASSIGN_OR_RETURN(std::string text, ReadWholeFile(path));
  auto j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return InvalidArgument(path + ": not valid JSON");
  auto s = RunStatusFromJson(j);
  if (!s.ok()) return s.status().WithContext(path);
  return s;
}

Status WriteRunStatusFile(const RunStatus& status, const std::string& path) {
  return WriteFileAtomic(path, RunStatusToJson(status).dump(2) + "\n");
}

std::string RenderStatusTable(const RunStatus& status, int width) {
  size_t name_w = 5;
  size_t nodes_w = 5;
  std::vector<std::string> nodes_of;
  for (const auto& a : status.agents) {
    name_w = std::max(name_w, a.name.size());
    std::vector<std::string> seen;
    for (const auto& r : a.ranks) {
      if (!r.node.empty() && std::find(seen.begin(), seen.end(), r.node) == seen.end())
        seen.push_back(r.node);
    }
    std::string nodes = seen.empty() ? "-" : fmt::format("{}", fmt::join(seen, " "));
    nodes_w = std::max(nodes_w, nodes.size());
    nodes_of.push_back(std::move(nodes));
  }
  std::string out =
      fmt::format("{:<{}}  {:<10}  {:>3}  {:>9}  {:>8}  {:<{}}  {}\n", "AGENT", name_w, "STATE",
                  "RST", "STEP", "STEPS/S", "NODES", nodes_w, "METRICS");
  for (size_t i = 0; i < status.agents.size(); ++i) {
    const AgentStatus& a = status.agents[i];
    std::string metrics;
    if (a.metrics.is_object()) {
      for (const auto& [k, v] : a.metrics.items()) {
        metrics += (metrics.empty() ? "" : " ") + k + "=" + FormatMetric(v);
      }
    }
    if (IsTerminal(a.state) && !a.reason.empty()) metrics = a.reason;
    std::string line = fmt::format("{:<{}}  {:<10}  {:>3}  {:>9}  {:>8.1f}  {:<{}}  {}", a.name,
                                   name_w, AgentStateName(a.state), a.restarts,
                                   a.step < 0 ? std::string("-") : std::to_string(a.step),
                                   a.steps_per_s, nodes_of[i], nodes_w, metrics);
    if (width > 0 && line.size() > static_cast<size_t>(width))
      line.resize(static_cast<size_t>(width));
    out += line + "\n";
  }
  for (const std::string& note : RunNotes(status, /*efficiency=*/true))
    out += "note: " + note + "\n";
  return out;
}

std::vector<std::string> RunNotes(const RunStatus& status, bool efficiency) {
  std::vector<std::string> notes;
  for (const AgentStatus& a : status.agents) {
    if (std::string note = RestoreNote(a); !note.empty()) notes.push_back(std::move(note));
  }
  for (const AgentStatus& a : status.agents) {
    if (std::string note = ShrunkNote(a); !note.empty()) notes.push_back(std::move(note));
  }
  for (const AgentStatus& a : status.agents) {
    if (std::string note = EfficiencyNote(a); efficiency && !note.empty())
      notes.push_back(std::move(note));
  }
  for (const NodeFailure& f : status.node_failures) notes.push_back(NodeFailureNote(f));
  if (!status.requeue_reason.empty()) notes.push_back("requeue: " + status.requeue_reason);
  return notes;
}

std::string EfficiencyNote(const AgentStatus& a, double threshold) {
  if (a.flops_per_sample <= 0 || a.peak_flops <= 0 || a.achieved_flops <= 0 ||
      a.achieved_flops >= threshold * a.peak_flops) {
    return "";
  }
  std::string out = fmt::format(
      "agent {} reaches {:.1f}% of its peak ({:.3g} TFLOP/s achieved of {:.3g} TFLOP/s)", a.name,
      100 * a.achieved_flops / a.peak_flops, a.achieved_flops / 1e12, a.peak_flops / 1e12);
  if (a.collective_share >= 0) {
    out += a.collective_share >= 0.5
               ? fmt::format("; the biggest phase: collectives, {:.0f}% of its time",
                             100 * a.collective_share)
               : fmt::format(
                     "; the biggest phase: outside collectives (compute, env, "
                     "checkpoint), {:.0f}% of its time",
                     100 * (1 - a.collective_share));
  }
  return out;
}

std::string NodeFailureNote(const NodeFailure& f) {
  const auto t = static_cast<std::time_t>(f.unix_s);
  std::tm utc{};
  gmtime_r(&t, &utc);
  char when[16];
  std::strftime(when, sizeof when, "%H:%M:%S", &utc);
  return fmt::format("node {} failed at {} UTC: {} {}", f.node, when, f.agent,
                     f.shrunk             ? "goes on without it (restart.elastic)"
                     : f.moved_to.empty() ? "has no spare node left (the allocation requeues)"
                                          : "moved to " + f.moved_to);
}

std::string ShrunkNote(const AgentStatus& a) {
  if (a.planned_ranks <= 0 || IsTerminal(a.state)) return "";
  return fmt::format(
      "agent {} runs {} of its {} planned ranks: a node of it failed and no spare fit "
      "(restart.elastic); it grows back when its allocation is requeued",
      a.name, a.ranks.size(), a.planned_ranks);
}

std::string RestoreNote(const AgentStatus& a) {
  if (a.skipped_checkpoints.empty()) return "";
  std::string steps;
  for (const int64_t s : a.skipped_checkpoints)
    steps += (steps.empty() ? "" : ", ") + std::to_string(s);
  if (!a.restored_step || *a.restored_step < 0) {
    return fmt::format("agent {} started fresh: every checkpoint was corrupt (skipped step{} {})",
                       a.name, a.skipped_checkpoints.size() == 1 ? "" : "s", steps);
  }
  return fmt::format("agent {} resumed from step {}, past corrupt checkpoint{} {}", a.name,
                     *a.restored_step, a.skipped_checkpoints.size() == 1 ? "" : "s", steps);
}

}  // namespace agentrt
