#include "dashboard/views.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <optional>
#include <set>

#include "common/file_util.h"
#include "plan/run_dir.h"
#include "scheduler/league_service.h"

namespace agentrt {

namespace {

std::string Label(std::string_view v) {
  std::string out;
  for (char c : v) {
    if (c == '\\' || c == '"') out.push_back('\\');
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out.push_back(c);
  }
  return out;
}

// Seconds since rank `r` of agent `a` was last heard; none before it was
// heard, and none once it has exited or its agent has ended (it sends no more
// heartbeats: an age would only grow).
std::optional<double> HeartbeatAge(const AgentStatus& a, const RankStatus& r, double now_unix_s) {
  if (!r.heard_unix_s || r.exit_code || IsTerminal(a.state)) return std::nullopt;
  return std::max(0.0, now_unix_s - *r.heard_unix_s);
}

// The plan entry of the run's `i`-th agent. status.json lists agents in plan
// order, so position i is tried first and a run of thousands of agents is not
// searched once per agent.
const AgentPlan* PlanAgentAt(const Plan& plan, size_t i, const std::string& name) {
  if (i < plan.agents.size() && plan.agents[i].name == name) return &plan.agents[i];
  return plan.FindAgent(name);
}

}  // namespace

int64_t FileMTimeNs(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return -1;
  return int64_t{st.st_mtim.tv_sec} * 1000000000 + st.st_mtim.tv_nsec;
}

Result<std::shared_ptr<const Plan>> PlanCache::Get(const std::string& path) {
  struct stat st {};
  const bool known = ::stat(path.c_str(), &st) == 0;
  const std::tuple<uint64_t, int64_t, int64_t> key{
      st.st_ino, int64_t{st.st_mtim.tv_sec} * 1000000000 + st.st_mtim.tv_nsec, st.st_size};
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (known && plan_ && key == key_) return plan_;
  }
  AGENTRT_ASSIGN_OR_RETURN(Plan plan, ReadPlanFile(path));
  auto shared = std::make_shared<const Plan>(std::move(plan));
  std::lock_guard<std::mutex> lock(mu_);
  if (known) {
    key_ = key;
    plan_ = shared;
  }
  return shared;
}

Result<RunSnapshot> ReadRunSnapshot(const std::string& run_dir, PlanCache* plans) {
  const RunDir dir(run_dir);
  RunSnapshot s;
  PlanCache once;  // no cache given: this read's own
  AGENTRT_ASSIGN_OR_RETURN(s.plan, (plans != nullptr ? plans : &once)->Get(dir.PlanPath()));
  AGENTRT_ASSIGN_OR_RETURN(s.status, ReadRunStatusFile(dir.StatusPath()));
  s.controller_alive = ControllerRunning(run_dir);
  for (size_t i = 0; i < s.status.agents.size(); ++i) {
    const AgentStatus& a = s.status.agents[i];
    const AgentPlan* p = PlanAgentAt(*s.plan, i, a.name);
    if (p == nullptr || !a.last_checkpoint_step) continue;
    const std::string manifest = dir.Resolve(p->checkpoint_dir) + "/step-" +
                                 std::to_string(*a.last_checkpoint_step) + "/manifest.json";
    if (const int64_t t = FileMTimeNs(manifest); t > 0)
      s.checkpoint_unix_s[a.name] = static_cast<double>(t) / 1e9;
  }
  if (s.plan->league.enabled()) {
    // None committed yet (or unreadable): the page shows no league table.
    if (auto league = ReadLeagueState(s.plan->league, dir.LeagueStatePath()); league.ok())
      s.league = std::move(*league);
  }
  if (!s.plan->pbt.empty()) {
    // Unreadable (not a lineage file): the page shows no lineage.
    if (auto lineage = ReadLineageFile(dir.LineagePath()); lineage.ok()) s.lineage = *lineage;
  }
  return s;
}

