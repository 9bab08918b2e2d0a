// AdamW: the optimizer math shared by ShardedAdam (per shard) and a plain,
// unsharded reference optimizer (tests, benchmarks, single-process learners).
//
// The update follows torch.optim.AdamW exactly:
//   p -= lr * weight_decay * p
//   m  = beta1 * m + (1 - beta1) * g
//   v  = beta2 * v + (1 - beta2) * g^2
//   p -= (lr / (1 - beta1^t)) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)
// with g = grad * grad_scale (grad_scale folds in averaging and clipping).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace agentrt {

struct AdamWOptions {
  float lr = 3e-4f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0.0f;   // decoupled (AdamW), applied as p -= lr * wd * p
  float max_grad_norm = 0.0f;  // clip by global L2 norm; 0 disables clipping
  bool average_grads = false;  // false: sum gradients over ranks; true: average
};

// The per-step scalars of one AdamW update (step counts from 1).
struct AdamWScalars {
  float lr;
  float beta1;
  float beta2;
  float eps;
  float weight_decay;
  float grad_scale;           // multiplies every gradient before use
  float step_size;            // lr / (1 - beta1^t)
  float inv_bias_corr2_sqrt;  // 1 / sqrt(1 - beta2^t)
};

AdamWScalars MakeAdamWScalars(const AdamWOptions& options, int64_t step, float grad_scale);

// Clip coefficient for a gradient whose global L2 norm is `norm`: 1 when
// clipping is off or not needed, else max_norm / (norm + 1e-6) (as torch's
// clip_grad_norm_).
float ClipScale(float max_grad_norm, float norm);

// One AdamW update of n elements on the host. No allocation.
void AdamWUpdate(float* params, const float* grads, float* m, float* v, size_t n,
                 const AdamWScalars& s);

// Sum of squares of n floats, accumulated in double.
double SquaredNorm(const float* x, size_t n);

// Unsharded AdamW over one flat buffer: the reference ShardedAdam is checked
// against, and what a single-process learner can use directly. Not thread-safe.
class AdamW {
 public:
  AdamW(size_t num_params, AdamWOptions options);

  // One step; returns the gradient norm before clipping. `grads` is not changed.
  float Step(float* params, const float* grads);

  int64_t step_count() const { return step_; }
  size_t state_bytes() const { return (m_.size() + v_.size()) * sizeof(float); }
  AdamWOptions& options() { return options_; }

 private:
  AdamWOptions options_;
  std::vector<float> m_;
  std::vector<float> v_;
  int64_t step_ = 0;
};

}  // namespace agentrt
