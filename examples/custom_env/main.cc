// corridor-agent: a custom trainer embedding agentrt. Started by `agentctl run`
// (see agents.yaml here), it
//   1. builds agentrt::Runtime from the environment the launcher sets
//      (AGENTRT_RUN_DIR, AGENTRT_AGENT, AGENTRT_CKPT_DIR, AGENTRT_TELEMETRY, ...);
//   2. takes its own `args` and checkpoint policy from the run's plan, which the
//      Runtime has loaded (no file of agentrt's is parsed here);
//   3. resumes from its newest valid checkpoint, if any;
//   4. trains a tabular Q-learning policy on the user-defined Corridor env,
//      reporting metrics (they land in RUN_DIR/metrics.jsonl) and saving
//      checkpoints on the wall-clock schedule;
//   5. exits 0 at its step budget, or saves a last checkpoint and exits 0 when
//      asked to stop (SIGTERM from `agentctl stop`, preemption).
#include <algorithm>
#include <cstdio>
#include <deque>
#include <nlohmann/json.hpp>
#include <numeric>
#include <vector>

#include "agent_runtime/runtime.h"
#include "corridor.h"
#include "envs/params.h"
#include "envs/rng.h"

namespace {

struct Settings {
  int64_t steps = 20000;
  double lr = 0.5;
  double gamma = 0.97;
  double epsilon = 0.2;
  uint64_t seed = 1;
  nlohmann::json env_args = nlohmann::json::object();
};

agentrt::Result<Settings> ParseSettings(const nlohmann::json& args) {
  agentrt::Params p(args, "corridor-agent args");
  Settings s;
  s.steps = p.Get("steps", s.steps);
  s.lr = p.Get("lr", s.lr);
  s.gamma = p.Get("gamma", s.gamma);
  s.epsilon = p.Get("epsilon", s.epsilon);
  s.seed = p.Get("seed", s.seed);
  s.env_args = p.Get("env_args", s.env_args);
  if (s.steps <= 0) p.Invalid("steps", "must be positive");
  AGENTRT_RETURN_IF_ERROR(p.Finish());
  return s;
}

int Fail(const agentrt::Status& status) {
  std::fprintf(stderr, "corridor-agent: %s\n", status.ToString().c_str());
  return 1;
}

}  // namespace

int main() {
  auto rt = agentrt::Runtime::FromEnvironment();
  if (!rt.ok()) return Fail(rt.status());
  agentrt::Runtime& runtime = **rt;

  auto settings = ParseSettings(runtime.args());
  if (!settings.ok()) return Fail(settings.status());
  auto made = MakeCorridor(settings->env_args);
  if (!made.ok()) return Fail(made.status());
  agentrt::Env& env = **made;

  const int cells = static_cast<int>(env.observation_space().size());
  std::vector<float> q(static_cast<size_t>(cells) * 2, 0.0f);  // Q[cell][action]
  agentrt::Rng rng(settings->seed + static_cast<uint64_t>(runtime.env().rank));
  int64_t step = 0;
  int64_t episodes = 0;

  // Resume: the Q table, the RNG and the step come back from the checkpoint.
  agentrt::Checkpointer& ckpt = runtime.checkpointer();
  auto restored = ckpt.Restore();
  if (!restored.ok()) return Fail(restored.status());
  std::printf("corridor-agent %s: %s\n", runtime.env().agent.c_str(), restored->Describe().c_str());
  if (restored->restored()) {
    agentrt::Rng::State state;
    if (auto s = restored->shard.CopyTo("q", q.data(), q.size() * sizeof(float)); !s.ok())
      return Fail(s);
    if (auto s = restored->shard.CopyTo("rng", state.data(), sizeof(state)); !s.ok())
      return Fail(s);
    rng.set_state(state);
    step = restored->step;
    episodes = restored->metadata.value("episodes", int64_t{0});
  }
  agentrt::Rng::State rng_state = rng.state();
  agentrt::CheckpointState state;
  state.AddArray("q", q.data(), "float32", {cells, 2}, sizeof(float));
  state.AddBytes("rng", rng_state.data(), sizeof(rng_state));
  auto save = [&](bool wait) {
    rng_state = rng.state();
    state.metadata["episodes"] = episodes;
    return wait ? ckpt.Save(step, state) : ckpt.SaveAsync(step, state);
  };

  std::vector<float> obs(static_cast<size_t>(cells));
  std::deque<float> returns, lengths;  // last 20 episodes
  auto cell_of = [&] {
    return static_cast<int>(std::max_element(obs.begin(), obs.end()) - obs.begin());
  };
  while (step < settings->steps && !runtime.ShouldStop()) {
    env.Reset(std::nullopt, obs);
    float episode_return = 0.0f;
    int length = 0;
    for (bool done = false; !done; ++length, ++step) {
      const int s = cell_of();
      float* qs = &q[static_cast<size_t>(s) * 2];
      const int a =
          rng.Uniform() < settings->epsilon
              ? static_cast<int>(rng.Below(2))
              : (qs[1] > qs[0] ? 1 : (qs[0] > qs[1] ? 0 : static_cast<int>(rng.Below(2))));
      const float action = static_cast<float>(a);
      const agentrt::StepResult r = env.Step({&action, 1}, obs);
      const float* next = &q[static_cast<size_t>(cell_of()) * 2];
      const double target =
          r.reward + (r.terminated ? 0.0 : settings->gamma * std::max(next[0], next[1]));
      qs[a] += static_cast<float>(settings->lr * (target - qs[a]));
      episode_return += r.reward;
      done = r.terminated || r.truncated;
    }
    ++episodes;
    returns.push_back(episode_return);
    lengths.push_back(static_cast<float>(length));
    if (returns.size() > 20) returns.pop_front(), lengths.pop_front();
    if (episodes % 10 == 0) {
      const double n = static_cast<double>(returns.size());
      runtime.Report(
          step, {{"episode_return_mean", std::accumulate(returns.begin(), returns.end(), 0.0) / n},
                 {"episode_length_mean", std::accumulate(lengths.begin(), lengths.end(), 0.0) / n},
                 {"episodes", episodes}});
    }
    if (ckpt.SaveDue()) {  // the plan's checkpoint.interval_s has passed (or SIGUSR2)
      std::printf("corridor-agent %s: checkpoint due at step %lld\n", runtime.env().agent.c_str(),
                  static_cast<long long>(step));
      if (auto s = save(false); !s.ok()) return Fail(s);
    }
  }
  // Budget reached or stop requested: a last checkpoint, then exit 0.
  if (auto s = save(true); !s.ok()) return Fail(s);
  std::printf("corridor-agent %s: %s at step %lld after %lld episodes, checkpoint saved\n",
              runtime.env().agent.c_str(), runtime.ShouldStop() ? "stopped" : "done",
              static_cast<long long>(step), static_cast<long long>(episodes));
  return 0;
}
