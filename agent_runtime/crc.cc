#include "agent_runtime/crc.h"

#include <array>
#include <cstring>

#if defined(__x86_64__)
#include <nmmintrin.h>
#endif

namespace agentrt {
namespace {

constexpr uint32_t kPoly = 0x82F63B78u;  // reflected Castagnoli polynomial

struct Tables {
  std::array<std::array<uint32_t, 256>, 8> t{};
  constexpr Tables() {
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ kPoly : c >> 1;
      t[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; ++i) {
      for (int s = 1; s < 8; ++s) t[s][i] = (t[s - 1][i] >> 8) ^ t[0][t[s - 1][i] & 0xFF];
    }
  }
};

constexpr Tables kTables;

uint32_t Gf2MatrixTimes(const uint32_t* mat, uint32_t vec) {
  uint32_t sum = 0;
  for (; vec != 0; vec >>= 1, ++mat) {
    if (vec & 1) sum ^= *mat;
  }
  return sum;
}

void Gf2MatrixSquare(uint32_t* square, const uint32_t* mat) {
  for (int n = 0; n < 32; ++n) square[n] = Gf2MatrixTimes(mat, mat[n]);
}

#if defined(__x86_64__)
__attribute__((target("sse4.2"))) uint32_t Crc32cSse42Stream(uint32_t crc, const unsigned char* p,
                                                             size_t size) {
  uint64_t c = ~crc;
  while (size >= 8) {
    uint64_t v;
    std::memcpy(&v, p, 8);
    c = _mm_crc32_u64(c, v);
    p += 8;
    size -= 8;
  }
  auto c32 = static_cast<uint32_t>(c);
  while (size-- > 0) c32 = _mm_crc32_u8(c32, *p++);
  return ~c32;
}

// crc32q has a latency of 3 cycles and a throughput of 1: three independent
// streams over thirds of the buffer keep the unit busy, and their checksums are
// joined with Crc32cCombine (a few microseconds, so only for large buffers).
__attribute__((target("sse4.2"))) uint32_t Crc32cSse42(uint32_t crc, const void* data,
                                                       size_t size) {
  const auto* p = static_cast<const unsigned char*>(data);
  constexpr size_t kMinThreeWay = size_t{256} * 1024;
  if (size < kMinThreeWay) return Crc32cSse42Stream(crc, p, size);
  const size_t third = (size / 3) & ~size_t{7};
  const unsigned char* a = p;
  const unsigned char* b = p + third;
  const unsigned char* c = p + 2 * third;
  uint64_t ca = ~crc;
  uint64_t cb = 0xFFFFFFFFu;
  uint64_t cc = 0xFFFFFFFFu;
  for (size_t i = 0; i < third; i += 8) {
    uint64_t va;
    uint64_t vb;
    uint64_t vc;
    std::memcpy(&va, a + i, 8);
    std::memcpy(&vb, b + i, 8);
    std::memcpy(&vc, c + i, 8);
    ca = _mm_crc32_u64(ca, va);
    cb = _mm_crc32_u64(cb, vb);
    cc = _mm_crc32_u64(cc, vc);
  }
  uint32_t joined = Crc32cCombine(~static_cast<uint32_t>(ca), ~static_cast<uint32_t>(cb), third);
  joined = Crc32cCombine(joined, ~static_cast<uint32_t>(cc), third);
  return Crc32cSse42Stream(joined, p + 3 * third, size - 3 * third);
}

bool HaveSse42() {
  static const bool have = __builtin_cpu_supports("sse4.2");
  return have;
}
#endif

}  // namespace

// GF(2) matrix method of zlib's crc32_combine: applies len2 zero bytes to crc1.
uint32_t Crc32cCombine(uint32_t crc1, uint32_t crc2, size_t len2) {
  if (len2 == 0) return crc1;
  uint32_t even[32];
  uint32_t odd[32];
  odd[0] = kPoly;  // the operator for one zero bit
  uint32_t row = 1;
  for (int n = 1; n < 32; ++n) {
    odd[n] = row;
    row <<= 1;
  }
  Gf2MatrixSquare(even, odd);  // two zero bits
  Gf2MatrixSquare(odd, even);  // four zero bits
  do {
    Gf2MatrixSquare(even, odd);
    if (len2 & 1) crc1 = Gf2MatrixTimes(even, crc1);
    len2 >>= 1;
    if (len2 == 0) break;
    Gf2MatrixSquare(odd, even);
    if (len2 & 1) crc1 = Gf2MatrixTimes(odd, crc1);
    len2 >>= 1;
  } while (len2 != 0);
  return crc1 ^ crc2;
}

uint32_t Crc32cPortable(uint32_t crc, const void* data, size_t size) {
  const auto* p = static_cast<const unsigned char*>(data);
  uint32_t c = ~crc;
  const auto& t = kTables.t;
  while (size >= 8) {
    uint32_t lo;
    uint32_t hi;
    std::memcpy(&lo, p, 4);
    std::memcpy(&hi, p + 4, 4);
    lo ^= c;
    c = t[7][lo & 0xFF] ^ t[6][(lo >> 8) & 0xFF] ^ t[5][(lo >> 16) & 0xFF] ^ t[4][lo >> 24] ^
        t[3][hi & 0xFF] ^ t[2][(hi >> 8) & 0xFF] ^ t[1][(hi >> 16) & 0xFF] ^ t[0][hi >> 24];
    p += 8;
    size -= 8;
  }
  while (size-- > 0) c = (c >> 8) ^ t[0][(c ^ *p++) & 0xFF];
  return ~c;
}

uint32_t Crc32c(uint32_t crc, const void* data, size_t size) {
#if defined(__x86_64__)
  if (HaveSse42()) return Crc32cSse42(crc, data, size);
#endif
  return Crc32cPortable(crc, data, size);
}

}  // namespace agentrt
