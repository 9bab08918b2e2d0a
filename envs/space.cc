#include "envs/space.h"

#include <cassert>
#include <cstdio>
#include <limits>

namespace agentrt {
namespace {

std::string Bound(float v) {
  if (v == std::numeric_limits<float>::infinity()) return "inf";
  if (v == -std::numeric_limits<float>::infinity()) return "-inf";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", static_cast<double>(v));
  return buf;
}

bool Uniform(const std::vector<float>& v) {
  for (float x : v) {
    if (x != v.front()) return false;
  }
  return true;
}

}  // namespace

Space Space::Discrete(int64_t n) {
  assert(n > 0);
  Space s;
  s.kind_ = Kind::kDiscrete;
  s.n_ = n;
  s.size_ = 1;
  return s;
}

Space Space::Box(std::vector<int64_t> shape, float low, float high) {
  size_t size = 1;
  for (int64_t d : shape) size *= static_cast<size_t>(d);
  return Box(std::move(shape), std::vector<float>(size, low), std::vector<float>(size, high));
}

Space Space::Box(std::vector<int64_t> shape, std::vector<float> low, std::vector<float> high) {
  Space s;
  s.kind_ = Kind::kBox;
  s.size_ = 1;
  for (int64_t d : shape) s.size_ *= static_cast<size_t>(d);
  assert(low.size() == s.size_ && high.size() == s.size_);
  s.shape_ = std::move(shape);
  s.low_ = std::move(low);
  s.high_ = std::move(high);
  return s;
}

std::string Space::ToString() const {
  if (is_discrete()) return "Discrete(" + std::to_string(n_) + ")";
  std::string out = "Box(";
  for (size_t i = 0; i < shape_.size(); ++i) out += (i ? "x" : "") + std::to_string(shape_[i]);
  if (!low_.empty() && Uniform(low_) && Uniform(high_)) {
    out += ", low=" + Bound(low_.front()) + ", high=" + Bound(high_.front());
  }
  return out + ")";
}

}  // namespace agentrt
