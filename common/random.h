// Random bytes from the kernel (getrandom(2)): the run secret, publisher ids.
// Thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "common/status.h"

namespace agentrt {

// `bytes` bytes of cryptographic quality, or Internal naming the failure.
Result<std::string> RandomBytes(size_t bytes);

// A random non-zero 64-bit number (falls back to the clock if the kernel refuses).
uint64_t RandomNonZeroU64();

// RandomNonZeroU64() as 16 lowercase hex digits: the one spelling of random
// file names and ids (payload files, spool files, the spool's id).
std::string RandomHex64();

// `v` as 16 lowercase hex digits (a bus incarnation, RandomHex64's spelling),
// and back: nullopt unless `text` is exactly 16 hex digits.
std::string Hex64(uint64_t v);
std::optional<uint64_t> ParseHex64(std::string_view text);

}  // namespace agentrt
