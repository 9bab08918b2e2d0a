// The loader's channels:, league: and pbt: blocks: who may publish and
// subscribe what, the league's members, the PBT populations.
#include "scheduler/loader_internal.h"

namespace agentrt::loader_internal {
namespace {

class PopulationBuilder {
 public:
  explicit PopulationBuilder(Converter& c) : c_(c) {}

  // Agent names matched by `pattern`, in agent order.
  static std::vector<std::string> Match(const Config& config, const std::string& pattern) {
    std::vector<std::string> out;
    for (const AgentConfig& a : config.agents) {
      if (fnmatch(pattern.c_str(), a.name.c_str(), 0) == 0) out.push_back(a.name);
    }
    return out;
  }

  std::vector<std::string> MatchAll(const Config& config, const YAML::Node& n,
                                    const std::string& path, std::vector<std::string>& patterns) {
    c_.Convert(n, path, patterns);
    std::vector<std::string> names;
    for (size_t i = 0; i < patterns.size(); ++i) {
      std::vector<std::string> matched = Match(config, patterns[i]);
      if (matched.empty()) {
        std::vector<std::string> candidates = {"*"};
        for (const AgentConfig& a : config.agents) {
          candidates.push_back(a.name);
          candidates.push_back(a.base_name + "-*");
        }
        std::string hint = ClosestMatch(patterns[i], candidates);
        c_.Fail(n.IsSequence() ? n[i] : n, n.IsSequence() ? Index(path, i) : path,
                fmt::format("pattern '{}' matches no agent{}", patterns[i],
                            hint.empty() ? "" : fmt::format("; did you mean '{}'?", hint)));
      }
      for (std::string& m : matched) {
        if (std::find(names.begin(), names.end(), m) == names.end()) names.push_back(std::move(m));
      }
    }
    // Agent order, not pattern order, so the plan does not depend on how patterns are listed.
    std::vector<std::string> ordered;
    for (const AgentConfig& a : config.agents) {
      if (std::find(names.begin(), names.end(), a.name) != names.end()) ordered.push_back(a.name);
    }
    return ordered;
  }

  void ParseChannels(const YAML::Node& list, Config& config) {
    c_.Visit(list);
    if (!list.IsSequence())
      c_.Fail(list, "channels", fmt::format("expected a list of channels, got {}", KindName(list)));
    std::map<std::string, std::string> topics;  // topic → path of its declaration
    for (size_t i = 0; i < list.size(); ++i) {
      const YAML::Node n = list[i];
      const std::string path = Index("channels", i);
      c_.CheckMap(n, path, kChannelKeys);
      ChannelConfig ch;
      c_.ReadRequired(n, path, "topic", ch.topic, "every channel needs a topic");
      if (!std::regex_match(ch.topic, TopicRegex())) {
        c_.Fail(n["topic"], Join(path, "topic"),
                fmt::format("expected letters, digits, '_', '.', '/', '-', '*' (a pattern) and "
                            "{{agent}}, got '{}'",
                            ch.topic));
      }
      const YAML::Node pubs = n["publishers"];
      const YAML::Node subs = n["subscribers"];
      if (!pubs.IsDefined())
        c_.Fail(n, Join(path, "publishers"),
                "missing; expected agent name patterns like [\"predator-*\"]");
      if (!subs.IsDefined())
        c_.Fail(n, Join(path, "subscribers"),
                "missing; expected agent name patterns like [\"prey-*\"]");
      ch.publishers = MatchAll(config, pubs, Join(path, "publishers"), ch.publisher_patterns);
      ch.subscribers = MatchAll(config, subs, Join(path, "subscribers"), ch.subscriber_patterns);
      if (c_.Read(n, path, "keep_last", ch.keep_last) && ch.keep_last < 1)
        c_.Fail(n["keep_last"], Join(path, "keep_last"),
                fmt::format("expected at least 1 message, got {}", ch.keep_last));
      std::vector<ChannelConfig> expanded;
      const size_t placeholder = ch.topic.find("{agent}");
      if (placeholder == std::string::npos) {
        if (ch.topic.find_first_of("{}") != std::string::npos) {
          c_.Fail(n["topic"], Join(path, "topic"),
                  "the only placeholder a topic may hold is {agent}");
        }
        expanded.push_back(ch);
      } else {
        for (const std::string& publisher : ch.publishers) {
          ChannelConfig one = ch;
          one.topic.replace(placeholder, 7, publisher);
          one.publishers = {publisher};
          expanded.push_back(std::move(one));
        }
      }
      for (ChannelConfig& one : expanded) {
        auto [it, inserted] = topics.emplace(one.topic, path);
        if (!inserted)
          c_.Fail(n["topic"], Join(path, "topic"),
                  fmt::format("topic '{}' is already declared by {}", one.topic, it->second));
        config.channels.push_back(std::move(one));
      }
    }
  }