namespace {

// The page's league section: members best first, the payoff table, the newest exploits.
nlohmann::json LeagueView(const RunSnapshot& run) {
  nlohmann::json out = nlohmann::json::object();
  if (run.league) {
    const LeagueState& l = *run.league;
    nlohmann::json members = nlohmann::json::array();
    for (const auto& [agent, rating] : l.ratings()) {
      int64_t games = 0;
      nlohmann::json payoff = nlohmann::json::object();
      if (auto row = l.payoff().find(agent); row != l.payoff().end()) {
        for (const auto& [other, c] : row->second) {
          games += c.games();
          payoff[other] = {c.wins, c.losses, c.draws};
        }
      }
      const LeagueMember* m = l.config().FindMember(agent);
      members.push_back({{"agent", agent},
                         {"role", m != nullptr ? m->role : ""},
                         {"rating", rating},
                         {"games", games},
                         {"snapshots", l.frozen(agent).size()},
                         {"payoff", std::move(payoff)}});
    }
    std::sort(members.begin(), members.end(), [](const nlohmann::json& a, const nlohmann::json& b) {
      return a["rating"].get<double>() > b["rating"].get<double>();
    });
    out["members"] = std::move(members);
    out["results_applied"] = l.results_applied();
  }
  if (!run.lineage.empty()) {
    const size_t first = run.lineage.size() > 20 ? run.lineage.size() - 20 : 0;
    out["lineage"] = nlohmann::json::array();
    for (size_t i = first; i < run.lineage.size(); ++i)
      out["lineage"].push_back(run.lineage[i].ToJson());
    out["exploits"] = run.lineage.size();
  }
  return out;
}

}  // namespace

nlohmann::json RunView(const RunSnapshot& run, double now_unix_s) {
  const RunStatus& st = run.status;
  nlohmann::json out;
  out["run"] = {{"name", st.run},
                {"state", ShownRunState(st, run.controller_alive)},
                {"run_dir", st.run_dir},
                {"elapsed_s",
                 std::max(0.0, (st.state == RunState::kRunning ? now_unix_s : st.updated_unix_s) -
                                   st.started_unix_s)},
                {"controller_alive", run.controller_alive},
                {"requeue_reason", st.requeue_reason}};
  nlohmann::json agents = nlohmann::json::array();
  for (size_t i = 0; i < st.agents.size(); ++i) {
    const AgentStatus& a = st.agents[i];
    nlohmann::json j;
    j["name"] = a.name;
    j["state"] = AgentStateName(a.state);
    j["restarts"] = a.restarts;
    j["reason"] = a.reason;
    j["step"] = a.step;
    j["steps_per_s"] = a.steps_per_s;
    j["last_checkpoint_step"] =
        a.last_checkpoint_step ? nlohmann::json(*a.last_checkpoint_step) : nlohmann::json();
    auto ck = run.checkpoint_unix_s.find(a.name);
    j["checkpoint_age_s"] = ck == run.checkpoint_unix_s.end()
                                ? nlohmann::json()
                                : nlohmann::json(std::max(0.0, now_unix_s - ck->second));
    nlohmann::json ranks = nlohmann::json::array();
    for (const RankStatus& r : a.ranks) {
      const auto age = HeartbeatAge(a, r, now_unix_s);
      ranks.push_back({{"rank", r.rank},
                       {"node", r.node},
                       {"pid", r.pid},
                       {"heartbeat_age_s", age ? nlohmann::json(*age) : nlohmann::json()}});
    }
    j["ranks"] = ranks;
    j["planned_ranks"] = a.planned_ranks > 0 ? nlohmann::json(a.planned_ranks) : nlohmann::json();
    const std::string shrunk = ShrunkNote(a);  // why it runs below its planned size
    j["shrunk_note"] = shrunk.empty() ? nlohmann::json() : nlohmann::json(shrunk);
    j["efficiency"] = a.peak_flops > 0 && a.achieved_flops > 0
                          ? nlohmann::json(a.achieved_flops / a.peak_flops)
                          : nlohmann::json();
    if (const AgentPlan* p = PlanAgentAt(*run.plan, i, a.name)) {
      nlohmann::json placement = nlohmann::json::array();
      for (const Placement& pl : p->placement)
        placement.push_back({{"node", pl.node}, {"gpus", pl.gpus}, {"ranks", pl.ranks}});
      j["placement"] = placement;
      j["ports"] = {{"first", p->ports.first}, {"last", p->ports.last}};
      j["gpu_type"] = p->gpu_type;
    }
    agents.push_back(std::move(j));
  }
  out["agents"] = std::move(agents);
  nlohmann::json nodes = nlohmann::json::array();
  for (const PlanNode& n : run.plan->nodes)
    nodes.push_back({{"name", n.name}, {"gpus", n.gpus}, {"nvlink_domains", n.nvlink_domains}});
  out["nodes"] = std::move(nodes);
  out["bus"] = st.bus ? st.bus->ToJson() : nlohmann::json::object();
  out["league"] = LeagueView(run);
  return out;
}

