#include "comms/request_table.h"

#include <atomic>
#include <catch2/catch.hpp>
#include <thread>

namespace agentrt {
namespace {

using std::chrono::seconds;
using std::chrono::system_clock;

bus::v1::ReplyRequest Reply(const std::string& payload) {
  bus::v1::ReplyRequest r;
  r.set_payload(payload);
  r.set_content_type("text/plain");
  return r;
}

TEST_CASE("a request gets the reply its addressee gives", "[request_table]") {
  RequestTable table(101);
  const auto ticket = table.Open("server");
  CHECK(ticket.id == 101);
  CHECK(table.Open("server").id == 102);
  std::thread replier([&] {
    auto reply = Reply("pong");
    CHECK(table.Answer(ticket.id, "server", reply).ok());
  });
  bus::v1::RequestResponse out;
  const auto end = table.Wait(ticket, system_clock::now() + seconds(10), {}, {}, &out);
  replier.join();
  REQUIRE(end == RequestTable::End::kReplied);
  CHECK(out.payload() == "pong");
  CHECK(out.replier() == "server");
  CHECK(out.content_type() == "text/plain");
  CHECK(table.size() == 1);  // the second ticket still waits
}

TEST_CASE("only the addressee answers, and only once", "[request_table]") {
  RequestTable table(1);
  const auto ticket = table.Open("server");
  auto reply = Reply("x");
  Status wrong = table.Answer(ticket.id, "eve", reply);
  CHECK(wrong.code() == StatusCode::kPermissionDenied);
  CHECK_THAT(wrong.message(), Catch::Contains("addressed to agent server"));
  CHECK(table.Answer(ticket.id, "server", reply).ok());
  Status again = table.Answer(ticket.id, "server", reply);
  CHECK(again.code() == StatusCode::kNotFound);
  CHECK(table.Answer(999, "server", reply).code() == StatusCode::kNotFound);
}

TEST_CASE("a request ends at its deadline, on cancel or at shutdown, and is forgotten",
          "[request_table]") {
  RequestTable table(1);
  bus::v1::RequestResponse out;
  const auto late = table.Open("server");
  CHECK(table.Wait(late, system_clock::now(), {}, {}, &out) == RequestTable::End::kDeadline);
  const auto cancelled = table.Open("server");
  CHECK(table.Wait(
            cancelled, system_clock::now() + seconds(10), {}, [] { return true; }, &out) ==
        RequestTable::End::kCancelled);
  std::atomic<bool> stopping{false};
  const auto stopped = table.Open("server");
  std::thread stopper([&] {
    stopping = true;
    table.WakeAll();
  });
  CHECK(table.Wait(
            stopped, system_clock::now() + seconds(10), [&] { return stopping.load(); }, {},
            &out) == RequestTable::End::kShutdown);
  stopper.join();
  CHECK(table.size() == 0);
  auto reply = Reply("too late");
  CHECK(table.Answer(late.id, "server", reply).code() == StatusCode::kNotFound);
}

}  // namespace
}  // namespace agentrt