  void ParseLeague(const YAML::Node& n, Config& config) {
    LeagueConfig& league = config.league;
    ReadSettings(c_, n, "league", league, kLeagueListKeys);
    if (league.keep_snapshots < 1 || league.keep_snapshots > 10000)
      c_.Fail(n["keep_snapshots"], "league.keep_snapshots",
              fmt::format("expected 1..10000 snapshots, got {}", league.keep_snapshots));
    if (league.freeze_every_steps < 1)
      c_.Fail(n["freeze_every_steps"], "league.freeze_every_steps",
              fmt::format("expected at least 1 env step, got {}", league.freeze_every_steps));
    if (!(league.elo_k > 0))
      c_.Fail(n["elo_k"], "league.elo_k",
              fmt::format("expected more than 0, got {}", league.elo_k));
    const YAML::Node members = n["members"];
    if (!members.IsDefined())
      c_.Fail(n, "league.members",
              "missing; expected a list like [{agents: [hunter-*], role: main}]");
    c_.Visit(members);
    if (!members.IsSequence() || members.size() == 0)
      c_.Fail(members, "league.members", "expected a non-empty list of members");
    std::map<std::string, std::string> member_of;  // agent -> path of its entry
    std::vector<YAML::Node> opponent_nodes;
    for (size_t i = 0; i < members.size(); ++i) {
      const YAML::Node m = members[i];
      const std::string path = Index("league.members", i);
      c_.CheckMap(m, path, kLeagueMemberKeys);
      if (!m["agents"].IsDefined())
        c_.Fail(m, Join(path, "agents"), "missing; expected agent name patterns");
      std::vector<std::string> patterns;
      const std::vector<std::string> agents =
          MatchAll(config, m["agents"], Join(path, "agents"), patterns);
      std::string role;
      c_.ReadRequired(m, path, "role", role,
                      fmt::format("expected one of {}", fmt::join(LeagueRoles(), ", ")));
      CheckOneOf(m["role"], Join(path, "role"), role, LeagueRoles(), "role");
      // AlphaStar's mix by role: main agents mostly PFSP with a share of the
      // newest, exploiters against the newest (main) or PFSP over the league.
      std::string matchmaking = role == "main_exploiter" ? "self"
                                : role == "anchor"       ? "uniform"
                                                         : "pfsp";
      double newest_share = role == "main" ? 0.35 : 0.0;
      c_.Read(m, path, "matchmaking", matchmaking);
      CheckOneOf(m["matchmaking"], Join(path, "matchmaking"), matchmaking, LeagueMatchmakings(),
                 "matchmaking");
      c_.Read(m, path, "newest_share", newest_share);
      if (!(newest_share >= 0 && newest_share <= 1))
        c_.Fail(m["newest_share"], Join(path, "newest_share"),
                fmt::format("expected a fraction in 0..1, got {}", newest_share));
      for (const std::string& agent : agents) {
        auto [it, inserted] = member_of.emplace(agent, path);
        if (!inserted)
          c_.Fail(m["agents"], Join(path, "agents"),
                  fmt::format("agent {} is already a member by {}", agent, it->second));
        league.members.push_back({agent, role, matchmaking, newest_share, {}});
      }
      opponent_nodes.insert(opponent_nodes.end(), agents.size(), m);
    }
    // Opponents are resolved once every member is known: by default every other member.
    for (size_t i = 0; i < league.members.size(); ++i) {
      LeagueMember& member = league.members[i];
      const YAML::Node m = opponent_nodes[i];
      const std::string path = member_of[member.agent];
      if (const YAML::Node o = m["opponents"]; o.IsDefined()) {
        std::vector<std::string> patterns;
        for (const std::string& agent : MatchAll(config, o, Join(path, "opponents"), patterns)) {
          if (agent == member.agent)
            c_.Fail(o, Join(path, "opponents"),
                    fmt::format("agent {} cannot be its own opponent (it plays its past through "
                                "matchmaking, not by name)",
                                agent));
          if (member_of.count(agent) == 0)
            c_.Fail(o, Join(path, "opponents"),
                    fmt::format("agent {} is not a league member; opponents are members", agent));
          member.opponents.push_back(agent);
        }
      } else {
        for (const LeagueMember& other : league.members)
          if (other.agent != member.agent) member.opponents.push_back(other.agent);
      }
      if (member.opponents.empty())
        c_.Fail(
            m, Join(path, "opponents"),
            fmt::format("agent {} has nobody to play: the league needs two members", member.agent));
    }
  }

