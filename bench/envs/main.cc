// bench_envs: how fast cartpole steps.
//   raw      one CartPole stepped in a loop on one thread (auto-reset included)
//   pool     EnvPool of 1024 cartpoles on 2 threads (and on 1, for reference)
//   anchor   the same dynamics as a pure-Python loop (python3 -c ...), the
//            speed a Gymnasium user's own CartPole step has, minus numpy.
// Each figure is the median of 5 timed runs. Prints one JSON object per figure, last.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "bench/figure.h"
#include "envs/cartpole.h"
#include "envs/env_pool.h"
#include "envs/rng.h"

namespace {

using agentrt::bench::Median;

using Clock = std::chrono::steady_clock;

// Random actions prepared up front so the loop measures the env, not the RNG.
std::vector<float> ActionTable(size_t n) {
  agentrt::Rng rng(1);
  std::vector<float> a(n);
  for (auto& x : a) x = static_cast<float>(rng.Below(2));
  return a;
}

double RawStepsPerSecond(int64_t steps, const std::vector<float>& actions) {
  agentrt::CartPole env;
  float obs[4];
  env.Reset(0, obs);
  float sink = 0.0f;
  const auto start = Clock::now();
  for (int64_t t = 0; t < steps; ++t) {
    const agentrt::StepResult r =
        env.Step({&actions[static_cast<size_t>(t) & (actions.size() - 1)], 1}, obs);
    sink += obs[0];
    if (r.terminated || r.truncated) env.Reset(std::nullopt, obs);
  }
  const double s = std::chrono::duration<double>(Clock::now() - start).count();
  if (sink == 12345.0f) std::puts("");  // keep the loop's result alive
  return static_cast<double>(steps) / s;
}

double PoolStepsPerSecond(int threads, int num_envs, int iterations,
                          const std::vector<float>& actions) {
  auto pool = agentrt::EnvPool::Make([] { return agentrt::MakeCartPole(nullptr); },
                                     {.num_envs = num_envs, .num_threads = threads, .seed = 0});
  if (!pool.ok()) {
    std::fprintf(stderr, "bench_envs: %s\n", pool.status().ToString().c_str());
    std::exit(1);
  }
  agentrt::EnvPool& p = **pool;
  p.Reset();
  const auto start = Clock::now();
  for (int it = 0; it < iterations; ++it) {
    std::copy_n(actions.begin() + (it * 7) % 4096, num_envs, p.actions().begin());
    p.Step();
  }
  const double s = std::chrono::duration<double>(Clock::now() - start).count();
  return static_cast<double>(num_envs) * iterations / s;
}

constexpr const char* kPythonLoop = R"PY(
import math, random, time
g=9.8; mc=1.0; mp=0.1; tm=mp+mc; l=0.5; pml=mp*l; fm=10.0; tau=0.02
tt=12*2*math.pi/360; xt=2.4
random.seed(1)
acts=[random.getrandbits(1) for _ in range(4096)]
def run(n):
    x,xd,t,td=[random.uniform(-0.05,0.05) for _ in range(4)]
    steps=0
    t0=time.perf_counter()
    for i in range(n):
        f= fm if acts[i & 4095]==1 else -fm
        c=math.cos(t); s=math.sin(t)
        temp=(f+pml*td*td*s)/tm
        ta=(g*s-c*temp)/(l*(4.0/3.0-mp*c*c/tm))
        xa=temp-pml*ta*c/tm
        x=x+tau*xd; xd=xd+tau*xa; t=t+tau*td; td=td+tau*ta
        steps+=1
        if x<-xt or x>xt or t<-tt or t>tt or steps>=500:
            x,xd,t,td=[random.uniform(-0.05,0.05) for _ in range(4)]
            steps=0
    return n/(time.perf_counter()-t0)
r=[run(200000) for _ in range(5)]
r.sort()
print(r[2])
)PY";

double PythonStepsPerSecond() {
  const std::string cmd = std::string(AGENTRT_PYTHON3) + " -c '" + kPythonLoop + "'";
  FILE* p = ::popen(cmd.c_str(), "r");
  if (p == nullptr) return 0.0;
  char line[256] = {0};
  const bool got = std::fgets(line, sizeof line, p) != nullptr;
  const int rc = ::pclose(p);
  if (!got || rc != 0) {
    std::fprintf(stderr, "bench_envs: the python anchor failed (rc %d)\n", rc);
    return 0.0;
  }
  return std::atof(line);
}

void Figure(const std::string& metric, double value, const std::string& anchor,
            double anchor_value) {
  agentrt::bench::PrintFigure("envs", metric, value, "steps/s", anchor, anchor_value);
}

}  // namespace

int main() {
  const std::vector<float> actions = ActionTable(1 << 16);
  std::vector<double> raw, pool1, pool2;
  for (int rep = 0; rep < 5; ++rep) {
    raw.push_back(RawStepsPerSecond(20'000'000, actions));
    pool1.push_back(PoolStepsPerSecond(1, 1024, 5000, actions));
    pool2.push_back(PoolStepsPerSecond(2, 1024, 5000, actions));
  }
  const double python = PythonStepsPerSecond();
  std::fprintf(stderr,
               "bench_envs: raw %.3g steps/s, pool(1024 envs) 1 thread %.3g, 2 threads %.3g, "
               "python loop %.3g\n",
               Median(raw), Median(pool1), Median(pool2), python);
  Figure("cartpole_steps_per_s_single_thread", Median(raw), "python_loop_steps_per_s", python);
  Figure("cartpole_pool_steps_per_s_2_threads", Median(pool2), "python_loop_steps_per_s", python);
  Figure("cartpole_pool_steps_per_s_2_threads_vs_1", Median(pool2), "pool_steps_per_s_1_thread",
         Median(pool1));
  return 0;
}
