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

}  // namespace agentrt
