// Where the tests find the project's programs: AGENTRT_BIN_DIR, which every
// CTest entry sets (agentrt_test_properties, cmake/agentrt.cmake).
#pragma once

#include <catch2/catch.hpp>
#include <cstdlib>
#include <string>

namespace agentrt::testing {

// The absolute path of program `name` (agentrt-bus, agentctl, ...) of this build.
inline std::string ProgramPath(const std::string& name) {
  const char* bin = std::getenv("AGENTRT_BIN_DIR");
  REQUIRE(bin != nullptr);
  return std::string(bin) + "/" + name;
}

}  // namespace agentrt::testing
