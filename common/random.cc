#include "common/random.h"

#include <sys/random.h>

#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <cstring>

namespace agentrt {

Result<std::string> RandomBytes(size_t bytes) {
  std::string out(bytes, '\0');
  size_t done = 0;
  while (done < bytes) {
    const ssize_t n = ::getrandom(out.data() + done, bytes - done, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoStatus(errno, "getrandom(" + std::to_string(bytes) + " bytes)");
    }
    done += static_cast<size_t>(n);
  }
  return out;
}

uint64_t RandomNonZeroU64() {
  uint64_t v = 0;
  while (v == 0) {
    auto bytes = RandomBytes(sizeof v);
    if (bytes.ok()) {
      std::memcpy(&v, bytes->data(), sizeof v);
    } else {
      v = static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count()) | 1u;
    }
  }
  return v;
}

std::string RandomHex64() { return Hex64(RandomNonZeroU64()); }

std::string Hex64(uint64_t v) {
  char hex[17];
  std::snprintf(hex, sizeof(hex), "%016llx", static_cast<unsigned long long>(v));
  return hex;
}

std::optional<uint64_t> ParseHex64(std::string_view text) {
  uint64_t v = 0;
  if (text.size() != 16) return std::nullopt;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v, 16);
  if (ec != std::errc() || end != text.data() + text.size()) return std::nullopt;
  return v;
}

}  // namespace agentrt
