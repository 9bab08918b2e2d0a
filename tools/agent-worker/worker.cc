#include "tools/agent-worker/worker.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdarg>
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "agent_runtime/group.h"
#include "agent_runtime/runtime.h"
#include "comms/bus_client.h"
#include "envs/env_pool.h"
#include "envs/registry.h"
#include "envs/single_agent_view.h"
#include "learners/ppo.h"
#include "tools/agent-worker/league.h"
#include "tools/agent-worker/policy_snapshot.h"
#include "tools/agent-worker/pursuit_eval.h"
#include "tools/agent-worker/settings.h"

namespace agentrt::worker {
namespace {

using Clock = std::chrono::steady_clock;

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

GroupBackend GroupBackendFromPlan(const std::string& backend) {
  if (backend == "single") return GroupBackend::kSingle;
  if (backend == "mpi") return GroupBackend::kMpi;
  if (backend == "nccl") return GroupBackend::kNccl;
  return GroupBackend::kAuto;
}

class Worker {
 public:
  Status Run();

 private:
  Status Setup();
  Status SetupEnvs();
  void SetupBus(const std::map<std::string, int64_t>& offsets);
  Status Restore();
  void InstallSnapshots();
  Status TrainLoop();
  Status SaveCheckpoint(bool wait);
  Status Evaluate();
  void ReportUpdate(const PpoMetrics& m, const std::array<float, 6>& totals, double steps_per_s);

