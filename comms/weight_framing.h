// The framing shared by weight streams' records (comms/weight_stream.h's
// versions, "AGRTWTS1"; comms/weight_delta.h's deltas, "AGRTWDL1"):
//
//   8-byte magic | u64 (little-endian) length of the header | the header,
//   JSON | the record's body
//
// One writer and one reader of it.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include "common/status.h"

namespace agentrt {

inline constexpr size_t kWeightMagicSize = 8;
// The magic and the length: where the JSON header starts.
inline constexpr size_t kWeightFrameHead = kWeightMagicSize + 8;

// `magic` (kWeightMagicSize bytes), the length of `json`, then `json`.
std::string FrameWeightHeader(std::string_view magic, std::string_view json);

// The JSON header of `record`, a view into it (it ends where the body
// starts). DataLoss "<what>: it does not start with <magic>" or "<what>:
// its header runs past its <n> bytes".
Result<std::string_view> FramedWeightHeader(std::string_view record, std::string_view magic,
                                            std::string_view what);

}  // namespace agentrt
