#include "tools/agent-worker/worker.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdarg>
#include <cstdio>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "agent_runtime/group.h"
#include "agent_runtime/runtime.h"
#include "comms/bus_client.h"
#include "envs/registry.h"
#include "envs/single_agent_view.h"
#include "learners/policy_snapshot.h"
#include "learners/ppo_trainer.h"
#include "plan/run_dir.h"
#include "tools/agent-worker/league.h"
#include "tools/agent-worker/league_play.h"
#include "tools/agent-worker/settings.h"
#include "tools/agent-worker/world_eval.h"

namespace agentrt::worker {
namespace {

using SteadyTime = std::chrono::steady_clock;

// One log line on stdout (the rank's log file), prefixed with agent and rank.
class Log {
 public:
  void SetPrefix(std::string prefix) { prefix_ = std::move(prefix); }
  __attribute__((format(printf, 2, 3))) void operator()(const char* fmt, ...) const {
    std::va_list args;
    va_start(args, fmt);
    std::fprintf(stdout, "agent-worker %s: ", prefix_.c_str());
    std::vfprintf(stdout, fmt, args);
    std::fputc('\n', stdout);
    std::fflush(stdout);
    va_end(args);
  }

 private:
  std::string prefix_ = "?";
};

// The seats of one env copy played by other agents' snapshots (or at random
// before any arrived). Touched by the EnvPool worker stepping that copy, and by
// the training thread between steps (when snapshots are installed).
struct CopySeats {
  std::map<int, PolicyPlayer> players;
  int num_actions = 0;
};

class Worker {
 public:
  Status Run();
  // The run failed on the agent's own configuration (its args, its seat, its
  // GPUs): restarting cannot help.
  bool configuration_error() const { return configuration_error_; }

 private:
  Status Setup();
  Status SetupTrainer();
  Status SetupBus(const std::map<std::string, int64_t>& offsets, uint64_t incarnation);
  // League members: ends the current match and installs the next opponent.
  void NextMatch();
  void CountGames(const TrainerMetrics& m);
  Status Restore();
  // The newest checkpoint every rank read intact, loaded into the trainer
  // when it is of global slices.
  Result<RestoreResult> RestoreAgreed();
  void InstallSnapshots();
  Status TrainLoop();
  Status SaveCheckpoint(bool wait);
  Status Evaluate();
  Status EvaluateSingle();
  void ReportIteration(const TrainerMetrics& m);
  void PublishIteration(const TrainerMetrics& m);

