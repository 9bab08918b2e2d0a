#include "comms/publisher_window.h"

#include <catch2/catch.hpp>

namespace agentrt {
namespace {

TEST_CASE("a publisher window answers a stored sequence with its offset", "[publisher_window]") {
  PublisherWindow w;
  int64_t offset = 0;
  CHECK_FALSE(w.Seen(1, &offset));
  w.Record(1, 40);
  w.Record(2, 41);
  REQUIRE(w.Seen(1, &offset));
  CHECK(offset == 40);
  REQUIRE(w.Seen(2, &offset));
  CHECK(offset == 41);
  CHECK_FALSE(w.Seen(3, &offset));
}

TEST_CASE("a sequence older than the window counts as a duplicate with no offset",
          "[publisher_window]") {
  PublisherWindow w;
  w.Record(1, 0);
  w.Record(PublisherWindow::kWindow + 5, 7);
  int64_t offset = 0;
  // Slot 5 % window was never written with sequence 5, but 5 is below the window.
  REQUIRE(w.Seen(5, &offset));
  CHECK(offset == -1);
  // A sequence inside the window that shares a slot with a newer one is new.
  CHECK_FALSE(w.Seen(PublisherWindow::kWindow + 4, &offset));
}

TEST_CASE("forgetting a sequence undoes its record only at or past the rolled-back end",
          "[publisher_window]") {
  PublisherWindow w;
  w.Record(1, 10);
  w.Record(2, 11);
  w.Forget(1, 11);  // stored below the end: kept
  w.Forget(2, 11);  // at the end: rolled back
  int64_t offset = 0;
  CHECK(w.Seen(1, &offset));
  CHECK_FALSE(w.Seen(2, &offset));
}

TEST_CASE("the publisher table keeps one window per publisher and evicts the oldest",
          "[publisher_window]") {
  PublisherTable table(2);
  auto a = table.Get("alice", 1);
  CHECK(table.Get("alice", 1) == a);
  auto b = table.Get("alice", 2);
  CHECK(b != a);
  CHECK(table.Get("bob", 1) != a);  // a third: alice/1, the oldest, goes
  CHECK(table.size() == 2);
  CHECK(table.Get("alice", 2) == b);
  CHECK(table.Get("alice", 1) != a);  // made afresh
}

}  // namespace
}  // namespace agentrt
