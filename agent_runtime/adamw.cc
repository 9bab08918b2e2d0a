#include "agent_runtime/adamw.h"

#include <cmath>

namespace agentrt {

AdamWScalars MakeAdamWScalars(const AdamWOptions& o, int64_t step, float grad_scale) {
  // Bias corrections in double: beta2^t for t in the millions underflows float's precision.
  const double bc1 = 1.0 - std::pow(static_cast<double>(o.beta1), static_cast<double>(step));
  const double bc2 = 1.0 - std::pow(static_cast<double>(o.beta2), static_cast<double>(step));
  AdamWScalars s{};
  s.lr = o.lr;
  s.beta1 = o.beta1;
  s.beta2 = o.beta2;
  s.eps = o.eps;
  s.weight_decay = o.weight_decay;
  s.grad_scale = grad_scale;
  s.step_size = static_cast<float>(static_cast<double>(o.lr) / bc1);
  s.inv_bias_corr2_sqrt = static_cast<float>(1.0 / std::sqrt(bc2));
  return s;
}

float ClipScale(float max_grad_norm, float norm) {
  if (max_grad_norm <= 0.0f) return 1.0f;
  const float coef = max_grad_norm / (norm + 1e-6f);
  return coef < 1.0f ? coef : 1.0f;
}

void AdamWUpdate(float* __restrict params, const float* __restrict grads, float* __restrict m,
                 float* __restrict v, size_t n, const AdamWScalars& s) {
  const float decay = 1.0f - s.lr * s.weight_decay;
  const float one_minus_b1 = 1.0f - s.beta1;
  const float one_minus_b2 = 1.0f - s.beta2;
  for (size_t i = 0; i < n; ++i) {
    const float g = grads[i] * s.grad_scale;
    const float mi = s.beta1 * m[i] + one_minus_b1 * g;
    const float vi = s.beta2 * v[i] + one_minus_b2 * g * g;
    m[i] = mi;
    v[i] = vi;
    const float denom = std::sqrt(vi) * s.inv_bias_corr2_sqrt + s.eps;
    params[i] = params[i] * decay - s.step_size * mi / denom;
  }
}

double SquaredNorm(const float* x, size_t n) {
  // Four partial sums let the compiler vectorise without -ffast-math.
  double acc[4] = {0, 0, 0, 0};
  size_t i = 0;
  for (; i + 4 <= n; i += 4) {
    for (size_t k = 0; k < 4; ++k) acc[k] += static_cast<double>(x[i + k]) * x[i + k];
  }
  for (; i < n; ++i) acc[0] += static_cast<double>(x[i]) * x[i];
  return (acc[0] + acc[1]) + (acc[2] + acc[3]);
}

AdamW::AdamW(size_t num_params, AdamWOptions options)
    : options_(options), m_(num_params, 0.0f), v_(num_params, 0.0f) {}

float AdamW::Step(float* params, const float* grads) {
  ++step_;
  const float norm = static_cast<float>(std::sqrt(SquaredNorm(grads, m_.size())));
  const AdamWScalars s = MakeAdamWScalars(options_, step_, ClipScale(options_.max_grad_norm, norm));
  AdamWUpdate(params, grads, m_.data(), v_.data(), m_.size(), s);
  return norm;
}

}  // namespace agentrt
