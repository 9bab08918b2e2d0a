// agentrt::Space — what an environment's observations and actions look like.
//
// Two kinds, as in Gymnasium:
//   Discrete(n)          one integer in [0, n); carried as ONE float holding the index
//   Box(shape, low, high) a dense float tensor, row-major, elementwise bounds
//
// Every buffer that carries observations or actions is a flat float array;
// `size()` is the number of floats one observation/action occupies in it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace agentrt {

class Space {
 public:
  enum class Kind { kDiscrete, kBox };

  static Space Discrete(int64_t n);
  // Same bound for every element.
  static Space Box(std::vector<int64_t> shape, float low, float high);
  // Per-element bounds; `low` and `high` hold one value per element.
  static Space Box(std::vector<int64_t> shape, std::vector<float> low, std::vector<float> high);

  Kind kind() const { return kind_; }
  bool is_discrete() const { return kind_ == Kind::kDiscrete; }
  // Discrete: the number of choices. Box: 0.
  int64_t n() const { return n_; }
  // Box: the tensor shape. Discrete: {} (a scalar).
  const std::vector<int64_t>& shape() const { return shape_; }
  const std::vector<float>& low() const { return low_; }
  const std::vector<float>& high() const { return high_; }
  // Floats one element of this space occupies in a flat buffer (Discrete: 1).
  size_t size() const { return size_; }

  // "Discrete(2)" or "Box(4, low=-inf, high=inf)" (bounds shown when uniform).
  std::string ToString() const;
  bool operator==(const Space& other) const = default;

 private:
  Kind kind_ = Kind::kDiscrete;
  int64_t n_ = 0;
  std::vector<int64_t> shape_;
  std::vector<float> low_;
  std::vector<float> high_;
  size_t size_ = 1;
};

}  // namespace agentrt