  Log log_;
  std::unique_ptr<Runtime> runtime_;
  std::string agent_;
  int rank_ = 0;
  WorkerSettings settings_;
  bool multi_agent_ = false;
  Seating seating_;
  Group* group_ = nullptr;
  std::vector<std::unique_ptr<CopySeats>> seats_;  // per env copy (multi-agent)
  std::unique_ptr<PpoTrainer> trainer_;
  std::unique_ptr<League> league_;
  const LeagueMember* member_ = nullptr;  // this agent in plan.league (nullptr: not a member)
  std::unique_ptr<LeaguePlay> play_;
  int updates_since_match_ = 0;
  std::map<int, PolicySnapshot> latest_;  // seat -> newest snapshot installed
  TrainerMetrics last_;                   // of the last iteration
  SteadyTime::time_point last_log_ = SteadyTime::now();
  bool configuration_error_ = false;
  bool adopted_ = false;  // restored another agent's checkpoint (PBT)
};

Status Worker::Setup() {
  AGENTRT_ASSIGN_OR_RETURN(runtime_, Runtime::FromEnvironment());
  agent_ = runtime_->env().agent;
  rank_ = runtime_->env().rank;
  log_.SetPrefix(agent_ + " rank " + std::to_string(rank_));
  AGENTRT_ASSIGN_OR_RETURN(settings_,
                           WorkerSettings::FromArgs(runtime_->args(), "agent " + agent_ + " args"));
  AGENTRT_ASSIGN_OR_RETURN(group_, runtime_->group());
  if (group_->device_buffers()) {
    return FailedPrecondition(
        "agent " + agent_ +
        ": the PPO learner of agent-worker runs on the CPU and cannot use the " +
        std::string(group_->backend()) +
        " group of a GPU agent; give agent-worker agents gpus: 0, or backend: single (one "
        "rank) or mpi to keep the GPUs reserved (a PyTorch agent trains on GPUs)");
  }
  log_("plan %s, env %s, %d rank(s) on a %s group, budget %lld env steps",
       RunDir(runtime_->env().run_dir).AgentPlanPath(agent_).c_str(), settings_.trainer.env.c_str(),
       group_->size(), std::string(group_->backend()).c_str(),
       static_cast<long long>(settings_.trainer.ppo.steps));
  return Status::Ok();
}

Status Worker::SetupTrainer() {
  const EnvRegistry& registry = GlobalEnvRegistry();
  multi_agent_ = registry.IsMultiAgent(settings_.trainer.env);
  PpoTrainerOptions options;
  member_ = runtime_->plan().league.FindMember(agent_);
  if (member_ != nullptr && !multi_agent_) {
    return InvalidArgument("agent " + agent_ + " is a league member, but env " +
                           settings_.trainer.env + " has a single agent: nobody to play");
  }
  if (member_ != nullptr && group_->size() > 1) {
    return InvalidArgument("agent " + agent_ + " is a league member with " +
                           std::to_string(group_->size()) +
                           " ranks; league play runs one rank per member (give it ranks: 1)");
  }
  if (member_ != nullptr) {
    for (const std::string& opponent : member_->opponents) {
      const AgentPlan* o = runtime_->plan().FindAgent(opponent);
      const std::string side = o != nullptr && o->args.is_object() ? o->args.value("role", "") : "";
      if (side == settings_.role) {
        return InvalidArgument("agent " + agent_ + " (" + settings_.role +
                               ") has league opponent " + opponent +
                               ", which plays the same side; "
                               "give its league member an opponents: list of the other side");
      }
    }
  }
  // An anchor is a fixed yardstick: its initial policy, never trained.
  options.learn = member_ == nullptr || member_->role != "anchor";
  if (multi_agent_) {
    AGENTRT_ASSIGN_OR_RETURN(seating_, member_ != nullptr
                                           ? SeatLeague(agent_, settings_)
                                           : SeatWorld(runtime_->plan(), agent_, settings_));
    std::string sides, others;
    for (size_t i = 0; i < seating_.count.size(); ++i) {
      sides += (i == 0 ? "" : ", ") + std::to_string(seating_.count[i]) + " " +
               seating_.sides.roles[i] + (seating_.count[i] == 1 ? " seat" : " seats");
    }
    for (const auto& [seat, agent] : seating_.others)
      others += " " + std::to_string(seat) + "=" + agent;
    log_("%s world: %s; this agent plays seat %d; seats played by others:%s",
         settings_.trainer.env.c_str(), sides.c_str(), seating_.control,
         others.empty() ? " none" : others.c_str());
    options.env_factory = [this, &registry]() -> Result<std::unique_ptr<Env>> {
      AGENTRT_ASSIGN_OR_RETURN(std::unique_ptr<Env> env,
                               registry.MakeEnv(settings_.trainer.env, seating_.world_args));
      auto* view = dynamic_cast<SingleAgentView*>(env.get());
      if (view == nullptr)
        return Internal("env " + settings_.trainer.env + " did not come as a SingleAgentView");
      auto copy = std::make_unique<CopySeats>();
      copy->num_actions = static_cast<int>(view->action_space().n());
      CopySeats* seats = copy.get();
      view->set_others_policy(
          [seats](int seat, std::span<const float> obs, std::span<float> action, Rng& rng) {
            auto it = seats->players.find(seat);
            if (it != seats->players.end() && it->second.loaded()) {
              action[0] = static_cast<float>(it->second.Act(obs, rng));
            } else {
              action[0] = static_cast<float>(rng.Below(static_cast<uint64_t>(seats->num_actions)));
            }
          });
      // Every seat gets its player now, so the map never changes under the env threads.
      for (const auto& [seat, agent] : seating_.others) copy->players[seat];
      seats_.push_back(std::move(copy));
      return env;
    };
  }
  AGENTRT_ASSIGN_OR_RETURN(trainer_,
                           PpoTrainer::Make(settings_.trainer, *group_, std::move(options)));
  return Status::Ok();
}

Status Worker::SetupBus(const std::map<std::string, int64_t>& offsets, uint64_t incarnation) {
  if (!multi_agent_) return Status::Ok();  // single-agent envs have nobody to play with
  const AgentEnv& env = runtime_->env();
  if (member_ != nullptr) {
    // A league member cannot train as asked without the league: fail (and be restarted).
    if (env.bus.empty())
      return FailedPrecondition("agent " + agent_ + " is a league member but has no bus");
    AGENTRT_ASSIGN_OR_RETURN(auto bus, BusClient::ForAgent(env));
    AGENTRT_RETURN_IF_ERROR(
        bus->WaitForReady(std::chrono::seconds(10)).WithContext("bus " + env.bus));
    AGENTRT_ASSIGN_OR_RETURN(league_, League::Start(std::move(bus), {}, offsets, incarnation));
    // Results are numbered per process: its bus publisher id is unique to it,
    // even if a restart count were ever reused (a controller killed mid-launch).
    play_ = std::make_unique<LeaguePlay>(&league_->bus(), agent_, league_->bus().publisher_id());
    log_("league member (%s, %s matchmaking): matched by the league every %d updates",
         member_->role.c_str(), member_->matchmaking.c_str(), settings_.match_every);
    NextMatch();
    return Status::Ok();
  }
  if (env.bus.empty()) {
    log_(
        "no bus (AGENTRT_BUS is not set): training without it; other seats play at random, "
        "no snapshots are published");
    return Status::Ok();
  }
  // The run has a bus: an agent that cannot use it does not pass for a
  // healthy one (training on with random opponents); it fails, and its
  // restart tries again.
  AGENTRT_ASSIGN_OR_RETURN(auto bus, BusClient::ForAgent(env));
  if (Status ready = bus->WaitForReady(std::chrono::seconds(10)); !ready.ok()) {
    return Unavailable("bus " + env.bus + " not reachable (" + ready.ToString() +
                       "): the agent does not train without its bus");
  }
  auto league = League::Start(std::move(bus), seating_.others, offsets, incarnation);
  if (!league.ok()) return league.status().WithContext("bus " + env.bus);
  league_ = std::move(*league);
  log_("bus %s: subscribed to the policies of %zu seat(s)%s", env.bus.c_str(),
       seating_.others.size(), offsets.empty() ? "" : " from the checkpoint's offsets");
  return Status::Ok();
}

void Worker::NextMatch() {
  if (seating_.others.empty()) return;              // a world of one side: nobody to match
  const int seat = seating_.others.begin()->first;  // the league's pick plays it (SeatLeague)
  Result<LeagueAssignment> a = play_->Next(league_->newest_published(), trainer_->env_steps());
  if (!a.ok()) {
    log_("league: %s; the current opponent stays", a.status().ToString().c_str());
    return;
  }
  for (auto& copy : seats_) {
    if (!a->policy) {
      copy->players[seat] = PolicyPlayer();  // the opponent's initial policy: uniform play
    } else if (Status s = copy->players[seat].Load(*a->policy); !s.ok()) {
      log_("league: snapshot %s refused: %s", a->snapshot_id.c_str(), s.ToString().c_str());
      break;
    }
  }
  if (play_->matches() <= 3 || play_->matches() % 25 == 0) {
    log_("league match %lld: against %s (%s)", static_cast<long long>(play_->matches()),
         a->snapshot_id.c_str(), a->how.c_str());
  }
}

void Worker::CountGames(const TrainerMetrics& m) {
  // An episode that terminates is won by the scoring side; one cut short, by the other.
  const int64_t terminated = std::llround(static_cast<double>(m.iteration_episodes) *
                                          static_cast<double>(m.terminated_fraction));
  const int64_t truncated = m.iteration_episodes - terminated;
  const bool scoring = seating_.side == seating_.sides.scoring_side;
  play_->AddGames(scoring ? terminated : truncated, scoring ? truncated : terminated, 0);
  if (++updates_since_match_ >= settings_.match_every) {
    updates_since_match_ = 0;
    NextMatch();
  }
}

Result<RestoreResult> Worker::RestoreAgreed() {
  // Each rank reads only its part of a checkpoint of global slices, every
  // chunk verified as read, so a bad chunk may be seen by one rank alone: the
  // ranks agree (one all-reduce) and, if any saw one, all go back a step.
  RestoreOptions how{.load_shard = false};
  for (;;) {
    AGENTRT_ASSIGN_OR_RETURN(RestoreResult restored, runtime_->checkpointer().Restore(how));
    if (!restored.restored() && how.before_step >= 0) {
      // Every rank loaded (part of) a corrupt step before the group saw it
      // was corrupt, and no older step is left: start from a new trainer,
      // the same on every rank, not from those leftovers.
      log_("no intact checkpoint after step %lld: the trainer starts afresh",
           static_cast<long long>(how.before_step));
      trainer_.reset();
      seats_.clear();
      AGENTRT_RETURN_IF_ERROR(SetupTrainer());
    }
    if (!restored.restored() || !PpoTrainer::SavedIn(*restored.saved)) return restored;
    Status loaded = trainer_->LoadFrom(*restored.saved);
    float bad = loaded.code() == StatusCode::kDataLoss ? 1.0f : 0.0f;
    AGENTRT_RETURN_IF_ERROR(group_->AllReduce(&bad, 1, DataType::kFloat32, ReduceOp::kMax)
                                .WithContext("agent " + agent_ + " rank " + std::to_string(rank_) +
                                             ": agreeing on the checkpoint to restore"));
    if (bad == 0) {
      AGENTRT_RETURN_IF_ERROR(
          loaded.WithContext("agent " + agent_ + " rank " + std::to_string(rank_)));
      return restored;
    }
    how.before_step = restored.step;
    how.before_step_error =
        loaded.ok() ? "another rank of the agent read a bad chunk of it" : loaded.message();
    how.skipped = std::move(restored.skipped);
  }
}

Status Worker::Restore() {
  AGENTRT_ASSIGN_OR_RETURN(RestoreResult restored, RestoreAgreed());
  log_("%s", restored.Describe().c_str());
  std::map<std::string, int64_t> offsets;
  uint64_t incarnation = 0;
  if (restored.restored()) {
    if (PpoTrainer::SavedIn(*restored.saved)) {  // any world size; loaded by RestoreAgreed
      if (restored.world_size != runtime_->env().world_size) {
        log_("re-sharded the checkpoint of %d ranks onto %d", restored.world_size,
             runtime_->env().world_size);
      }
    } else {  // a checkpoint from before global slices: one trainer blob per rank
      const auto bytes = restored.shard.Bytes("trainer");
      if (bytes.empty()) {
        return DataLoss("agent " + agent_ + ": checkpoint step " + std::to_string(restored.step) +
                        " has no trainer state for rank " + std::to_string(rank_));
      }
      AGENTRT_RETURN_IF_ERROR(
          trainer_->LoadState({reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()}));
    }
    if (restored.metadata.contains("bus_offsets")) {
      offsets = restored.metadata["bus_offsets"].get<std::map<std::string, int64_t>>();
    }
    if (restored.metadata.contains("bus_incarnation")) {
      incarnation = restored.metadata["bus_incarnation"].get<uint64_t>();
    }
    adopted_ = restored.metadata.contains("adopted_from");
    if (adopted_ && rank_ == 0) {
      // Another agent's weights (PBT's exploit): say at once what they play
      // like, so the population is not judged on the weights they replaced.
      const TrainerMetrics w = trainer_->WindowMetrics();
      if (w.window_episodes > 0) {
        runtime_->Report(w.env_steps, {{"episode_return_mean", w.episode_return_mean},
                                       {"episode_length_mean", w.episode_length_mean},
                                       {"env_steps", w.env_steps}});
      }
      log_("adopted %s's checkpoint of step %lld (episode return %.3f over its last %d episodes)",
           restored.metadata["adopted_from"].value("agent", "?").c_str(),
           static_cast<long long>(restored.step), w.episode_return_mean, w.window_episodes);
    }
    log_("resumed at env step %lld (update %lld, %lld episodes)",
         static_cast<long long>(trainer_->env_steps()),
         static_cast<long long>(trainer_->learner().updates()),
         static_cast<long long>(trainer_->episodes()));
  }
  return SetupBus(offsets, incarnation);
}

Status Worker::SaveCheckpoint(bool wait) {
  CheckpointState state;
  trainer_->AddTo(state);
  state.metadata["env_steps"] = trainer_->env_steps();
  state.metadata["updates"] = trainer_->learner().updates();
  state.metadata["episodes"] = trainer_->episodes();
  if (league_) {
    state.metadata["bus_offsets"] = league_->SubscriptionOffsets();
    state.metadata["bus_incarnation"] = league_->SubscriptionIncarnation();
  }
  Checkpointer& ckpt = runtime_->checkpointer();
  return wait ? ckpt.Save(trainer_->env_steps(), state)
              : ckpt.SaveAsync(trainer_->env_steps(), state);
}

void Worker::InstallSnapshots() {
  if (!league_) return;
  league_->CatchUp();
  std::map<int, PolicySnapshot> fresh;
  league_->TakeNew(fresh);
  for (auto& [seat, snapshot] : fresh) {
    for (auto& copy : seats_) {
      if (Status s = copy->players[seat].Load(snapshot); !s.ok()) {
        log_("seat %d: snapshot of %s refused: %s", seat, snapshot.agent.c_str(),
             s.ToString().c_str());
        break;
      }
    }
    latest_[seat] = std::move(snapshot);
  }
}

void Worker::ReportIteration(const TrainerMetrics& m) {
  nlohmann::json metrics = m.ToJson();
  if (multi_agent_ && m.iteration_episodes > 0) metrics["capture_rate"] = m.terminated_fraction;
  if (league_) {
    metrics["snapshots_received"] = league_->snapshots_received();
    metrics["bus_published"] = league_->published();
    if (play_) {
      metrics["league_matches"] = play_->matches();
      metrics["league_results_pending"] = static_cast<int64_t>(play_->results_pending());
    }
    metrics["bus_stream_stalls"] = league_->stream_stalls();
    // Flat numbers (the metrics stream holds numbers): which update of each
    // other agent's policy played its seat.
    for (const auto& [seat, snap] : latest_) metrics["opponent_update/" + snap.agent] = snap.update;
  }
  runtime_->Report(m.env_steps, metrics);
  // A progress line in the rank's log every few seconds (the metrics stream is the record).
  const auto now = SteadyTime::now();
  if (now - last_log_ >= std::chrono::seconds(5)) {
    last_log_ = now;
    log_("env step %lld: episode return %.3f, length %.1f, %.0f steps/s, entropy %.3f",
         static_cast<long long>(m.env_steps), m.episode_return_mean, m.episode_length_mean,
         m.steps_per_s, m.ppo.entropy);
  }
}

void Worker::PublishIteration(const TrainerMetrics& m) {
  league_->PublishSnapshot(SnapshotOf(trainer_->learner(), agent_, m.env_steps),
                           runtime_->env().restart_count);
  if (play_) return;  // a member's results go to the league (LeaguePlay), not `results`
  nlohmann::json result = {{"agent", agent_},
                           {"seat", seating_.control},
                           {"update", m.ppo.updates},
                           {"env_steps", m.env_steps},
                           {"episodes", m.iteration_episodes},
                           {"return_mean", m.episode_return_mean}};
  if (m.iteration_episodes > 0) result["capture_rate"] = m.terminated_fraction;
  nlohmann::json opponents = nlohmann::json::object();
  for (const auto& [seat, snap] : latest_) opponents[snap.agent] = snap.update;
  result["opponents"] = opponents;
  league_->PublishResult(result);
}

Status Worker::TrainLoop() {
  while (trainer_->env_steps() < settings_.trainer.ppo.steps) {
    InstallSnapshots();
    // Saving and stopping are collective: every rank must agree, so each adds
    // its own view and acts on the group's sum.
    std::array<float, 2> agree = {runtime_->checkpointer().SaveDue() ? 1.0f : 0.0f,
                                  runtime_->ShouldStop() ? 1.0f : 0.0f};
    AGENTRT_RETURN_IF_ERROR(trainer_->Iterate(&last_, agree));
    if (rank_ == 0) {
      if (play_) CountGames(last_);
      if (last_.ppo.updates % settings_.report_every == 0) ReportIteration(last_);
      if (league_ && last_.ppo.updates % settings_.snapshot_every == 0) PublishIteration(last_);
    } else {
      runtime_->SetStep(last_.env_steps);
    }
    if (agree[1] > 0) {
      log_("stop requested (%s) at env step %lld: saving a checkpoint",
           runtime_->stop_reason().c_str(), static_cast<long long>(trainer_->env_steps()));
      return Status::Ok();
    }
    if (agree[0] > 0) AGENTRT_RETURN_IF_ERROR(SaveCheckpoint(/*wait=*/false));
  }
  return Status::Ok();
}

// A single-agent env: eval_episodes episodes of the final policy, acting on
// its most likely action, on env copies seeded apart from training.
Status Worker::EvaluateSingle() {
  AGENTRT_ASSIGN_OR_RETURN(
      std::unique_ptr<Env> env,
      GlobalEnvRegistry().MakeEnv(settings_.trainer.env, settings_.trainer.env_args));
  PpoLearner& learner = trainer_->learner();
  std::vector<float> obs(env->observation_space().size());
  std::vector<float> action(env->action_space().size());
  Rng rng(777);
  double total = 0;
  for (int e = 0; e < settings_.eval_episodes; ++e) {
    env->Reset(1000003ull + static_cast<uint64_t>(e), obs);
    double ret = 0;
    for (bool done = false; !done;) {
      learner.Act(obs, 1, action, /*deterministic=*/true, rng);
      const StepResult r = env->Step(action, obs);
      ret += r.reward;
      done = r.terminated || r.truncated;
    }
    total += ret;
  }
  const double mean = total / settings_.eval_episodes;
  log_("evaluation over %d episodes (most likely actions): return %.3f", settings_.eval_episodes,
       mean);
  runtime_->Report(trainer_->env_steps(), {{"eval_episodes", settings_.eval_episodes},
                                           {"eval_return_mean", mean},
                                           {"episode_return_mean", last_.episode_return_mean}});
  return Status::Ok();
}

Status Worker::Evaluate() {
  if (!multi_agent_) return settings_.eval_episodes > 0 ? EvaluateSingle() : Status::Ok();
  const WorldSides& sides = seating_.sides;
  if (seating_.side != sides.scoring_side || settings_.eval_episodes == 0) return Status::Ok();
  InstallSnapshots();
  // Players for the other seats from the newest snapshots; seats without one play at random.
  std::map<int, PolicyPlayer> players;
  for (const auto& [seat, snapshot] : latest_)
    AGENTRT_RETURN_IF_ERROR(players[seat].Load(snapshot));
  PpoLearner& learner = trainer_->learner();
  const int num_actions = static_cast<int>(trainer_->pool().action_space().n());
  std::vector<float> action(1);
  auto other = [&](int seat, std::span<const float> obs, Rng& rng) -> int {
    auto it = players.find(seat);
    if (it != players.end()) return it->second.Act(obs, rng);
    return static_cast<int>(rng.Below(static_cast<uint64_t>(num_actions)));
  };
  auto trained = [&](int seat, std::span<const float> obs, Rng& rng) -> int {
    if (seat == seating_.control) {
      learner.Act(obs, 1, action, /*deterministic=*/false, rng);
      return static_cast<int>(action[0]);
    }
    return other(seat, obs, rng);
  };
  // The same world with this agent's whole side playing at random: the yardstick.
  auto random_side = [&](int seat, std::span<const float> obs, Rng& rng) -> int {
    if (seating_.SideOfSeat(seat) == seating_.side)
      return static_cast<int>(rng.Below(static_cast<uint64_t>(num_actions)));
    return other(seat, obs, rng);
  };
  const uint64_t seed = 424242;
  const std::string& env = settings_.trainer.env;
  AGENTRT_ASSIGN_OR_RETURN(
      ScoreStats with_training,
      PlayWorld(env, seating_.world_args, settings_.eval_episodes, seed, trained));
  AGENTRT_ASSIGN_OR_RETURN(
      ScoreStats with_random,
      PlayWorld(env, seating_.world_args, settings_.eval_episodes, seed, random_side));
  const double ratio = with_random.score_per_episode > 0
                           ? with_training.score_per_episode / with_random.score_per_episode
                           : (with_training.score_per_episode > 0 ? 1e9 : 0.0);
  // The other sides' policies it was measured against, by role.
  std::string against, versions;
  std::map<std::string, int> other_snapshot;  // role -> 1 when a snapshot played it
  for (size_t i = 0; i < sides.roles.size(); ++i) {
    if (static_cast<int>(i) == seating_.side) continue;
    against += (against.empty() ? "" : ", ") + sides.roles[i];
    other_snapshot[sides.roles[i]] = 0;
  }
  for (const auto& [seat, snap] : latest_) {
    const int side = seating_.SideOfSeat(seat);
    if (side < 0 || side == seating_.side) continue;
    versions += " " + snap.agent + "@update" + std::to_string(snap.update);
    other_snapshot[sides.roles[static_cast<size_t>(side)]] = 1;
  }
  const std::string& role = sides.roles[static_cast<size_t>(seating_.side)];
  log_(
      "evaluation over %d episodes against %s%s: %ss/episode %.3f trained vs %.3f random %ss "
      "(ratio %.2f)",
      settings_.eval_episodes, against.c_str(),
      versions.empty() ? " playing at random" : versions.c_str(), sides.score.c_str(),
      with_training.score_per_episode, with_random.score_per_episode, role.c_str(), ratio);
  nlohmann::json eval = {{"eval_episodes", settings_.eval_episodes},
                         {"eval_" + sides.score + "_rate", with_training.score_per_episode},
                         {"eval_random_" + sides.score + "_rate", with_random.score_per_episode},
                         {"eval_" + sides.score + "_ratio", ratio},
                         {"episode_return_mean", last_.episode_return_mean},
                         {"episode_length_mean", last_.episode_length_mean}};
  for (const auto& [other_role, played] : other_snapshot)
    eval["eval_" + other_role + "_snapshot"] = played;
  if (league_) {
    eval["snapshots_received"] = league_->snapshots_received();
    if (auto stats = league_->bus().Stats(); stats.ok()) {
      eval["bus_messages_published"] = stats->messages_published;
      eval["bus_messages_delivered"] = stats->messages_delivered;
      eval["bus_topics"] = stats->topics;
      log_("bus stats: %lld topics, %lld messages published, %lld delivered",
           static_cast<long long>(stats->topics), static_cast<long long>(stats->messages_published),
           static_cast<long long>(stats->messages_delivered));
    }
    nlohmann::json result = eval;
    result["agent"] = agent_;
    result["kind"] = "evaluation";
    league_->PublishResult(result);
  }
  runtime_->Report(trainer_->env_steps(), eval);
  return Status::Ok();
}

Status Worker::Run() {
  // Before training starts, a bad argument, a refused GPU or a checkpoint of
  // another shape is the config's fault.
  auto configured = [this](Status s) {
    configuration_error_ =
        s.code() == StatusCode::kInvalidArgument || s.code() == StatusCode::kFailedPrecondition;
    return s;
  };
  if (Status s = Setup(); !s.ok()) return configured(s);
  if (Status s = SetupTrainer(); !s.ok()) return configured(s);
  // A checkpoint this agent cannot restore (another world size, a league
  // member without a bus) is the config's fault too.
  if (Status s = Restore(); !s.ok()) return configured(s);
  const auto start = SteadyTime::now();
  const int64_t start_steps = trainer_->env_steps();
  AGENTRT_RETURN_IF_ERROR(TrainLoop());
  // Budget reached or stop requested: always a last checkpoint.
  AGENTRT_RETURN_IF_ERROR(SaveCheckpoint(/*wait=*/true));
  const int64_t steps = trainer_->env_steps();
  const double seconds = std::chrono::duration<double>(SteadyTime::now() - start).count();
  log_("%s at env step %lld (%lld this run in %.1f s), checkpoint saved",
       runtime_->ShouldStop() ? "stopped" : "budget reached", static_cast<long long>(steps),
       static_cast<long long>(steps - start_steps), seconds);
  if (steps == start_steps && start_steps > 0 && adopted_ && rank_ == 0) {
    // Replaced at its budget (PBT): the weights are another's, so is any
    // evaluation before; evaluate these.
    log_("nothing left to train after adopting another agent's checkpoint: evaluating it");
    return Evaluate();
  }
  if (steps == start_steps && start_steps > 0) {
    // A restart after the budget was already spent (the agent was torn down
    // after its last checkpoint): nothing was trained, and the evaluation the
    // earlier incarnation reported stands.
    log_("nothing left to train after the restart; the earlier evaluation stands");
    return Status::Ok();
  }
  if (play_) {
    // The last match's result; the league's ratings are a member's evaluation.
    if (Status s = play_->Finish(league_->newest_published(), steps); !s.ok())
      log_("league: the last results were not acknowledged: %s", s.ToString().c_str());
    return Status::Ok();
  }
  if (rank_ == 0 && !runtime_->ShouldStop()) AGENTRT_RETURN_IF_ERROR(Evaluate());
  return Status::Ok();
}

}  // namespace

int WorkerMain() {
  Worker worker;
  Status status = worker.Run();
  if (!status.ok()) {
    std::fprintf(stderr, "agent-worker: %s\n", status.ToString().c_str());
    if (worker.configuration_error()) return kExitConfigError;
    return status.code() == StatusCode::kUnavailable ? kExitTempFail : 1;
  }
  return 0;
}

}  // namespace agentrt::worker
