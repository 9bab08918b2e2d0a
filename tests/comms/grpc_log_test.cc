// comms/grpc_log.h: a burst of gRPC log lines from one place prints its first
// line and a count of the rest, per call site, on the caller's clock.
#include "comms/grpc_log.h"

#include <catch2/catch.hpp>
#include <string>
#include <utility>
#include <vector>

namespace agentrt {

TEST_CASE("a burst from one site prints its first line, then says how many were held back") {
  LogBurstLimiter limiter(10.0);
  int held = -1;
  CHECK(limiter.Admit("ssl_transport_security.cc:1234", 100.0, &held));
  CHECK(held == 0);
  for (int i = 1; i <= 45; ++i) {
    CHECK_FALSE(limiter.Admit("ssl_transport_security.cc:1234", 100.0 + i * 0.2, &held));
    CHECK(held == 0);
  }
  // Another site is a burst of its own.
  CHECK(limiter.Admit("chttp2_server.cc:99", 105.0, &held));
  CHECK(held == 0);
  // The window after the first printed line has passed: the next line prints,
  // after the count of the 45 held back.
  CHECK(limiter.Admit("ssl_transport_security.cc:1234", 110.5, &held));
  CHECK(held == 45);
  CHECK_FALSE(limiter.Admit("ssl_transport_security.cc:1234", 111.0, &held));
  CHECK_FALSE(limiter.Admit("ssl_transport_security.cc:1234", 112.0, &held));
  CHECK_FALSE(limiter.Admit("chttp2_server.cc:99", 106.0, &held));
  // At exit every burst still held back is said, once.
  using Held = std::vector<std::pair<std::string, int>>;
  CHECK(limiter.TakeHeldBack() ==
        Held{{"chttp2_server.cc:99", 1}, {"ssl_transport_security.cc:1234", 2}});
  CHECK(limiter.TakeHeldBack().empty());
}

}  // namespace agentrt