  void ParsePbt(const YAML::Node& list, Config& config) {
    c_.Visit(list);
    if (!list.IsSequence())
      c_.Fail(list, "pbt", fmt::format("expected a list of populations, got {}", KindName(list)));
    std::map<std::string, std::string> population_of;  // agent -> path
    for (size_t i = 0; i < list.size(); ++i) {
      const YAML::Node n = list[i];
      const std::string path = Index("pbt", i);
      PbtPopulation pop;
      pop.name = "pbt" + std::to_string(i);
      ReadSettings(c_, n, path, pop, kPbtListKeys);
      c_.Read(n, path, "name", pop.name);
      if (!n["agents"].IsDefined())
        c_.Fail(n, Join(path, "agents"), "missing; expected agent name patterns");
      std::vector<std::string> patterns;
      pop.agents = MatchAll(config, n["agents"], Join(path, "agents"), patterns);
      if (pop.agents.size() < 2)
        c_.Fail(n["agents"], Join(path, "agents"),
                fmt::format("a population needs at least 2 agents, got {}", pop.agents.size()));
      for (const std::string& agent : pop.agents) {
        auto [it, inserted] = population_of.emplace(agent, path);
        if (!inserted)
          c_.Fail(n["agents"], Join(path, "agents"),
                  fmt::format("agent {} is already in the population {}", agent, it->second));
      }
      if (pop.interval_steps < 1)
        c_.Fail(n["interval_steps"], Join(path, "interval_steps"),
                fmt::format("expected at least 1 env step, got {}", pop.interval_steps));
      if (!(pop.fraction > 0 && pop.fraction <= 0.5))
        c_.Fail(n["fraction"], Join(path, "fraction"),
                fmt::format("expected a fraction in (0, 0.5], got {}", pop.fraction));
      if (!(pop.resample_probability >= 0 && pop.resample_probability <= 1))
        c_.Fail(n["resample_probability"], Join(path, "resample_probability"),
                fmt::format("expected a probability in 0..1, got {}", pop.resample_probability));
      if (pop.metric.empty()) c_.Fail(n["metric"], Join(path, "metric"), "expected a metric name");
      if (pop.metric == "rating") {
        for (const std::string& agent : pop.agents)
          if (config.league.FindMember(agent) == nullptr)
            c_.Fail(n["metric"], Join(path, "metric"),
                    fmt::format("metric rating is the league's Elo, but agent {} is not a league "
                                "member",
                                agent));
      }
      if (pop.checkpoint_wait_s < 0)
        c_.Fail(n["checkpoint_wait_s"], Join(path, "checkpoint_wait_s"),
                fmt::format("expected 0 or more seconds, got {}", pop.checkpoint_wait_s));
      const YAML::Node hps = n["hyperparameters"];
      if (hps.IsDefined()) {
        const std::string hpath = Join(path, "hyperparameters");
        c_.Visit(hps);
        if (!hps.IsMap())
          c_.Fail(hps, hpath, fmt::format("expected a map of agent args, got {}", KindName(hps)));
        for (auto it = hps.begin(); it != hps.end(); ++it)
          pop.hyperparameters.push_back(
              ParseHyperparameter(it->first, it->second, hpath, config, pop));
      }
      config.pbt.push_back(std::move(pop));
    }
  }

