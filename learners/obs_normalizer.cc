#include "learners/obs_normalizer.h"

#include <algorithm>
#include <cassert>
#include <cmath>

namespace agentrt {

ObsNormalizer::ObsNormalizer(size_t size, float clip, float eps)
    : clip_(clip), eps_(eps), mean_(size, 0.0), var_(size, 1.0) {
  Refresh();
}

void ObsNormalizer::Merge(double count, std::span<const double> mean, std::span<const double> var) {
  if (count <= 0.0) return;
  assert(mean.size() == size() && var.size() == size());
  const double total = count_ + count;
  for (size_t k = 0; k < size(); ++k) {
    const double delta = mean[k] - mean_[k];
    const double m2 = var_[k] * count_ + var[k] * count + delta * delta * count_ * count / total;
    mean_[k] += delta * count / total;
    var_[k] = m2 / total;
  }
  count_ = total;
  Refresh();
}

void ObsNormalizer::Normalize(const float* x, size_t rows, float* out) const {
  const size_t n = size();
  for (size_t r = 0; r < rows; ++r) {
    for (size_t k = 0; k < n; ++k) {
      const float z = (x[r * n + k] - shift_[k]) * scale_[k];
      out[r * n + k] = std::clamp(z, -clip_, clip_);
    }
  }
}

void ObsNormalizer::SetState(double count, std::vector<double> mean, std::vector<double> var) {
  count_ = count;
  mean_ = std::move(mean);
  var_ = std::move(var);
  Refresh();
}

void ObsNormalizer::Refresh() {
  shift_.resize(size());
  scale_.resize(size());
  for (size_t k = 0; k < size(); ++k) {
    shift_[k] = static_cast<float>(mean_[k]);
    scale_[k] = static_cast<float>(1.0 / std::sqrt(var_[k] + eps_));
  }
}

}  // namespace agentrt
