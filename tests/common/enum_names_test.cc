#include "common/enum_names.h"

#include <catch2/catch.hpp>

#include "common/group_backend.h"

namespace agentrt {
namespace {

enum class Color { kRed, kGreen, kBlue };
constexpr EnumName<Color> kColorNames[] = {{Color::kRed, "red"}, {Color::kGreen, "green"}};

TEST_CASE("an enum table names values and reads names back", "[enum_names]") {
  CHECK(NameIn(kColorNames, Color::kGreen) == "green");
  CHECK(ValueIn(kColorNames, "red") == Color::kRed);
  static_assert(NameIn(kColorNames, Color::kRed) == "red", "usable at compile time");
}

TEST_CASE("what an enum table lacks is unknown, or no value", "[enum_names]") {
  CHECK(NameIn(kColorNames, Color::kBlue) == "unknown");
  CHECK(ValueIn(kColorNames, "blue") == std::nullopt);
  CHECK(ValueIn(kColorNames, "") == std::nullopt);
}

TEST_CASE("every group backend's name parses back to it", "[enum_names]") {
  for (GroupBackend b :
       {GroupBackend::kAuto, GroupBackend::kSingle, GroupBackend::kMpi, GroupBackend::kNccl}) {
    auto parsed = ParseGroupBackend(GroupBackendName(b));
    INFO(GroupBackendName(b));
    REQUIRE(parsed.ok());
    CHECK(*parsed == b);
  }
  CHECK_FALSE(ParseGroupBackend("gloo").ok());
}

}  // namespace
}  // namespace agentrt
