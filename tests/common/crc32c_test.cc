#include "common/crc32c.h"

#include <algorithm>
#include <catch2/catch.hpp>
#include <cstdint>
#include <random>
#include <vector>

namespace agentrt {
namespace {

// The definition, a bit at a time (reflected Castagnoli polynomial): what
// ISA-L's dispatched code must agree with.
uint32_t BitwiseCrc32c(const unsigned char* p, size_t size, uint32_t crc = 0) {
  uint32_t c = ~crc;
  for (size_t i = 0; i < size; ++i) {
    c ^= p[i];
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
  }
  return ~c;
}

TEST_CASE("two checksums combine into the checksum of both pieces, at any length") {
  std::vector<unsigned char> data(2 * 1024 * 1024 + 77);
  std::mt19937 rng(11);
  for (auto& b : data) b = static_cast<unsigned char>(rng());
  for (size_t cut : {size_t{0}, size_t{1}, size_t{5}, size_t{4096}, size_t{1} << 20,
                     data.size() - 3, data.size()}) {
    INFO("cut " << cut);
    const uint32_t a = Crc32c(data.data(), cut);
    const uint32_t b = Crc32c(data.data() + cut, data.size() - cut);
    CHECK(Crc32cCombine(a, b, data.size() - cut) == Crc32c(data.data(), data.size()));
    CHECK(Crc32cCombiner(data.size() - cut).Combine(a, b) == Crc32c(data.data(), data.size()));
  }
  // Folding 1 MiB chunk checksums one by one, the last chunk short.
  const size_t chunk = size_t{1} << 20;
  const Crc32cCombiner full(chunk);
  uint32_t whole = 0;
  for (size_t at = 0; at < data.size(); at += chunk) {
    const size_t n = std::min(chunk, data.size() - at);
    const uint32_t c = Crc32c(data.data() + at, n);
    whole = n == chunk ? full.Combine(whole, c) : Crc32cCombine(whole, c, n);
  }
  CHECK(whole == Crc32c(data.data(), data.size()));
}

TEST_CASE("combining is associative at lengths past 4 GiB (every power of x the table holds)") {
  // (A B) C == A (B C): what combining must satisfy at lengths no test can
  // checksum directly.
  std::mt19937 rng(5);
  for (uint64_t lb : {uint64_t{3} << 33, uint64_t{1} << 62, ~uint64_t{0} >> 1, uint64_t{12345}}) {
    for (uint64_t lc : {uint64_t{7} << 40, uint64_t{1}, (uint64_t{1} << 63) - lb / 2}) {
      INFO("lb " << lb << " lc " << lc);
      const uint32_t a = rng(), b = rng(), c = rng();
      CHECK(Crc32cCombine(Crc32cCombine(a, b, lb), c, lc) ==
            Crc32cCombine(a, Crc32cCombine(b, c, lc), lb + lc));
      CHECK(Crc32cCombiner(lc).Combine(Crc32cCombiner(lb).Combine(a, b), c) ==
            Crc32cCombine(a, Crc32cCombine(b, c, lc), lb + lc));
    }
  }
}

TEST_CASE("CRC32C is the Castagnoli CRC: its check value, and empty input") {
  CHECK(Crc32c("123456789", 9) == 0xE3069283u);
  CHECK(Crc32c("", 0) == 0u);
  CHECK(Crc32c("", 0, 0x1234u) == 0x1234u);
}

TEST_CASE("CRC32C agrees with the bitwise definition at any size and alignment, chained or whole") {
  std::vector<unsigned char> data(3 * 1024 * 1024 + 13);
  std::mt19937 rng(7);
  for (auto& b : data) b = static_cast<unsigned char>(rng());
  for (size_t offset : {size_t{0}, size_t{1}, size_t{3}, size_t{7}}) {
    for (size_t size : {size_t{1}, size_t{7}, size_t{8}, size_t{63}, size_t{4097}, size_t{300000},
                        data.size() - 8}) {
      INFO("offset " << offset << " size " << size);
      CHECK(Crc32c(data.data() + offset, size) == BitwiseCrc32c(data.data() + offset, size));
    }
  }
  const uint32_t whole = Crc32c(data.data(), data.size());
  uint32_t chained = Crc32c(data.data(), 4097);
  chained = Crc32c(data.data() + 4097, 1, chained);
  chained = Crc32c(data.data() + 4098, data.size() - 4098, chained);
  CHECK(chained == whole);
}

}  // namespace
}  // namespace agentrt
