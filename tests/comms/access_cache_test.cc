#include "comms/access_cache.h"

#include <catch2/catch.hpp>

namespace agentrt {
namespace {

constexpr char kSecret[] = "access-cache-test-secret-0123456";

BusAcl Acl() {
  BusAcl acl;
  acl.agents = {"pub", "sub"};
  acl.channels = {{"t*", {"pub"}, {"sub"}}};
  return acl;
}

TEST_CASE("the access cache accepts an agent's own token only", "[access_cache]") {
  AccessCache cache(Acl(), kSecret, 8);
  const std::string token = DeriveAgentToken(kSecret, "pub");
  CHECK(cache.TokenValid("pub", token));
  CHECK(cache.TokenValid("pub", token));  // from the cache
  CHECK_FALSE(cache.TokenValid("sub", token));
  CHECK_FALSE(cache.TokenValid("pub", DeriveAgentToken("another-run", "pub")));
  CHECK_FALSE(cache.TokenValid("pub", ""));
}

TEST_CASE("the access cache answers publish rights as the ACL does, cached or not",
          "[access_cache]") {
  AccessCache cache(Acl(), kSecret, 2);  // small: the cache starts over while answering
  for (int round = 0; round < 3; ++round) {
    CHECK(cache.MayPublish("pub", "t1"));
    CHECK(cache.MayPublish("pub", "t2"));
    CHECK_FALSE(cache.MayPublish("sub", "t1"));
    CHECK_FALSE(cache.MayPublish("pub", "other"));
  }
  // An agent name and topic that would run together without a separator.
  CHECK_FALSE(cache.MayPublish("pubt", "1"));
  CHECK(cache.acl().IsAgent("sub"));
}

}  // namespace
}  // namespace agentrt
