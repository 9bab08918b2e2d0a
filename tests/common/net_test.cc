#include "common/net.h"

#include <catch2/catch.hpp>

using agentrt::IsLoopbackHost;

TEST_CASE("loopback hosts: 127.0.0.0/8, ::1 and localhost; anything else is reachable") {
  CHECK(IsLoopbackHost("127.0.0.1"));
  CHECK(IsLoopbackHost("127.0.1.1"));
  CHECK(IsLoopbackHost("localhost"));
  CHECK(IsLoopbackHost("::1"));
  CHECK(IsLoopbackHost("[::1]"));
  CHECK_FALSE(IsLoopbackHost("0.0.0.0"));
  CHECK_FALSE(IsLoopbackHost("::"));
  CHECK_FALSE(IsLoopbackHost("10.0.0.3"));
  CHECK_FALSE(IsLoopbackHost("128.0.0.1"));
  CHECK_FALSE(IsLoopbackHost("node-1"));
  CHECK_FALSE(IsLoopbackHost(""));
}
