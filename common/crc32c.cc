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

}  // namespace agentrt
