#include "comms/weight_delta.h"

#include <zstd.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <nlohmann/json.hpp>
#include <vector>

#include "common/crc32c.h"
#include "comms/weight_framing.h"

namespace agentrt {

namespace {

constexpr std::string_view kMagic = "AGRTWDL1";
constexpr std::string_view kWhat = "weights delta";
constexpr size_t kPiece = size_t{1} << 20;  // XOR-ed and compressed a piece at a time

// out[i] = a[i] ^ b[i] for n bytes, a word at a time.
void Xor(char* out, const char* a, const char* b, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t x = 0, y = 0;
    std::memcpy(&x, a + i, 8);
    std::memcpy(&y, b + i, 8);
    x ^= y;
    std::memcpy(out + i, &x, 8);
  }
  for (; i < n; ++i) out[i] = static_cast<char>(a[i] ^ b[i]);
}

struct CctxFree {
  void operator()(ZSTD_CCtx* c) const { ZSTD_freeCCtx(c); }
};
struct DctxFree {
  void operator()(ZSTD_DCtx* d) const { ZSTD_freeDCtx(d); }
};

// Magic, length and JSON of a header.
std::string Head(const WeightDeltaHeader& h) {
  const std::string json = nlohmann::json{
      {"version", h.version},
      {"base", h.base},
      {"size", h.size},
      {"crc32c", h.crc32c}}.dump();
  return FrameWeightHeader(kMagic, json);
}

Status ZstdError(size_t code, const char* what) {
  return DataLoss(std::string("weights delta: ") + what + ": " + ZSTD_getErrorName(code));
}

}  // namespace

Result<std::string> EncodeWeightDelta(const WeightDeltaHeader& h, std::string_view now,
                                      std::string_view base) {
  if (now.size() != base.size() || now.size() != h.size) {
    return InvalidArgument("weights delta of version " + std::to_string(h.version) + ": " +
                           std::to_string(now.size()) + " bytes against a base of " +
                           std::to_string(base.size()));
  }
  std::string out = Head(h);
  std::unique_ptr<ZSTD_CCtx, CctxFree> cctx(ZSTD_createCCtx());
  if (cctx == nullptr) return Internal("weights delta: cannot create a zstd context");
  ZSTD_CCtx_setParameter(cctx.get(), ZSTD_c_compressionLevel, 1);
  ZSTD_CCtx_setPledgedSrcSize(cctx.get(), now.size());
  std::vector<char> diff(std::min(kPiece, std::max<size_t>(now.size(), 1)));
  std::vector<char> buf(ZSTD_CStreamOutSize());
  for (size_t at = 0;;) {
    const size_t len = std::min(kPiece, now.size() - at);
    Xor(diff.data(), now.data() + at, base.data() + at, len);
    at += len;
    const bool last = at == now.size();
    ZSTD_inBuffer in{diff.data(), len, 0};
    for (;;) {
      ZSTD_outBuffer o{buf.data(), buf.size(), 0};
      const size_t left =
          ZSTD_compressStream2(cctx.get(), &o, &in, last ? ZSTD_e_end : ZSTD_e_continue);
      if (ZSTD_isError(left)) return ZstdError(left, "compressing");
      out.append(buf.data(), o.pos);
      if (last ? left == 0 : in.pos == in.size) break;
    }
    if (last) return out;
  }
}

std::string EncodeNoWeightDelta(int64_t version) { return Head({version, 0, 0, 0}); }

Result<WeightDeltaHeader> ReadWeightDeltaHeader(std::string_view delta) {
  AGENTRT_ASSIGN_OR_RETURN(const std::string_view header, FramedWeightHeader(delta, kMagic, kWhat));
  try {
    const nlohmann::json j = nlohmann::json::parse(header);
    WeightDeltaHeader h;
    h.version = j.at("version").get<int64_t>();
    h.base = j.at("base").get<int64_t>();
    h.size = j.at("size").get<uint64_t>();
    h.crc32c = j.at("crc32c").get<uint32_t>();
    return h;
  } catch (const nlohmann::json::exception& e) {
    return DataLoss(std::string("weights delta: its header: ") + e.what());
  }
}

Result<std::string> ApplyWeightDelta(std::string_view delta, std::string_view base,
                                     std::string buffer) {
  AGENTRT_ASSIGN_OR_RETURN(const WeightDeltaHeader h, ReadWeightDeltaHeader(delta));
  const std::string what = "weights delta of version " + std::to_string(h.version) +
                           " from version " + std::to_string(h.base);
  if (base.size() != h.size) {
    return DataLoss(what + ": the base held has " + std::to_string(base.size()) + " bytes, not " +
                    std::to_string(h.size));
  }
  AGENTRT_ASSIGN_OR_RETURN(const std::string_view header, FramedWeightHeader(delta, kMagic, kWhat));
  const std::string_view frame = delta.substr(kWeightFrameHead + header.size());
  // Each decompressed piece XOR-ed with the base into the buffer and
  // checksummed while it is in the cache.
  std::string out = std::move(buffer);
  out.resize(h.size);
  std::unique_ptr<ZSTD_DCtx, DctxFree> dctx(ZSTD_createDCtx());
  if (dctx == nullptr) return Internal("weights delta: cannot create a zstd context");
  std::vector<char> piece(ZSTD_DStreamOutSize());
  ZSTD_inBuffer in{frame.data(), frame.size(), 0};
  size_t at = 0;
  uint32_t crc = 0;
  size_t left = 1;
  while (left != 0 && (in.pos < in.size || at < out.size())) {
    ZSTD_outBuffer o{piece.data(), piece.size(), 0};
    left = ZSTD_decompressStream(dctx.get(), &o, &in);
    if (ZSTD_isError(left)) return ZstdError(left, "decompressing");
    if (o.pos > out.size() - at) return DataLoss(what + ": more bytes than its size");
    Xor(out.data() + at, base.data() + at, piece.data(), o.pos);
    crc = Crc32c(out.data() + at, o.pos, crc);
    at += o.pos;
    if (o.pos == 0 && in.pos == in.size) break;
  }
  if (at != out.size() || left != 0 || in.pos != in.size)
    return DataLoss(what + ": the frame does not hold " + std::to_string(h.size) + " bytes");
  if (crc != h.crc32c)
    return DataLoss(what + ": the result does not match the version's CRC32C (another base?)");
  return out;
}

}  // namespace agentrt