namespace {

// A metric family's # HELP and # TYPE lines.
void Family(std::string& out, const char* name, const char* type, const char* help) {
  out += fmt::format("# HELP {} {}\n# TYPE {} {}\n", name, help, name, type);
}

// The bus's topics, subscribers' lag and messages stored.
void BusMetrics(std::string& out, const std::string& r, const RunStatus& st) {
  auto family = [&](const char* name, const char* type, const char* help) {
    Family(out, name, type, help);
  };
  if (st.bus) {
    family("agentrt_bus_topic_end_offset", "gauge", "The next offset of each bus topic.");
    for (const BusSnapshot::Topic& t : st.bus->topics) {
      out += fmt::format("agentrt_bus_topic_end_offset{{run=\"{}\",topic=\"{}\"}} {}\n", r,
                         Label(t.topic), t.end_offset);
    }
    family("agentrt_bus_subscriber_lag_messages", "gauge",
           "Messages a subscription has not yet been sent (end offset - its position).");
    for (const BusSnapshot::Subscriber& s : st.bus->subscribers) {
      out += fmt::format(
          "agentrt_bus_subscriber_lag_messages{{run=\"{}\",agent=\"{}\",topic=\"{}\"}} {}\n", r,
          Label(s.agent), Label(s.topic), s.lag);
    }
    family("agentrt_bus_messages_published_total", "counter", "Messages the bus stored.");
    out += fmt::format("agentrt_bus_messages_published_total{{run=\"{}\"}} {}\n", r,
                       st.bus->messages_published);
    family("agentrt_bus_broker_restarts_total", "counter",
           "Times the run's broker process died and was started again.");
    out += fmt::format("agentrt_bus_broker_restarts_total{{run=\"{}\"}} {}\n", r,
                       st.bus->broker_restarts);
  }
}

// The league's ratings and results, and PBT's exploits.
void LeagueMetrics(std::string& out, const std::string& r, const RunSnapshot& run) {
  auto family = [&](const char* name, const char* type, const char* help) {
    Family(out, name, type, help);
  };
  if (run.league) {
    family("agentrt_league_rating", "gauge", "The league member's Elo rating (last commit).");
    for (const auto& [agent, rating] : run.league->ratings()) {
      out += fmt::format("agentrt_league_rating{{run=\"{}\",agent=\"{}\"}} {:.3f}\n", r,
                         Label(agent), rating);
    }
    family("agentrt_league_results_total", "counter", "Match results the league applied.");
    out += fmt::format("agentrt_league_results_total{{run=\"{}\"}} {}\n", r,
                       run.league->results_applied());
  }
  if (!run.plan->pbt.empty()) {
    family("agentrt_pbt_exploits_total", "counter",
           "PBT exploits (a member restarted from another's checkpoint).");
    const auto exploited = std::count_if(run.lineage.begin(), run.lineage.end(),
                                         [](const LineageRecord& l) { return l.exploited(); });
    out += fmt::format("agentrt_pbt_exploits_total{{run=\"{}\"}} {}\n", r, exploited);
  }
}

}  // namespace

