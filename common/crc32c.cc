#include "common/crc32c.h"

#include <isa-l/crc.h>

#include <algorithm>

namespace agentrt {

uint32_t Crc32c(const void* data, size_t size, uint32_t crc) {
  // ISA-L's iSCSI CRC takes and returns the register uninverted, and an int length.
  uint32_t reg = crc ^ 0xffffffffu;
  auto* p = static_cast<unsigned char*>(const_cast<void*>(data));  // ISA-L only reads it
  while (size > 0) {
    const int n = static_cast<int>(std::min<size_t>(size, size_t{1} << 30));
    reg = crc32_iscsi(p, n, reg);
    p += n;
    size -= static_cast<size_t>(n);
  }
  return reg ^ 0xffffffffu;
}

namespace {

// A 32x32 matrix over GF(2), one uint32_t per column: mat * vec.
uint32_t Times(const uint32_t* mat, uint32_t vec) {
  uint32_t sum = 0;
  for (int i = 0; vec != 0; ++i, vec >>= 1) {
    if (vec & 1) sum ^= mat[i];
  }
  return sum;
}

void Square(uint32_t* out, const uint32_t* mat) {
  for (int n = 0; n < 32; ++n) out[n] = Times(mat, mat[n]);
}

// crc_a advanced over len_b zero bytes (the linear part of appending B).
uint32_t Shift(uint32_t crc_a, uint64_t len_b) {
  uint32_t odd[32];  // the operator for one zero bit, then 4, 16, ... bits
  uint32_t even[32];
  odd[0] = 0x82F63B78u;  // reflected Castagnoli polynomial
  for (int n = 1; n < 32; ++n) odd[n] = uint32_t{1} << (n - 1);
  Square(even, odd);  // two zero bits
  Square(odd, even);  // four
  while (len_b != 0) {
    Square(even, odd);  // one zero byte, then 4, 16, ... bytes
    if (len_b & 1) crc_a = Times(even, crc_a);
    len_b >>= 1;
    if (len_b == 0) break;
    Square(odd, even);
    if (len_b & 1) crc_a = Times(odd, crc_a);
    len_b >>= 1;
  }
  return crc_a;
}

}  // namespace

uint32_t Crc32cCombine(uint32_t crc_a, uint32_t crc_b, uint64_t len_b) {
  return Shift(crc_a, len_b) ^ crc_b;
}

Crc32cCombiner::Crc32cCombiner(uint64_t len_b) {
  for (int i = 0; i < 32; ++i) shift_[i] = Shift(uint32_t{1} << i, len_b);
}

uint32_t Crc32cCombiner::Combine(uint32_t crc_a, uint32_t crc_b) const {
  return Times(shift_, crc_a) ^ crc_b;
}

}  // namespace agentrt
