// CRC32C (Castagnoli, as iSCSI and ext4 use it): the checksum of checkpoint
// shards, bus log records and large bus payloads, and TensorBoard's record
// framing. One implementation for all of them: ISA-L's, which picks the
// fastest code the CPU has (SSE4.2 crc32 streams, PCLMUL or AVX-512 folding).
#pragma once

#include <cstddef>
#include <cstdint>

namespace agentrt {

// The CRC32C of data[0..size) continuing `crc`, the CRC32C of the bytes before
// `data` (0 for none): chained calls over consecutive pieces give the checksum
// of the whole. Thread-safe; any size.
uint32_t Crc32c(const void* data, size_t size, uint32_t crc = 0);

// The CRC32C of A then B from crc_a = Crc32c(A), crc_b = Crc32c(B) and B's
// length, without the bytes: crc_a times x^(8 len_b) modulo the Castagnoli
// polynomial (zlib's method since 1.2.12): O(log len_b) products of two
// 32-bit polynomials, a microsecond or two.
uint32_t Crc32cCombine(uint32_t crc_a, uint32_t crc_b, uint64_t len_b);

// Crc32cCombine for one fixed len_b, its power of x computed once: one
// product a call (one checksum per chunk folded into the whole file's, say).
class Crc32cCombiner {
 public:
  explicit Crc32cCombiner(uint64_t len_b);
  uint32_t Combine(uint32_t crc_a, uint32_t crc_b) const;

 private:
  uint32_t op_;  // x^(8 len_b) modulo the polynomial
};

}  // namespace agentrt