std::string PrometheusText(const RunSnapshot& run, double now_unix_s) {
  const RunStatus& st = run.status;
  const std::string r = Label(st.run);
  std::string out;
  auto family = [&](const char* name, const char* type, const char* help) {
    Family(out, name, type, help);
  };
  family("agentrt_run_info", "gauge", "The run (1), labelled by its state.");
  out += fmt::format("agentrt_run_info{{run=\"{}\",state=\"{}\"}} 1\n", r,
                     Label(RunStateName(st.state)));
  family("agentrt_controller_up", "gauge", "1 while the run's controller (agentctl) is alive.");
  out += fmt::format("agentrt_controller_up{{run=\"{}\"}} {}\n", r, run.controller_alive ? 1 : 0);
  family("agentrt_run_elapsed_seconds", "gauge", "Seconds since the run started.");
  out += fmt::format("agentrt_run_elapsed_seconds{{run=\"{}\"}} {:.3f}\n", r,
                     std::max(0.0, now_unix_s - st.started_unix_s));
  family("agentrt_status_age_seconds", "gauge", "Seconds since status.json was last written.");
  out += fmt::format("agentrt_status_age_seconds{{run=\"{}\"}} {:.3f}\n", r,
                     std::max(0.0, now_unix_s - st.updated_unix_s));

  static constexpr AgentState kStates[] = {AgentState::kPending,    AgentState::kRunning,
                                           AgentState::kRestarting, AgentState::kSucceeded,
                                           AgentState::kFailed,     AgentState::kStopped};
  family("agentrt_agent_state", "gauge", "1 for the agent's current state, 0 for the others.");
  for (const AgentStatus& a : st.agents) {
    for (AgentState s : kStates) {
      out += fmt::format("agentrt_agent_state{{run=\"{}\",agent=\"{}\",state=\"{}\"}} {}\n", r,
                         Label(a.name), AgentStateName(s), a.state == s ? 1 : 0);
    }
  }
  auto per_agent = [&](const char* name, const char* type, const char* help, auto value) {
    family(name, type, help);
    for (const AgentStatus& a : st.agents) {
      const std::optional<double> v = value(a);
      if (v) out += fmt::format("{}{{run=\"{}\",agent=\"{}\"}} {}\n", name, r, Label(a.name), *v);
    }
  };
  using Opt = std::optional<double>;
  per_agent("agentrt_agent_restarts_total", "counter", "Restarts of the agent.",
            [](const AgentStatus& a) { return Opt(a.restarts); });
  per_agent("agentrt_agent_step", "gauge", "The agent's latest reported step.",
            [](const AgentStatus& a) { return a.step >= 0 ? Opt(a.step) : std::nullopt; });
  per_agent("agentrt_agent_steps_per_second", "gauge", "Steps per second over the last window.",
            [](const AgentStatus& a) { return Opt(a.steps_per_s); });
  per_agent("agentrt_agent_checkpoint_step", "gauge", "Step of the last committed checkpoint.",
            [](const AgentStatus& a) {
              return a.last_checkpoint_step ? Opt(*a.last_checkpoint_step) : std::nullopt;
            });
  per_agent("agentrt_agent_checkpoint_age_seconds", "gauge",
            "Seconds since the last checkpoint was committed.", [&](const AgentStatus& a) {
              auto it = run.checkpoint_unix_s.find(a.name);
              return it == run.checkpoint_unix_s.end()
                         ? std::nullopt
                         : Opt(std::max(0.0, now_unix_s - it->second));
            });
  per_agent("agentrt_agent_efficiency_ratio", "gauge",
            "Achieved FLOP/s over the partition's peak (agents that declare FLOPs per sample).",
            [](const AgentStatus& a) {
              return a.peak_flops > 0 && a.achieved_flops > 0 ? Opt(a.achieved_flops / a.peak_flops)
                                                              : std::nullopt;
            });
  BusMetrics(out, r, st);
  LeagueMetrics(out, r, run);
  family("agentrt_rank_heartbeat_age_seconds", "gauge", "Seconds since the rank was last heard.");
  for (const AgentStatus& a : st.agents) {
    for (const RankStatus& rk : a.ranks) {
      const auto age = HeartbeatAge(a, rk, now_unix_s);
      if (!age) continue;
      out += fmt::format(
          "agentrt_rank_heartbeat_age_seconds{{run=\"{}\",agent=\"{}\",rank=\"{}\",node=\"{}\"}} "
          "{:.3f}\n",
          r, Label(a.name), rk.rank, Label(rk.node), *age);
    }
  }
  return out;
}

Status MetricSeries::Refresh() {
  std::lock_guard<std::mutex> lock(mu_);
  const int fd = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Status::Ok();  // no metrics yet
  struct stat st {};
  ::fstat(fd, &st);
  if (st.st_size < read_) {  // rewritten: start over
    read_ = 0;
    partial_.clear();
    series_.clear();
    points_ = 0;
  }
  std::string chunk(static_cast<size_t>(st.st_size - read_), '\0');
  const ssize_t n = ReadAllAt(fd, chunk.data(), chunk.size(), static_cast<off_t>(read_));
  ::close(fd);
  const auto got = static_cast<size_t>(std::max<ssize_t>(n, 0));  // unreadable: the next poll
  chunk.resize(got);
  read_ += static_cast<int64_t>(got);
  std::string text = std::move(partial_);
  text += chunk;
  size_t start = 0;
  for (size_t nl = text.find('\n'); nl != std::string::npos; nl = text.find('\n', start)) {
    const std::string_view line(text.data() + start, nl - start);
    start = nl + 1;
    auto r = reader_.Parse(line);
    if (!r.ok()) continue;       // not a report line
    if (r->rank != 0) continue;  // the other ranks report the same curves
    auto of_agent = series_.find(r->agent);
    if (of_agent == series_.end()) of_agent = series_.try_emplace(std::string(r->agent)).first;
    for (const MetricValueView& m : r->metrics) {
      if (!m.is_number()) continue;
      auto series = of_agent->second.find(m.name);
      if (series == of_agent->second.end())
        series = of_agent->second.try_emplace(std::string(m.name)).first;
      series->second.Append(static_cast<double>(r->step), m.number);
      ++points_;
    }
  }
  partial_ = text.substr(start);
  return Status::Ok();
}