  Log log_;
  std::unique_ptr<Runtime> runtime_;
  std::string agent_;
  int rank_ = 0;
  int world_ = 1;
  std::vector<PlanAgentArgs> plan_;
  const PlanAgentArgs* me_ = nullptr;
  WorkerSettings settings_;
  bool multi_agent_ = false;
  Seating seating_;
  std::unique_ptr<Group> group_;
  std::unique_ptr<EnvPool> pool_;
  std::vector<std::unique_ptr<CopySeats>> seats_;  // per env copy (multi-agent)
  std::unique_ptr<PpoLearner> learner_;
  std::unique_ptr<League> league_;
  std::map<int, PolicySnapshot> latest_;  // seat -> newest snapshot installed
  int64_t env_steps_ = 0;
  int64_t episodes_ = 0;
  double last_return_mean_ = 0;
  double last_length_mean_ = 0;
  std::vector<uint8_t> learner_state_;  // checkpoint scratch
  std::array<int64_t, 2> counters_{};   // env_steps, episodes (checkpointed)
  Clock::time_point last_log_ = Clock::now();
};

Status Worker::Setup() {
  AGENTRT_ASSIGN_OR_RETURN(Assignment assignment, AssignmentFromEnvironment());
  agent_ = assignment.agent;
  rank_ = assignment.rank;
  world_ = assignment.world_size;
  log_.SetPrefix(agent_ + " rank " + std::to_string(rank_));

  const std::string plan_path = assignment.run_dir + "/plan.json";
  AGENTRT_ASSIGN_OR_RETURN(plan_, ReadPlanAgents(plan_path));
  for (const auto& a : plan_) {
    if (a.name == agent_) me_ = &a;
  }
  if (me_ == nullptr) return NotFound(plan_path + ": no agent named '" + agent_ + "'");
  if (me_->ranks != world_) {
    return FailedPrecondition(plan_path + ": agent " + agent_ + " has " + std::to_string(me_->ranks) +
                              " ranks in the plan but WORLD_SIZE is " + std::to_string(world_));
  }
  AGENTRT_ASSIGN_OR_RETURN(settings_, WorkerSettings::FromArgs(me_->args, "agent " + agent_ + " args"));

  RuntimeOptions options;
  options.checkpoint.interval_s =
      settings_.checkpoint_interval_s >= 0 ? settings_.checkpoint_interval_s : me_->checkpoint_interval_s;
  options.checkpoint.keep_last = me_->checkpoint_keep_last;
  AGENTRT_ASSIGN_OR_RETURN(runtime_, Runtime::Create(assignment, options));

  GroupOptions group;
  group.backend = GroupBackendFromPlan(me_->backend);
  group.agent = agent_;
  group.rank = rank_;
  group.world_size = world_;
  group.has_gpus = !assignment.visible_gpus.empty();
  group.master_addr = assignment.master_addr;
  group.master_port = assignment.master_port;
  AGENTRT_ASSIGN_OR_RETURN(group_, MakeGroup(group));
  if (group_->device_buffers()) {
    return FailedPrecondition("agent " + agent_ + ": the PPO learner runs on the CPU; give agent-worker agents gpus: 0");
  }
  log_("plan %s, env %s, %d rank(s) on a %s group, budget %lld env steps", plan_path.c_str(),
       settings_.env.c_str(), world_, std::string(group_->backend()).c_str(),
       static_cast<long long>(settings_.ppo.steps));
  return Status::Ok();
}

Status Worker::SetupEnvs() {
  EnvRegistry& registry = GlobalEnvRegistry();
  multi_agent_ = registry.IsMultiAgent(settings_.env);
  nlohmann::json env_args = settings_.env_args;
  if (multi_agent_) {
    AGENTRT_ASSIGN_OR_RETURN(seating_, SeatPursuit(plan_, agent_, settings_));
    env_args = seating_.world_args;
    std::string others;
    for (const auto& [seat, agent] : seating_.others) others += " " + std::to_string(seat) + "=" + agent;
    log_("%s world: %d predators, %d prey; this agent plays seat %d; seats played by others:%s",
         settings_.env.c_str(), seating_.predators, seating_.prey, seating_.control,
         others.empty() ? " none" : others.c_str());
  }
  EnvPoolOptions pool_options;
  pool_options.num_envs = settings_.ppo.num_envs;
  pool_options.num_threads = settings_.env_threads;
  // Distinct episodes per rank and per restart (the env state is not checkpointed).
  pool_options.seed = settings_.ppo.seed * 1000003ULL + static_cast<uint64_t>(rank_) * 10007ULL +
                      static_cast<uint64_t>(runtime_->assignment().restart_count) * 7919ULL;
  auto factory = [&]() -> Result<std::unique_ptr<Env>> {
    AGENTRT_ASSIGN_OR_RETURN(std::unique_ptr<Env> env, registry.MakeEnv(settings_.env, env_args));
    if (multi_agent_) {
      auto* view = dynamic_cast<SingleAgentView*>(env.get());
      if (view == nullptr) return Internal("env " + settings_.env + " did not come as a SingleAgentView");
      auto copy = std::make_unique<CopySeats>();
      copy->num_actions = static_cast<int>(view->action_space().n());
      CopySeats* seats = copy.get();
      view->set_others_policy([seats](int seat, std::span<const float> obs, std::span<float> action, Rng& rng) {
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
    }
    return env;
  };
  AGENTRT_ASSIGN_OR_RETURN(pool_, EnvPool::Make(factory, pool_options));
  if (!pool_->action_space().is_discrete()) {
    return InvalidArgument("agent " + agent_ + ": env " + settings_.env + " has action space " +
                           pool_->action_space().ToString() + "; the PPO learner needs a Discrete one");
  }
  AGENTRT_ASSIGN_OR_RETURN(learner_, PpoLearner::Make(settings_.ppo, pool_->observation_space(),
                                                      pool_->action_space(), *group_));
  return Status::Ok();
}

void Worker::SetupBus(const std::map<std::string, int64_t>& offsets) {
  if (!multi_agent_) return;  // single-agent envs have nobody to play with
  const Assignment& a = runtime_->assignment();
  if (a.bus.empty()) {
    log_("no bus (AGENTRT_BUS is not set): training without it; other seats play at random, "
         "no snapshots are published");
    return;
  }
  auto bus = BusClient::FromEnvironment();
  if (!bus.ok()) {
    log_("bus %s not usable (%s): training without it; other seats play at random", a.bus.c_str(),
         bus.status().ToString().c_str());
    return;
  }
  if (Status ready = (*bus)->WaitForReady(std::chrono::seconds(10)); !ready.ok()) {
    log_("bus %s not reachable (%s): training without it; other seats play at random", a.bus.c_str(),
         ready.ToString().c_str());
    return;
  }
  auto league = League::Start(std::move(*bus), seating_.others, offsets);
  if (!league.ok()) {
    log_("bus %s: %s; training without it", a.bus.c_str(), league.status().ToString().c_str());
    return;
  }
  league_ = std::move(*league);
  log_("bus %s: subscribed to the policies of %zu seat(s)%s", a.bus.c_str(), seating_.others.size(),
       offsets.empty() ? "" : " from the checkpoint's offsets");
}

Status Worker::Restore() {
  AGENTRT_ASSIGN_OR_RETURN(RestoreResult restored, runtime_->checkpointer().Restore());
  log_("%s", restored.Describe().c_str());
  std::map<std::string, int64_t> offsets;
  if (restored.restored()) {
    const auto bytes = restored.shard.Bytes("learner");
    if (bytes.empty()) return DataLoss("agent " + agent_ + ": checkpoint step " + std::to_string(restored.step) +
                                       " has no learner state for rank " + std::to_string(rank_));
    AGENTRT_RETURN_IF_ERROR(learner_->LoadState(
        {reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()}));
    AGENTRT_RETURN_IF_ERROR(restored.shard.CopyTo("counters", counters_.data(), sizeof(counters_)));
    env_steps_ = counters_[0];
    episodes_ = counters_[1];
    if (restored.metadata.contains("bus_offsets")) {
      offsets = restored.metadata["bus_offsets"].get<std::map<std::string, int64_t>>();
    }
    log_("resumed at env step %lld (update %lld, %lld episodes)", static_cast<long long>(env_steps_),
         static_cast<long long>(learner_->updates()), static_cast<long long>(episodes_));
  }
  SetupBus(offsets);
  return Status::Ok();
}

Status Worker::SaveCheckpoint(bool wait) {
  learner_state_ = learner_->SaveState();
  if (learner_state_.empty()) return Internal("agent " + agent_ + ": the learner state could not be read");
  counters_ = {env_steps_, episodes_};
  CheckpointState state;
  state.AddBytes("learner", learner_state_.data(), learner_state_.size());
  state.AddArray("counters", counters_.data(), "int64", {2}, sizeof(int64_t));
  state.metadata["env_steps"] = env_steps_;
  state.metadata["updates"] = learner_->updates();
  state.metadata["episodes"] = episodes_;
  if (league_) state.metadata["bus_offsets"] = league_->SubscriptionOffsets();
  Checkpointer& ckpt = runtime_->checkpointer();
  return wait ? ckpt.Save(env_steps_, state) : ckpt.SaveAsync(env_steps_, state);
}

void Worker::InstallSnapshots() {
  if (!league_) return;
  league_->CatchUp();
  std::map<int, PolicySnapshot> fresh;
  league_->TakeNew(fresh);
  for (auto& [seat, snapshot] : fresh) {
    for (auto& copy : seats_) {
      if (Status s = copy->players[seat].Load(snapshot); !s.ok()) {
        log_("seat %d: snapshot of %s refused: %s", seat, snapshot.agent.c_str(), s.ToString().c_str());
        break;
      }
    }
    latest_[seat] = std::move(snapshot);
  }
}

void Worker::ReportUpdate(const PpoMetrics& m, const std::array<float, 6>& totals, double steps_per_s) {
  if (totals[2] > 0) {
    last_return_mean_ = totals[0] / totals[2];
    last_length_mean_ = totals[1] / totals[2];
  }
  nlohmann::json metrics = {{"episode_return_mean", last_return_mean_},
                            {"episode_length", last_length_mean_},
                            {"episodes", episodes_},
                            {"steps_per_s", steps_per_s},
                            {"updates", m.updates},
                            {"lr", m.lr},
                            {"pg_loss", m.pg_loss},
                            {"v_loss", m.v_loss},
                            {"entropy", m.entropy},
                            {"approx_kl", m.approx_kl},
                            {"clip_fraction", m.clip_fraction},
                            {"explained_variance", m.explained_variance}};
  if (multi_agent_ && totals[2] > 0) metrics["capture_rate"] = totals[3] / totals[2];
  if (league_) {
    metrics["snapshots_received"] = league_->snapshots_received();
    metrics["bus_published"] = league_->published();
    metrics["bus_stream_stalls"] = league_->stream_stalls();
    // Flat numbers (the metrics stream holds numbers): which update of each
    // other agent's policy played its seat.
    for (const auto& [seat, snap] : latest_) metrics["opponent_update/" + snap.agent] = snap.update;
  }
  runtime_->Report(env_steps_, metrics);
  // A progress line in the rank's log every few seconds (the metrics stream is the record).
  const auto now = Clock::now();
  if (now - last_log_ >= std::chrono::seconds(5)) {
    last_log_ = now;
    log_("env step %lld: episode return %.3f, length %.1f, %.0f steps/s, entropy %.3f",
         static_cast<long long>(env_steps_), last_return_mean_, last_length_mean_, steps_per_s, m.entropy);
  }
}

Status Worker::TrainLoop() {
  const int num_envs = pool_->num_envs();
  const int64_t steps_per_update = static_cast<int64_t>(world_) * num_envs * settings_.ppo.rollout_steps;
  pool_->Reset();
  PpoMetrics metrics;
  // Per update, summed over the group: return, length, episodes, captures, save, stop.
  std::array<float, 6> totals{};
  auto last_report = Clock::now();
  int64_t steps_at_report = env_steps_;
  while (env_steps_ < settings_.ppo.steps) {
    InstallSnapshots();
    totals.fill(0.0f);
    for (int t = 0; t < settings_.ppo.rollout_steps; ++t) {
      learner_->ActAndRecord(pool_->observations(), pool_->actions());
      pool_->Step();
      learner_->RecordStep(pool_->rewards(), pool_->terminated(), pool_->truncated(),
                           pool_->final_observations());
      const auto term = pool_->terminated();
      const auto trunc = pool_->truncated();
      for (int i = 0; i < num_envs; ++i) {
        if (!term[static_cast<size_t>(i)] && !trunc[static_cast<size_t>(i)]) continue;
        const float ret = pool_->episode_returns()[static_cast<size_t>(i)];
        totals[0] += ret;
        totals[1] += static_cast<float>(pool_->episode_lengths()[static_cast<size_t>(i)]);
        totals[2] += 1.0f;
        // Pursuit: a terminated episode is a capture (every prey caught, or
        // this prey caught); a truncated one is an escape.
        if (term[static_cast<size_t>(i)]) totals[3] += 1.0f;
      }
    }
    AGENTRT_RETURN_IF_ERROR(learner_->Update(pool_->observations(), &metrics));
    env_steps_ += steps_per_update;
    // Every rank must agree on saving and stopping (they are collective).
    totals[4] = runtime_->checkpointer().SaveDue() ? 1.0f : 0.0f;
    totals[5] = runtime_->ShouldStop() ? 1.0f : 0.0f;
    AGENTRT_RETURN_IF_ERROR(group_->AllReduce(totals.data(), totals.size(), DataType::kFloat32, ReduceOp::kSum,
                                              std::chrono::minutes(2)));
    episodes_ += static_cast<int64_t>(totals[2]);
    if (rank_ == 0) {
      if (learner_->updates() % settings_.report_every == 0) {
        const auto now = Clock::now();
        const double dt = std::chrono::duration<double>(now - last_report).count();
        const double sps = dt > 0 ? static_cast<double>(env_steps_ - steps_at_report) / dt : 0.0;
        last_report = now;
        steps_at_report = env_steps_;
        ReportUpdate(metrics, totals, sps);
      }
      if (league_ && learner_->updates() % settings_.snapshot_every == 0) {
        league_->PublishSnapshot(SnapshotOf(*learner_, agent_, env_steps_));
        nlohmann::json result = {{"agent", agent_},
                                 {"seat", seating_.control},
                                 {"update", learner_->updates()},
                                 {"env_steps", env_steps_},
                                 {"episodes", static_cast<int64_t>(totals[2])},
                                 {"return_mean", last_return_mean_}};
        if (totals[2] > 0) result["capture_rate"] = totals[3] / totals[2];
        nlohmann::json opponents = nlohmann::json::object();
        for (const auto& [seat, snap] : latest_) opponents[snap.agent] = snap.update;
        result["opponents"] = opponents;
        league_->PublishResult(result);
      }
    } else {
      runtime_->SetStep(env_steps_);
    }
    if (totals[5] > 0) {
      log_("stop requested (%s) at env step %lld: saving a checkpoint", runtime_->stop_reason().c_str(),
           static_cast<long long>(env_steps_));
      return Status::Ok();
    }
    if (totals[4] > 0) AGENTRT_RETURN_IF_ERROR(SaveCheckpoint(/*wait=*/false));
  }
  return Status::Ok();
}

Status Worker::Evaluate() {
  if (!multi_agent_ || seating_.control >= seating_.predators || settings_.eval_episodes == 0) return Status::Ok();
  InstallSnapshots();
  // Players for the other seats from the newest snapshots; seats without one play at random.
  std::map<int, PolicyPlayer> players;
  for (const auto& [seat, snapshot] : latest_) AGENTRT_RETURN_IF_ERROR(players[seat].Load(snapshot));
  const int num_actions = static_cast<int>(pool_->action_space().n());
  std::vector<float> action(1);
  auto other = [&](int seat, std::span<const float> obs, Rng& rng) -> int {
    auto it = players.find(seat);
    if (it != players.end()) return it->second.Act(obs, rng);
    return static_cast<int>(rng.Below(static_cast<uint64_t>(num_actions)));
  };
  auto trained = [&](int seat, std::span<const float> obs, Rng& rng) -> int {
    if (seat == seating_.control) {
      learner_->Act(obs, 1, action, /*deterministic=*/false, rng);
      return static_cast<int>(action[0]);
    }
    return other(seat, obs, rng);
  };
  auto random_predators = [&](int seat, std::span<const float> obs, Rng& rng) -> int {
    if (seat < seating_.predators) return static_cast<int>(rng.Below(static_cast<uint64_t>(num_actions)));
    return other(seat, obs, rng);
  };
  const uint64_t seed = 424242;
  AGENTRT_ASSIGN_OR_RETURN(CaptureStats with_training,
                           PlayPursuit(seating_.world_args, settings_.eval_episodes, seed, trained));
  AGENTRT_ASSIGN_OR_RETURN(CaptureStats with_random,
                           PlayPursuit(seating_.world_args, settings_.eval_episodes, seed, random_predators));
  const double ratio = with_random.captures_per_episode > 0
                           ? with_training.captures_per_episode / with_random.captures_per_episode
                           : (with_training.captures_per_episode > 0 ? 1e9 : 0.0);
  std::string prey_versions;
  for (const auto& [seat, snap] : latest_) {
    if (seat >= seating_.predators) prey_versions += " " + snap.agent + "@update" + std::to_string(snap.update);
  }
  log_("evaluation over %d episodes against prey%s: captures/episode %.3f trained vs %.3f random predators "
       "(ratio %.2f)",
       settings_.eval_episodes, prey_versions.empty() ? " playing at random" : prey_versions.c_str(),
       with_training.captures_per_episode, with_random.captures_per_episode, ratio);
  nlohmann::json eval = {{"eval_episodes", settings_.eval_episodes},
                         {"eval_capture_rate", with_training.captures_per_episode},
                         {"eval_random_capture_rate", with_random.captures_per_episode},
                         {"eval_capture_ratio", ratio},
                         {"eval_prey_snapshot", prey_versions.empty() ? 0 : 1},
                         {"episode_return_mean", last_return_mean_},
                         {"episode_length", last_length_mean_}};
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
  runtime_->Report(env_steps_, eval);
  return Status::Ok();
}

Status Worker::Run() {
  AGENTRT_RETURN_IF_ERROR(Setup());
  AGENTRT_RETURN_IF_ERROR(SetupEnvs());
  AGENTRT_RETURN_IF_ERROR(Restore());
  const auto start = Clock::now();
  const int64_t start_steps = env_steps_;
  AGENTRT_RETURN_IF_ERROR(TrainLoop());
  // Budget reached or stop requested: always a last checkpoint.
  AGENTRT_RETURN_IF_ERROR(SaveCheckpoint(/*wait=*/true));
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  log_("%s at env step %lld (%lld this run in %.1f s), checkpoint saved",
       runtime_->ShouldStop() ? "stopped" : "budget reached", static_cast<long long>(env_steps_),
       static_cast<long long>(env_steps_ - start_steps), seconds);
  if (env_steps_ == start_steps && start_steps > 0) {
    // A restart after the budget was already spent (the agent was torn down
    // after its last checkpoint): nothing was trained, and the evaluation the
    // earlier incarnation reported stands.
    log_("nothing left to train after the restart; the earlier evaluation stands");
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
    return 1;
  }
  return 0;
}

}  // namespace agentrt::worker
