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

constexpr uint32_t kPoly = 0x82F63B78u;  // reflected Castagnoli polynomial

// a(x) * b(x) modulo the polynomial, both reflected (bit 31 is x^0).
uint32_t MultModP(uint32_t a, uint32_t b) {
  uint32_t product = 0;
  for (uint32_t m = uint32_t{1} << 31; m != 0; m >>= 1) {
    if (a & m) {
      product ^= b;
      if ((a & (m - 1)) == 0) break;
    }
    b = (b & 1) ? (b >> 1) ^ kPoly : b >> 1;
  }
  return product;
}

// x^(2^k) modulo the polynomial, for every k a 64-bit byte count needs
// (k = 3 .. 66: the count's bits, in bits).
struct PowerTable {
  uint32_t x2k[67];
  PowerTable() {
    uint32_t p = uint32_t{1} << 30;  // x^1
    for (uint32_t& t : x2k) {
      t = p;
      p = MultModP(p, p);
    }
  }
};

// x^(8 * bytes) modulo the polynomial: appending `bytes` zero bytes.
uint32_t ZeroBytesOperator(uint64_t bytes) {
  static const PowerTable table;
  uint32_t p = uint32_t{1} << 31;  // x^0
  for (int k = 3; bytes != 0; bytes >>= 1, ++k) {
    if (bytes & 1) p = MultModP(table.x2k[k], p);
  }
  return p;
}

}  // namespace

uint32_t Crc32cCombine(uint32_t crc_a, uint32_t crc_b, uint64_t len_b) {
  return MultModP(ZeroBytesOperator(len_b), crc_a) ^ crc_b;
}

Crc32cCombiner::Crc32cCombiner(uint64_t len_b) : op_(ZeroBytesOperator(len_b)) {}

uint32_t Crc32cCombiner::Combine(uint32_t crc_a, uint32_t crc_b) const {
  return MultModP(op_, crc_a) ^ crc_b;
}

}  // namespace agentrt
