// agentrt::ObsNormalizer — running mean / variance of observations (Chan et
// al.'s parallel merge), used to feed the networks (x - mean) / sqrt(var + eps)
// clipped to [-clip, clip]. Merges whole batches, so every rank of a group
// can merge the same all-reduced batch moments and stay identical.
// Not thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace agentrt {

class ObsNormalizer {
 public:
  ObsNormalizer(size_t size, float clip = 10.0f, float eps = 1e-8f);

  size_t size() const { return mean_.size(); }
  double count() const { return count_; }
  const std::vector<double>& mean() const { return mean_; }
  const std::vector<double>& var() const { return var_; }

  // Merges a batch given by its count, per-element mean and per-element
  // (population) variance.
  void Merge(double count, std::span<const double> mean, std::span<const double> var);

  // out = clip((x - mean) / sqrt(var + eps)) for `rows` observations. No allocation.
  void Normalize(const float* x, size_t rows, float* out) const;

  // Raw state (count, mean, var) for checkpoints.
  void SetState(double count, std::vector<double> mean, std::vector<double> var);

 private:
  void Refresh();  // recompute the float scale/shift used by Normalize

  float clip_;
  float eps_;
  double count_ = 0.0;
  std::vector<double> mean_;
  std::vector<double> var_;
  std::vector<float> shift_;  // mean as float
  std::vector<float> scale_;  // 1 / sqrt(var + eps)
};

}  // namespace agentrt
