#include "common/status.h"

#include <catch2/catch.hpp>
#include <cerrno>

namespace agentrt {
namespace {

Result<int> Half(int x) {
  if (x % 2 != 0) return InvalidArgument("odd: " + std::to_string(x));
  return x / 2;
}

Result<int> Quarter(int x) {
  AGENTRT_ASSIGN_OR_RETURN(int h, Half(x));
  return Half(h);
}

TEST_CASE("a Result carries either a value or the reason there is none") {
  REQUIRE(Quarter(8).ok());
  CHECK(*Quarter(8) == 2);
  auto r = Quarter(6);
  REQUIRE_FALSE(r.ok());
  CHECK(r.status().code() == StatusCode::kInvalidArgument);
  CHECK(r.status().ToString() == "INVALID_ARGUMENT: odd: 3");
}

TEST_CASE("errno is translated with the call site's words") {
  Status s = ErrnoStatus(ENOENT, "open /nope");
  CHECK(s.code() == StatusCode::kNotFound);
  CHECK(s.message().find("open /nope: ") == 0);
  CHECK(s.WithContext("agent a").message().find("agent a: open /nope") == 0);
}

TEST_CASE("status codes carry gRPC's numbers and names") {
  // gRPC's numbering (grpc/status.h); the bus and the C API convert by cast.
  CHECK(static_cast<int>(StatusCode::kCancelled) == 1);
  CHECK(static_cast<int>(StatusCode::kUnknown) == 2);
  CHECK(static_cast<int>(StatusCode::kInvalidArgument) == 3);
  CHECK(static_cast<int>(StatusCode::kNotFound) == 5);
  CHECK(static_cast<int>(StatusCode::kFailedPrecondition) == 9);
  CHECK(static_cast<int>(StatusCode::kInternal) == 13);
  CHECK(static_cast<int>(StatusCode::kUnauthenticated) == kLastStatusCode);
  CHECK(StatusCodeName(StatusCode::kOk) == "OK");
  CHECK(StatusCodeName(StatusCode::kUnknown) == "UNKNOWN");
  CHECK(StatusCodeName(StatusCode::kDataLoss) == "DATA_LOSS");
  CHECK(StatusCodeName(StatusCode::kUnauthenticated) == "UNAUTHENTICATED");
  CHECK(StatusCodeName(static_cast<StatusCode>(99)) == "UNKNOWN");
  CHECK(Status(StatusCode::kAborted, "x").ToString() == "ABORTED: x");
}

}  // namespace
}  // namespace agentrt
