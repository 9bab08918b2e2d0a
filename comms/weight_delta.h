// Delta versions of a weight stream (comms/weight_stream.h): a version sent
// as its difference to the version before, for readers that hold that one.
// Between two versions of a policy most bytes are equal, so the difference
// is mostly zeros and compresses to a small part of the version.
//
// The payload (content type kWeightsDeltaContentType), on the stream's delta
// topic "weights-delta/<name>" (comms/auth.h):
//   "AGRTWDL1" | u64 (little-endian) length of the header | the header, JSON:
//   {"version", "base", "size", "crc32c"} | one zstd frame of the version's
//   payload XOR the base version's (both `size` bytes).
// "crc32c" is the version's own payload's: a reader keeps what it rebuilds
// only when it matches, so a wrong or damaged base, or a damaged delta, is
// found, and the reader reads the version whole instead.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "common/status.h"

namespace agentrt {

inline constexpr const char* kWeightsDeltaContentType = "application/x-agentrt-weights-delta";

struct WeightDeltaHeader {
  int64_t version = 0;  // the version it rebuilds
  int64_t base = 0;     // from this one
  uint64_t size = 0;    // of both payloads
  uint32_t crc32c = 0;  // of the version's payload
};

// A version may have no delta (another size than the one before, the
// publisher's first, or a delta no smaller than half the version): then the
// record says so, with base 0, size 0 and no frame (EncodeNoWeightDelta), so
// that readers waiting for it read the version whole at once.

// The delta of `now` (the payload of version h.version, whose CRC32C h
// carries) to `base` (of version h.base, the same size).
Result<std::string> EncodeWeightDelta(const WeightDeltaHeader& h, std::string_view now,
                                      std::string_view base);
// The record that version `version` has no delta.
std::string EncodeNoWeightDelta(int64_t version);
// The header of a delta (DataLoss when it is not one).
Result<WeightDeltaHeader> ReadWeightDeltaHeader(std::string_view delta);
// The version's payload from `delta` and the base's payload. DataLoss when
// the base has another size, the frame is damaged, or the result's CRC32C is
// not the header's. The result is written into `buffer` (sized to the
// version's payload): one of that size already written to spares the page
// faults of fresh memory, which cost several times the rebuild itself.
Result<std::string> ApplyWeightDelta(std::string_view delta, std::string_view base,
                                     std::string buffer = {});

}  // namespace agentrt
