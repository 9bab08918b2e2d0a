// CRC32C (Castagnoli), the checksum of checkpoint shards. Uses the SSE4.2
// crc32 instruction when the CPU has it (several GB/s), else a slice-by-8 table.
#pragma once

#include <cstddef>
#include <cstdint>

namespace agentrt {

// Extends `crc` (0 for a fresh checksum) over data[0..size). Chaining calls over
// consecutive pieces gives the checksum of the whole. Thread-safe.
uint32_t Crc32c(uint32_t crc, const void* data, size_t size);

// The checksum of A||B from crc(A), crc(B) and B's length.
uint32_t Crc32cCombine(uint32_t crc_a, uint32_t crc_b, size_t size_b);

// The portable implementation (exposed so tests can compare both paths).
uint32_t Crc32cPortable(uint32_t crc, const void* data, size_t size);

}  // namespace agentrt
