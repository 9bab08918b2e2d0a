#include "common/random.h"

#include <catch2/catch.hpp>

namespace agentrt {
namespace {

TEST_CASE("a 64-bit number is spelled in 16 hex digits and read back", "[random]") {
  for (uint64_t v : {uint64_t{0}, uint64_t{1}, uint64_t{0xdeadbeef}, ~uint64_t{0}}) {
    CHECK(Hex64(v).size() == 16);
    CHECK(ParseHex64(Hex64(v)) == v);
  }
  CHECK(Hex64(0xab) == "00000000000000ab");
  const std::string random = RandomHex64();
  REQUIRE(ParseHex64(random).has_value());
  CHECK(*ParseHex64(random) != 0);
}

TEST_CASE("anything but exactly 16 hex digits is not a 64-bit number", "[random]") {
  for (const char* bad : {"", "ab", "00000000000000ab\n", "0x000000000000ab", "000000000000000g",
                          "-0000000000000ab", "00000000000000abc", " 00000000000000a"})
    CHECK_FALSE(ParseHex64(bad).has_value());
}

}  // namespace
}  // namespace agentrt