void MetricSeries::Series::Append(double step, double value) {
  points.emplace_back(step, value);
  ++total;
  if (points.size() < kMaxPoints) return;
  size_t kept = 0;
  for (size_t i = 0; i + 1 < points.size(); i += 2) {
    points[kept++] = {points[i].first, 0.5 * (points[i].second + points[i + 1].second)};
  }
  if (points.size() % 2 == 1) points[kept++] = points.back();
  merged += static_cast<int64_t>(points.size() - kept);
  points.resize(kept);
}

std::map<std::string, std::vector<std::string>> MetricSeries::Names() {
  std::lock_guard<std::mutex> lock(mu_);
  std::map<std::string, std::vector<std::string>> out;
  for (const auto& [agent, metrics] : series_) {
    for (const auto& [name, points] : metrics) out[agent].push_back(name);
  }
  return out;
}

int64_t MetricSeries::points() {
  std::lock_guard<std::mutex> lock(mu_);
  return points_;
}

nlohmann::json MetricSeries::Query(const std::string& metric,
                                   const std::vector<std::string>& agents, size_t max_points) {
  std::lock_guard<std::mutex> lock(mu_);
  nlohmann::json out = nlohmann::json::array();
  for (const auto& [agent, metrics] : series_) {
    if (!agents.empty() && std::find(agents.begin(), agents.end(), agent) == agents.end()) continue;
    auto it = metrics.find(metric);
    if (it == metrics.end()) continue;
    nlohmann::json pts = nlohmann::json::array();
    for (const auto& [x, y] : Decimate(it->second.points, max_points)) pts.push_back({x, y});
    out.push_back({{"agent", agent},
                   {"total", it->second.total},
                   {"merged", it->second.merged},
                   {"points", std::move(pts)}});
  }
  return out;
}

Result<std::vector<std::string>> TailLog(const std::string& run_dir, const Plan& plan,
                                         const std::string& agent, int rank, int lines,
                                         const std::string& filter) {
  if (lines < 1 || lines > 10000)
    return InvalidArgument(fmt::format("lines must be 1..10000, got {}", lines));
  const AgentPlan* a = plan.FindAgent(agent);
  if (a == nullptr) return NotFound("no agent \"" + agent + "\" in this run");
  if (rank < 0 || rank >= a->ranks)
    return NotFound(fmt::format("agent {} has ranks 0..{}, not {}", agent, a->ranks - 1, rank));
  // The tail is searched within the last 8 MiB: enough for 10000 long lines.
  return ReadLastLines(RunDir(run_dir).RankLogPath(agent, rank), static_cast<size_t>(lines),
                       size_t{8} << 20, filter);
}

std::vector<std::pair<double, double>> Decimate(const std::vector<std::pair<double, double>>& in,
                                                size_t max_points) {
  if (max_points < 3 || in.size() <= max_points) return in;
  const size_t buckets = max_points / 3;
  std::vector<std::pair<double, double>> out;
  out.reserve(buckets * 3 + 1);
  for (size_t b = 0; b < buckets; ++b) {
    const size_t lo = in.size() * b / buckets, hi = in.size() * (b + 1) / buckets;
    if (lo >= hi) continue;
    size_t mn = lo, mx = lo;
    for (size_t i = lo; i < hi; ++i) {
      if (in[i].second < in[mn].second) mn = i;
      if (in[i].second > in[mx].second) mx = i;
    }
    std::set<size_t> keep = {lo, mn, mx};
    for (size_t i : keep) out.push_back(in[i]);
  }
  if (out.back() != in.back()) out.push_back(in.back());
  return out;
}

}  // namespace agentrt
