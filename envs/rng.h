// agentrt::Rng — a small, fast, portable random generator (xoshiro256**,
// seeded by splitmix64) whose state is four words, so checkpoints can store
// it and every platform draws the same numbers for the same seed (unlike the
// std:: distributions, whose algorithms are implementation-defined).
// Not thread-safe; one per env / learner.
#pragma once

#include <array>
#include <cmath>
#include <cstdint>
#include <initializer_list>

namespace agentrt {

class Rng {
 public:
  explicit Rng(uint64_t seed = 0) { Seed(seed); }
  // Seeded by several numbers at once (e.g. a seed, an agent's hash and a
  // request number): each is mixed in in turn, so any change gives another stream.
  static Rng FromParts(std::initializer_list<uint64_t> parts) {
    uint64_t seed = 0;
    for (uint64_t p : parts) seed = Rng(seed ^ p).Next();
    return Rng(seed);
  }

  void Seed(uint64_t seed) {
    for (auto& word : s_) {
      seed += 0x9e3779b97f4a7c15ULL;
      uint64_t z = seed;
      z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
      z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
      word = z ^ (z >> 31);
    }
  }

  uint64_t Next() {
    const uint64_t result = Rotl(s_[1] * 5, 7) * 9;
    const uint64_t t = s_[1] << 17;
    s_[2] ^= s_[0];
    s_[3] ^= s_[1];
    s_[1] ^= s_[2];
    s_[0] ^= s_[3];
    s_[2] ^= t;
    s_[3] = Rotl(s_[3], 45);
    return result;
  }

  // Uniform in [0, 1) with 53 random bits.
  double Uniform() { return static_cast<double>(Next() >> 11) * 0x1.0p-53; }
  double Uniform(double low, double high) { return low + (high - low) * Uniform(); }
  // Uniform integer in [0, n), n > 0 (Lemire's multiply-shift; bias < 2^-64 * n).
  uint64_t Below(uint64_t n) {
    __extension__ typedef unsigned __int128 Wide;
    return static_cast<uint64_t>((static_cast<Wide>(Next()) * n) >> 64);
  }
  // Standard normal (Box-Muller, one of the pair).
  double Normal() {
    double u1 = Uniform();
    while (u1 <= 0.0) u1 = Uniform();
    const double u2 = Uniform();
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
  }

  using State = std::array<uint64_t, 4>;
  const State& state() const { return s_; }
  void set_state(const State& state) { s_ = state; }

 private:
  static uint64_t Rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
  State s_{};
};

}  // namespace agentrt
