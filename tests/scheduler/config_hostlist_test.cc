#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "scheduler/hostlist.h"

namespace agentrt {
namespace {

using Catch::Matchers::Contains;
using Names = std::vector<std::string>;

TEST_CASE("hostlist expands ranges, lists and plain names in order") {
  Result<Names> n = ExpandHostlist("gpu[01-04,07],cpu1");
  REQUIRE(n.ok());
  CHECK(*n == Names{"gpu01", "gpu02", "gpu03", "gpu04", "gpu07", "cpu1"});
  CHECK(*ExpandHostlist("node1") == Names{"node1"});
  CHECK(*ExpandHostlist("n[8-11]") == Names{"n8", "n9", "n10", "n11"});
  CHECK(*ExpandHostlist("n[098-101]") == Names{"n098", "n099", "n100", "n101"});
  CHECK(*ExpandHostlist("rack[1-2]-n[1-2]") ==
        Names{"rack1-n1", "rack1-n2", "rack2-n1", "rack2-n2"});
  CHECK(*ExpandHostlist("a.b-c_d[3]") == Names{"a.b-c_d3"});
}

TEST_CASE("hostlist rejects malformed expressions with the position") {
  CHECK_THAT(ExpandHostlist("gpu[01-").status().message(),
             Contains("at character 4: '[' without ']'"));
  CHECK_THAT(ExpandHostlist("gpu01]").status().message(), Contains("']' without '['"));
  CHECK_THAT(ExpandHostlist("n[1-x]").status().message(), Contains("expected a number or range"));
  CHECK_THAT(ExpandHostlist("n[]").status().message(), Contains("empty []"));
  CHECK_THAT(ExpandHostlist("n[5-1]").status().message(), Contains("runs backwards"));
  CHECK_THAT(ExpandHostlist("a,,b").status().message(), Contains("empty host name"));
  CHECK_THAT(ExpandHostlist("a,").status().message(), Contains("trailing ','"));
  CHECK_THAT(ExpandHostlist("a b").status().message(), Contains("unexpected character ' '"));
  CHECK_THAT(ExpandHostlist("").status().message(), Contains("empty"));
  CHECK_THAT(ExpandHostlist("n[[1]]").status().message(), Contains("nested"));
  CHECK_THAT(ExpandHostlist("n[1-99999999]").status().message(), Contains("expands to more than"));
}

TEST_CASE("hostlist compression folds numeric runs and round-trips") {
  Names names = {"gpu01", "gpu02", "gpu03", "gpu04", "gpu07", "cpu1"};
  CHECK(CompressHostlist(names) == "gpu[01-04,07],cpu1");
  CHECK(*ExpandHostlist(CompressHostlist(names)) == names);
  CHECK(CompressHostlist({"login"}) == "login");
  CHECK(CompressHostlist({"n1", "n2", "n3"}) == "n[1-3]");
  CHECK(CompressHostlist({}).empty());
}

}  // namespace
}  // namespace agentrt
