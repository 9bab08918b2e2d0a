#include "comms/weight_framing.h"

#include <cstdint>

namespace agentrt {

std::string FrameWeightHeader(std::string_view magic, std::string_view json) {
  std::string out(magic.substr(0, kWeightMagicSize));
  const uint64_t n = json.size();
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((n >> (8 * i)) & 0xffu));
  out += json;
  return out;
}

Result<std::string_view> FramedWeightHeader(std::string_view record, std::string_view magic,
                                            std::string_view what) {
  if (record.size() < kWeightFrameHead || record.substr(0, kWeightMagicSize) != magic)
    return DataLoss(std::string(what) + ": it does not start with " + std::string(magic));
  uint64_t n = 0;
  for (size_t i = 0; i < 8; ++i)
    n |= uint64_t{static_cast<unsigned char>(record[kWeightMagicSize + i])} << (8 * i);
  if (n > record.size() - kWeightFrameHead) {
    return DataLoss(std::string(what) + ": its header runs past its " +
                    std::to_string(record.size()) + " bytes");
  }
  return record.substr(kWeightFrameHead, n);
}

}  // namespace agentrt
