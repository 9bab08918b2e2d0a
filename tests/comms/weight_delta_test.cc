// The weights delta record (comms/weight_delta.h): encoded and applied back,
// and what a wrong base, a damaged frame or a foreign payload get.
#include "comms/weight_delta.h"

#include <catch2/catch.hpp>
#include <string>

#include "common/crc32c.h"
#include "comms/weight_framing.h"

using namespace agentrt;

TEST_CASE("a weights delta round-trips, and a wrong base or a damaged frame is refused") {
  std::string base(100000, '\0'), now;
  for (size_t i = 0; i < base.size(); ++i) base[i] = static_cast<char>(i * 7);
  now = base;
  for (size_t i = 0; i < now.size(); i += 97) now[i] = static_cast<char>(now[i] + 1);
  const WeightDeltaHeader h{9, 8, now.size(), Crc32c(now.data(), now.size())};
  auto delta = EncodeWeightDelta(h, now, base);
  REQUIRE(delta.ok());
  CHECK(delta->size() * 10 < now.size());
  auto header = ReadWeightDeltaHeader(*delta);
  REQUIRE(header.ok());
  CHECK(header->version == 9);
  CHECK(header->base == 8);
  CHECK(header->size == now.size());
  CHECK(header->crc32c == h.crc32c);
  auto rebuilt = ApplyWeightDelta(*delta, base);
  REQUIRE(rebuilt.ok());
  CHECK(*rebuilt == now);

  std::string other = base;
  other[5] = 'x';
  CHECK_THAT(ApplyWeightDelta(*delta, other).status().message(),
             Catch::Contains("does not match the version's CRC32C"));
  CHECK(ApplyWeightDelta(*delta, base.substr(1)).status().code() == StatusCode::kDataLoss);
  std::string damaged = *delta;
  damaged.back() = static_cast<char>(damaged.back() ^ 0x55);
  CHECK(ApplyWeightDelta(damaged, base).status().code() == StatusCode::kDataLoss);
  CHECK(ReadWeightDeltaHeader("AGRTWTS1").status().code() == StatusCode::kDataLoss);
  CHECK(EncodeWeightDelta(h, now, base.substr(1)).status().code() == StatusCode::kInvalidArgument);
}

TEST_CASE("the weight records' framing round-trips and refuses another magic or a short record") {
  const std::string record = FrameWeightHeader("AGRTTEST", R"({"a": 1})") + "body";
  CHECK(record.size() == kWeightFrameHead + 8 + 4);
  auto header = FramedWeightHeader(record, "AGRTTEST", "a test record");
  REQUIRE(header.ok());
  CHECK(*header == R"({"a": 1})");
  CHECK(record.substr(kWeightFrameHead + header->size()) == "body");
  CHECK(FramedWeightHeader(record, "AGRTWTS1", "a test record").status().message() ==
        "a test record: it does not start with AGRTWTS1");
  CHECK(FramedWeightHeader(record.substr(0, 20), "AGRTTEST", "a test record").status().message() ==
        "a test record: its header runs past its 20 bytes");
  CHECK(FramedWeightHeader("AGRT", "AGRTTEST", "x").status().code() == StatusCode::kDataLoss);
}