 private:
  void CheckOneOf(const YAML::Node& at, const std::string& path, const std::string& value,
                  const std::vector<std::string>& allowed, const char* what) {
    if (std::find(allowed.begin(), allowed.end(), value) != allowed.end()) return;
    const std::string hint = ClosestMatch(value, allowed);
    c_.Fail(
        at, path,
        fmt::format("unknown {} '{}'; expected one of {}{}", what, value, fmt::join(allowed, ", "),
                    hint.empty() ? "" : fmt::format("; did you mean '{}'?", hint)));
  }

  PbtHyperparameter ParseHyperparameter(const YAML::Node& key, const YAML::Node& n,
                                        const std::string& hpath, const Config& config,
                                        const PbtPopulation& pop) {
    PbtHyperparameter hp;
    c_.Convert(key, hpath, hp.name);
    const std::string path = Join(hpath, hp.name);
    c_.CheckMap(n, path, kPbtHyperparameterKeys);
    c_.ReadRequired(n, path, "min", hp.min, "expected the lowest value");
    c_.ReadRequired(n, path, "max", hp.max, "expected the highest value");
    if (!(hp.min < hp.max))
      c_.Fail(n["max"], Join(path, "max"),
              fmt::format("expected more than min ({}), got {}", hp.min, hp.max));
    c_.Read(n, path, "log_scale", hp.log_scale);
    if (hp.log_scale && !(hp.min > 0))
      c_.Fail(n["min"], Join(path, "min"), fmt::format("log_scale needs min > 0, got {}", hp.min));
    if (const YAML::Node p = n["perturb"]; p.IsDefined()) {
      c_.Visit(p);
      if (!p.IsSequence() || p.size() == 0)
        c_.Fail(p, Join(path, "perturb"), "expected a list of factors like [0.8, 1.2]");
      hp.perturb.clear();
      for (size_t i = 0; i < p.size(); ++i) {
        double f = 0;
        c_.Convert(p[i], Index(Join(path, "perturb"), i), f);
        if (!(f > 0))
          c_.Fail(p[i], Index(Join(path, "perturb"), i),
                  fmt::format("expected a factor > 0, got {}", f));
        hp.perturb.push_back(f);
      }
    }
    // Every member starts from its own args.<name>, inside the bounds.
    for (const std::string& agent : pop.agents) {
      const AgentConfig* a = config.FindAgent(agent);
      const nlohmann::json* v = a->args.contains(hp.name) ? &a->args[hp.name] : nullptr;
      if (v == nullptr || !v->is_number())
        c_.Fail(key, path,
                fmt::format("agent {} sets no number args.{}: each member's starting value comes "
                            "from its args",
                            agent, hp.name));
      const double value = v->get<double>();
      if (agent == pop.agents.front()) hp.integer = v->is_number_integer();
      hp.integer = hp.integer && v->is_number_integer();
      if (value < hp.min || value > hp.max)
        c_.Fail(value < hp.min ? n["min"] : n["max"], Join(path, value < hp.min ? "min" : "max"),
                fmt::format("agent {} starts with args.{} = {}, outside [{}, {}]", agent, hp.name,
                            value, hp.min, hp.max));
    }
    return hp;
  }

  Converter& c_;
};

}  // namespace

void ParseChannels(Converter& c, const YAML::Node& list, Config& config) {
  PopulationBuilder(c).ParseChannels(list, config);
}
void ParseLeague(Converter& c, const YAML::Node& n, Config& config) {
  PopulationBuilder(c).ParseLeague(n, config);
}
void ParsePbt(Converter& c, const YAML::Node& list, Config& config) {
  PopulationBuilder(c).ParsePbt(list, config);
}

}  // namespace agentrt::loader_internal
