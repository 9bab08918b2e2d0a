// The dummy env, commented for someone writing their first env. See dummy.h.
#include "envs/dummy.h"

#include <algorithm>

#include "envs/params.h"

namespace agentrt {

// Spaces are built once: Step() must not allocate, and the accessors hand out
// references that stay valid for the env's lifetime.
DummyEnv::DummyEnv(int n, int length)
    : n_(n),
      length_(length),
      observation_space_(Space::Box({n}, 0.0f, 1.0f)),
      action_space_(Space::Discrete(n)) {}

void DummyEnv::Reset(std::optional<uint64_t> seed, std::span<float> obs) {
  // A seed restarts the random stream: Reset(7) always replays the same
  // episode, which is what makes EnvPool runs reproducible. Without a seed
  // (auto-reset inside a pool) the stream simply continues.
  if (seed) rng_.Seed(*seed);
  elapsed_ = 0;
  LightAndObserve(obs);
}

StepResult DummyEnv::Step(std::span<const float> action, std::span<float> obs) {
  // A Discrete action arrives as one float holding the index. Clamp rather
  // than trust it: a bad action must not corrupt memory.
  const int a = std::clamp(static_cast<int>(action[0]), 0, n_ - 1);
  StepResult result;
  result.reward = a == lit_ ? 1.0f : 0.0f;
  // This task has no terminal state; the episode is cut by the time limit, so
  // it is `truncated` (a learner bootstraps the value of the last observation),
  // never `terminated` (which would mean "nothing more to earn from here").
  ++elapsed_;
  result.truncated = elapsed_ >= length_;
  // Always write the next observation, also on the last step: a pool keeps it
  // as the final observation for bootstrapping before it auto-resets the env.
  LightAndObserve(obs);
  return result;
}

void DummyEnv::LightAndObserve(std::span<float> obs) {
  lit_ = static_cast<int>(rng_.Below(static_cast<uint64_t>(n_)));
  // Write every element: the buffer belongs to the caller and holds whatever
  // the previous step left there.
  std::fill(obs.begin(), obs.begin() + n_, 0.0f);
  obs[static_cast<size_t>(lit_)] = 1.0f;
}

// The factory: named parameters with defaults, range checks, and a clear error
// for a typo ("env dummy: unknown parameter 'lenght' (known: length, n)").
Result<std::unique_ptr<Env>> MakeDummyEnv(const nlohmann::json& params) {
  Params p(params, "env dummy");
  const int n = p.Get("n", 4);
  const int length = p.Get("length", 16);
  if (n < 1) p.Invalid("n", "must be >= 1");
  if (length < 1) p.Invalid("length", "must be >= 1");
  AGENTRT_RETURN_IF_ERROR(p.Finish());
  return std::unique_ptr<Env>(std::make_unique<DummyEnv>(n, length));
}

}  // namespace agentrt
