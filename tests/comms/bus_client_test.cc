// BusClient's own logic against a real broker through a stub that injects
// faults (tests/comms/faulty_bus_stub.h): retries that keep their sequence so
// the broker stores a message once, reconnects that resume at the next offset
// with no gap and no duplicate, expired offsets and broker restarts reported as
// events, async publish streams resent in order. No sleeps: every wait is for
// an event, bounded.
#include <algorithm>
#include <catch2/catch.hpp>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>
#include <vector>

#include "comms/bus_client_stub.h"
#include "tests/common/wait_for.h"
#include "tests/comms/faulty_bus_stub.h"

namespace agentrt {
namespace {

using testing::FaultyBus;
using testing::FaultyBusStub;
using testing::WaitFor;
using namespace std::chrono_literals;

struct Fixture {
  std::shared_ptr<FaultyBus> bus;
  std::unique_ptr<BusClient> client;  // after the bus: destroyed first

  explicit Fixture(BusClientOptions options = Fast(), BrokerOptions broker = {})
      : bus(std::make_shared<FaultyBus>(broker)) {
    auto c = MakeBusClientWithStub(std::make_unique<FaultyBusStub>(bus), "faulty:0",
                                   testing::FaultyBusCredential("me"), options);
    REQUIRE(c.ok());
    client = std::move(c).value();
  }
  static BusClientOptions Fast() {
    BusClientOptions o;
    o.retry_backoff = 1ms;  // the client's own wait between attempts; the test never sleeps
    o.max_retry_backoff = 1ms;
    o.call_timeout = 5s;
    return o;
  }
};

// What a subscription delivered, and its events, waited for by count.
struct Inbox {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<std::string> payloads;
  std::vector<int64_t> offsets;
  std::vector<SubscriptionEvent::Kind> events;

  MessageCallback OnMessage() {
    return [this](const BusMessage& m) {
      std::lock_guard<std::mutex> lock(mu);
      payloads.push_back(m.payload());
      offsets.push_back(m.offset());
      cv.notify_all();
    };
  }
  SubscribeOptions Options(bool skip_expired = false) {
    SubscribeOptions o;
    o.skip_expired = skip_expired;
    o.on_event = [this](const SubscriptionEvent& e) {
      std::lock_guard<std::mutex> lock(mu);
      events.push_back(e.kind);
      cv.notify_all();
    };
    return o;
  }
  bool WaitMessages(size_t n) {
    std::unique_lock<std::mutex> lock(mu);
    return cv.wait_for(lock, 10s, [&] { return payloads.size() >= n; });
  }
  bool WaitEvent(SubscriptionEvent::Kind kind) {
    std::unique_lock<std::mutex> lock(mu);
    return cv.wait_for(
        lock, 10s, [&] { return std::find(events.begin(), events.end(), kind) != events.end(); });
  }
};

TEST_CASE("a publish whose answer was lost is retried with its sequence and stored once") {
  Fixture f;
  f.bus->FailNextPublishes(2, grpc::StatusCode::UNAVAILABLE, /*stored=*/true);
  auto ack = f.client->Publish("t", "hello");
  REQUIRE(ack.ok());
  CHECK(ack->duplicate);  // the retry found the first copy
  CHECK(ack->offset == 0);
  CHECK(f.bus->publish_calls() == 3);
  CHECK(f.bus->Payloads("t") == std::vector<std::string>{"hello"});
  // The next publish has the next sequence: stored, not taken for a duplicate.
  auto next = f.client->Publish("t", "world");
  REQUIRE(next.ok());
  CHECK_FALSE(next->duplicate);
  CHECK(next->sequence == ack->sequence + 1);
  CHECK(f.bus->Payloads("t") == std::vector<std::string>{"hello", "world"});
}

TEST_CASE("a publish whose request was lost is retried until stored") {
  Fixture f;
  f.bus->FailNextPublishes(3, grpc::StatusCode::DEADLINE_EXCEEDED, /*stored=*/false);
  auto ack = f.client->Publish("t", "x");
  REQUIRE(ack.ok());
  CHECK_FALSE(ack->duplicate);
  CHECK(f.bus->publish_calls() == 4);
  CHECK(f.bus->Payloads("t").size() == 1);
}

// A large publish through the broker's spool whose adoption was lost (its
// answer, or its request) goes on in chunks from the publisher's own file,
// with the same sequence: stored once either way.
TEST_CASE("a spooled publish whose adoption was lost is stored once, in chunks if need be") {
  for (const bool stored : {true, false}) {
    INFO("adoption " << (stored ? "stored, its answer lost" : "request lost"));
    BrokerOptions broker;
    broker.limits.max_message_bytes = 16 << 20;
    Fixture f(Fixture::Fast(), broker);
    std::string big(size_t{6} << 20, 'a');
    big[12345] = 'b';
    f.bus->FailNextPublishes(1, grpc::StatusCode::UNAVAILABLE, stored);
    auto ack = f.client->Publish("t", big);
    INFO(ack.status().ToString());
    REQUIRE(ack.ok());
    CHECK(ack->offset == 0);
    CHECK(ack->duplicate == stored);  // the chunks found the adopted copy
    auto got = f.client->Fetch("t", 0, 4, 2s);
    REQUIRE(got.ok());
    REQUIRE(got->size() == 1);
    CHECK(got->front().payload() == big);
    auto next = f.client->Fetch("t", 1, 1, 100ms);
    REQUIRE(next.ok());
    CHECK(next->empty());  // no second copy
  }
}

// An adoption that outlives the publish's time ends it: the broker may be
// storing the version still (a slow disk), and the bytes are not sent twice.
TEST_CASE("a spooled publish whose adoption ran out of time is not sent again") {
  for (const bool stored : {true, false}) {
    INFO("adoption " << (stored ? "stored late" : "never arrived"));
    BrokerOptions broker;
    broker.limits.max_message_bytes = 16 << 20;
    Fixture f(Fixture::Fast(), broker);
    const std::string big(size_t{6} << 20, 'd');
    f.bus->FailNextPublishes(1, grpc::StatusCode::DEADLINE_EXCEEDED, stored);
    auto ack = f.client->Publish("t", big);
    CHECK(ack.status().code() == StatusCode::kDeadlineExceeded);
    CHECK(f.bus->Payloads("t").size() == (stored ? 1u : 0u));  // no chunked resend after it
    CHECK(f.bus->SpoolFiles() == 0);  // the publisher's file is not left behind
  }
}

// A file of the spool the broker could not take (FAILED_PRECONDITION: no
// descriptor left, a file it could not move) sends the payload in chunks,
// and large payloads go through the socket for spool_retry_after; then the
// spool is asked for again and used, by sync and async publishes alike.
TEST_CASE("a refused spool file turns the spool off for spool_retry_after, not for good") {
  for (const bool waited : {false, true}) {
    INFO((waited ? "the wait is over (spool_retry_after 0)" : "within the wait (an hour)"));
    BusClientOptions options = Fixture::Fast();
    options.spool_retry_after = waited ? 0ms : 1h;
    BrokerOptions broker;
    broker.limits.max_message_bytes = 16 << 20;
    Fixture f(options, broker);
    const std::string big(size_t{6} << 20, 'r');
    const std::string medium(size_t{512} << 10, 'q');  // spooled by PublishAsync
    auto adopted = [&] {
      auto stats = f.client->Stats();
      REQUIRE(stats.ok());
      return stats->large_adopted;
    };
    REQUIRE(f.client->Publish("t", big).ok());
    f.client->PublishAsync("t", medium);  // the async side's first ask, spent here
    REQUIRE(f.client->Flush(10s).ok());
    REQUIRE(adopted() == 2);  // the spool proven and used by both
    f.bus->FailNextPublishes(1, grpc::StatusCode::FAILED_PRECONDITION, /*stored=*/false);
    REQUIRE(f.client->Publish("t", big).ok());  // its bytes in chunks
    CHECK(adopted() == 2);
    const int asked = f.bus->spool_calls();
    // Async payloads first: only their own ask can bring the spool back.
    for (int i = 0; i < 3; ++i) f.client->PublishAsync("t", medium);
    REQUIRE(f.client->Flush(10s).ok());
    if (waited) {
      CHECK(f.bus->spool_calls() > asked);  // asked again
      CHECK(adopted() == 2 + 3);            // and used: nothing inline
    } else {
      CHECK(f.bus->spool_calls() == asked);  // not asked
      CHECK(adopted() == 2);                 // every byte through the socket
    }
    REQUIRE(f.client->Publish("t", big).ok());
    CHECK(adopted() == (waited ? 6 : 2));
    if (!waited) CHECK(f.bus->spool_calls() == asked);
    auto topics = f.client->ListTopics("t");
    REQUIRE(topics.ok());
    REQUIRE(topics->size() == 1);
    CHECK((*topics)[0].end_offset() == 7);  // each stored once
    CHECK(f.bus->SpoolFiles() == 0);
  }
}

TEST_CASE("a refused publish is not retried and names topic, bus and agent") {
  Fixture f;
  f.bus->FailNextPublishes(1, grpc::StatusCode::PERMISSION_DENIED, /*stored=*/false);
  auto ack = f.client->Publish("secret-topic", "x");
  REQUIRE_FALSE(ack.ok());
  CHECK(ack.status().code() == StatusCode::kPermissionDenied);
  CHECK_THAT(ack.status().message(), Catch::Contains("secret-topic") &&
                                         Catch::Contains("faulty:0") &&
                                         Catch::Contains("agent me"));
  CHECK(f.bus->publish_calls() == 1);
}

TEST_CASE("a retried send is stored once in the receiver's inbox") {
  Fixture f;
  f.bus->FailNextPublishes(1, grpc::StatusCode::UNAVAILABLE, /*stored=*/true);
  auto ack = f.client->Send("other", "direct");
  REQUIRE(ack.ok());
  CHECK(ack->duplicate);
  CHECK(f.bus->Payloads("@inbox/other") == std::vector<std::string>{"direct"});
}

TEST_CASE("a broken subscription resumes at its next offset: no gap, no duplicate") {
  Inbox inbox;  // outlives the client, whose threads call it
  Fixture f;
  for (int i = 0; i < 10; ++i) f.bus->Append("t", "m" + std::to_string(i));
  f.bus->BreakNextStreamAfter(3);
  auto id = f.client->Subscribe("t", StartAt::Earliest(), inbox.OnMessage(), inbox.Options());
  REQUIRE(id.ok());
  REQUIRE(inbox.WaitMessages(10));
  std::vector<int64_t> expected;
  for (int64_t i = 0; i < 10; ++i) expected.push_back(i);
  {
    std::lock_guard<std::mutex> lock(inbox.mu);
    CHECK(inbox.offsets == expected);
    CHECK(std::count(inbox.events.begin(), inbox.events.end(),
                     SubscriptionEvent::Kind::kReconnecting) >= 1);
  }
  // The second stream asked for offset 3, where the first one broke.
  const auto starts = f.bus->stream_starts();
  REQUIRE(starts.size() >= 2);
  CHECK(starts[0] == -1);
  CHECK(starts[1] == 3);
  // The position moves past a message once its callback has returned.
  CHECK(WaitFor([&] { return f.client->SubscriptionOffsets().at("t") == 10; }, 10s));
  // New messages keep arriving on the resumed stream.
  f.bus->Append("t", "m10");
  REQUIRE(inbox.WaitMessages(11));
  CHECK(f.client->Unsubscribe(*id).ok());
}

TEST_CASE("a subscription from a checkpointed offset starts exactly there") {
  Inbox inbox;  // outlives the client, whose threads call it
  Fixture f;
  for (int i = 0; i < 6; ++i) f.bus->Append("t", "m" + std::to_string(i));
  auto id = f.client->Subscribe("t", StartAt::Offset(4), inbox.OnMessage(), inbox.Options());
  REQUIRE(id.ok());
  REQUIRE(inbox.WaitMessages(2));
  std::lock_guard<std::mutex> lock(inbox.mu);
  CHECK(inbox.payloads == std::vector<std::string>{"m4", "m5"});
}

// A broker that holds the last two messages of a topic.
BrokerOptions KeepingTwo() {
  BrokerOptions o;
  o.retention_messages = 2;
  return o;
}

TEST_CASE("an expired offset ends the subscription, or skips to the earliest one when asked") {
  SECTION("by default: kFailed with OUT_OF_RANGE, never a silent gap") {
    Inbox inbox;  // outlives the client, whose threads call it
    Fixture f(Fixture::Fast(), KeepingTwo());
    for (int i = 0; i < 5; ++i) f.bus->Append("t", "m" + std::to_string(i));  // 3 and 4 held
    auto id = f.client->Subscribe("t", StartAt::Offset(1), inbox.OnMessage(), inbox.Options());
    REQUIRE(id.ok());
    REQUIRE(inbox.WaitEvent(SubscriptionEvent::Kind::kFailed));
    CHECK(f.client->SubscriptionStatus(*id).code() == StatusCode::kOutOfRange);
    std::lock_guard<std::mutex> lock(inbox.mu);
    CHECK(inbox.payloads.empty());
  }
  SECTION("skip_expired: kOffsetExpired, then on from the earliest held offset") {
    Inbox inbox;  // outlives the client, whose threads call it
    Fixture f(Fixture::Fast(), KeepingTwo());
    for (int i = 0; i < 5; ++i) f.bus->Append("t", "m" + std::to_string(i));  // 3 and 4 held
    auto id = f.client->Subscribe("t", StartAt::Offset(1), inbox.OnMessage(), inbox.Options(true));
    REQUIRE(id.ok());
    REQUIRE(inbox.WaitMessages(2));
    std::lock_guard<std::mutex> lock(inbox.mu);
    CHECK(inbox.payloads == std::vector<std::string>{"m3", "m4"});
    CHECK(std::find(inbox.events.begin(), inbox.events.end(),
                    SubscriptionEvent::Kind::kOffsetExpired) != inbox.events.end());
  }
}

TEST_CASE("a broker restart is reported when a subscription resumes") {
  Inbox inbox;  // outlives the client, whose threads call it
  Fixture f;
  for (int i = 0; i < 2; ++i) f.bus->Append("t", "m" + std::to_string(i));
  auto id = f.client->Subscribe("t", StartAt::Earliest(), inbox.OnMessage(), inbox.Options());
  REQUIRE(id.ok());
  REQUIRE(inbox.WaitMessages(2));
  f.bus->Restart();  // the stream breaks and resumes against the next incarnation
  REQUIRE(inbox.WaitEvent(SubscriptionEvent::Kind::kBrokerRestarted));
}

// Has the client learn that its broker takes packed entries (from an
// answer); the stream that carried it is closed, so the next batch opens one.
void LearnPacking(Fixture& f) {
  f.client->PublishAsync("warm-up", "w");
  REQUIRE(f.client->Flush(10s).ok());
  REQUIRE(f.bus->WaitPublishStreamsClosed());
}

TEST_CASE("async publishes survive a broken stream: resent in order, each stored once") {
  std::mutex mu;  // with `acks`, outlives the client, whose threads fill them
  std::vector<PublishAck> acks;
  int failed = 0;
  Fixture f;
  // The batch stored and not answered is packed, or messages.
  const bool packs = GENERATE(false, true);
  INFO((packs ? "packed batches" : "batches of messages"));
  if (packs) LearnPacking(f);
  f.bus->BreakNextPublishStreamAtBatch(1);  // stored, never answered
  for (int i = 0; i < 50; ++i) {
    f.client->PublishAsync("t", "a" + std::to_string(i), {}, [&](const Result<PublishAck>& r) {
      std::lock_guard<std::mutex> lock(mu);  // on the client's thread: no Catch2 macros here
      if (r.ok()) {
        acks.push_back(*r);
      } else {
        ++failed;
      }
    });
  }
  REQUIRE(f.client->Flush(10s).ok());
  std::vector<std::string> expected;
  for (int i = 0; i < 50; ++i) expected.push_back("a" + std::to_string(i));
  CHECK(f.bus->Payloads("t") == expected);  // each once, in queue order
  std::lock_guard<std::mutex> lock(mu);
  CHECK(failed == 0);
  REQUIRE(acks.size() == 50);
  for (size_t i = 1; i < acks.size(); ++i) CHECK(acks[i].sequence == acks[i - 1].sequence + 1);
  CHECK(std::any_of(acks.begin(), acks.end(), [](const PublishAck& a) { return a.duplicate; }));
  if (packs) CHECK(f.bus->packed_batches() >= 1);  // the batch stored unanswered
}

TEST_CASE(
    "a broker from before packed entries, met after an idle stream closed, gets them again as "
    "messages") {
  std::mutex mu;
  std::vector<PublishAck> acks;
  std::vector<Status> failed;
  Fixture f;
  LearnPacking(f);
  f.bus->ActAsBrokerBeforePackedEntries();  // as if replaced by an older broker meanwhile
  std::vector<std::string> expected;
  for (int i = 0; i < 20; ++i) {
    expected.push_back("m" + std::to_string(i));
    f.client->PublishAsync("t", expected.back(), {}, [&](const auto& r) {
      std::lock_guard<std::mutex> lock(mu);  // on the client's thread: no Catch2 macros here
      if (r.ok()) {
        acks.push_back(*r);
      } else {
        failed.push_back(r.status());
      }
    });
  }
  REQUIRE(f.client->Flush(10s).ok());
  CHECK(f.bus->packed_batches() >= 1);  // the first went packed, and was refused
  CHECK(f.bus->Payloads("t") == expected);
  std::lock_guard<std::mutex> lock(mu);
  CHECK(failed.empty());
  CHECK(acks.size() == expected.size());
}

TEST_CASE(
    "async publishes to several topics and content types, one refused, are stored in order, "
    "whatever their batches") {
  struct Entry {
    std::string topic, payload, content_type;
  };
  std::vector<Entry> entries;
  for (int i = 0; i < 40; ++i) {
    entries.push_back({i % 10 == 9 ? "u" : "t", "m" + std::to_string(i), ""});
    if (i == 20) entries.push_back({"t", "typed", "text/x-typed"});
    if (i == 25) entries.push_back({"bad topic", "refused", ""});
  }
  std::mutex mu;
  std::vector<std::string> acked;
  std::vector<Status> failed;
  Fixture f;
  // Known to the client as a broker that takes packed entries (an answer
  // said so), or not yet: the batches start packed, or as messages.
  const bool packs = GENERATE(false, true);
  INFO((packs ? "packed batches" : "batches of messages"));
  if (packs) LearnPacking(f);
  // A first batch stored and never answered: what follows piles up in the
  // queue meanwhile, in batches that mix topics (a packed one is unpacked
  // there, at its first "u", before it is sent; what is resent goes as
  // messages until the broker answers).
  f.bus->BreakNextPublishStreamAtBatch(1);
  for (const Entry& e : entries) {
    PublishOptions o;
    o.content_type = e.content_type;
    f.client->PublishAsync(e.topic, e.payload, o, [&, payload = e.payload](const auto& r) {
      std::lock_guard<std::mutex> lock(mu);  // on the client's thread: no Catch2 macros here
      if (r.ok()) {
        acked.push_back(payload);
      } else {
        failed.push_back(r.status());
      }
    });
  }
  const Status flushed = f.client->Flush(10s);
  CHECK(flushed.code() == StatusCode::kInvalidArgument);
  std::vector<std::string> want_t, want_u;
  for (const Entry& e : entries) {
    if (e.topic == "t") want_t.push_back(e.payload);
    if (e.topic == "u") want_u.push_back(e.payload);
  }
  CHECK(f.bus->Payloads("t") == want_t);  // each once, in order
  CHECK(f.bus->Payloads("u") == want_u);
  auto typed = f.client->Fetch("t", 0, 100, 5s);
  REQUIRE(typed.ok());
  for (const auto& m : *typed) {
    INFO(m.payload());
    CHECK(m.content_type() == (m.payload() == "typed" ? "text/x-typed" : ""));
  }
  std::lock_guard<std::mutex> lock(mu);
  REQUIRE(failed.size() == 1);
  CHECK_THAT(failed[0].message(), Catch::Contains("bad topic"));
  CHECK(acked.size() == entries.size() - 1);
}

TEST_CASE("async publishes the broker refuses fail one by one, packed or not, nothing stored") {
  std::mutex mu;
  std::vector<Status> failed;
  int stored = 0;
  Fixture f;
  const bool packs = GENERATE(false, true);
  INFO((packs ? "packed batches" : "batches of messages"));
  if (packs) LearnPacking(f);
  for (int i = 0; i < 5; ++i) {
    f.client->PublishAsync("bad topic", "x" + std::to_string(i), {}, [&](const auto& r) {
      std::lock_guard<std::mutex> lock(mu);  // on the client's thread: no Catch2 macros here
      if (r.ok()) {
        ++stored;
      } else {
        failed.push_back(r.status());
      }
    });
  }
  CHECK(f.client->Flush(10s).code() == StatusCode::kInvalidArgument);
  if (packs) CHECK(f.bus->packed_batches() >= 1);  // refused packed, then one by one
  std::lock_guard<std::mutex> lock(mu);
  CHECK(stored == 0);
  REQUIRE(failed.size() == 5);
  for (const Status& s : failed) {
    CHECK(s.code() == StatusCode::kInvalidArgument);
    CHECK_THAT(s.message(), Catch::Contains("bad topic"));
  }
}

TEST_CASE(
    "spooled async payloads: a stored, unanswered batch is resent and stored once, and those "
    "published while the broker is asked about its spool again are spooled too") {
  std::mutex mu;
  std::vector<PublishAck> acks;
  int failed = 0;
  BrokerOptions broker;
  broker.limits.max_message_bytes = 16 << 20;
  Fixture f(Fixture::Fast(), broker);
  f.bus->BreakNextPublishStreamAtBatch(1);  // stored, never answered
  f.bus->HoldSpoolFrom(2);  // the first proves the spool; the re-ask waits for the test
  std::vector<std::string> sent;
  auto publish = [&](int i) {
    sent.push_back(std::string(size_t{256} << 10, static_cast<char>('a' + i)));
    f.client->PublishAsync("big", sent.back(), {}, [&](const Result<PublishAck>& r) {
      std::lock_guard<std::mutex> lock(mu);  // on the client's thread: no Catch2 macros here
      if (r.ok()) {
        acks.push_back(*r);
      } else {
        ++failed;
      }
    });
  };
  publish(0);
  // Its batch stored and the stream broken: the client asks about the spool again.
  REQUIRE(f.bus->WaitSpoolCalls(2));
  for (int i = 1; i < 12; ++i) publish(i);  // while the answer is awaited
  f.bus->ReleaseSpool();
  REQUIRE(f.client->Flush(10s).ok());
  // Each once, in queue order (a large message is fetched alone).
  auto topics = f.client->ListTopics("big");
  REQUIRE(topics.ok());
  REQUIRE(topics->size() == 1);
  CHECK((*topics)[0].end_offset() == static_cast<int64_t>(sent.size()));
  std::vector<std::string> got;
  while (got.size() < sent.size()) {
    auto fetched = f.client->Fetch("big", static_cast<int64_t>(got.size()), 100, 5s);
    REQUIRE(fetched.ok());
    REQUIRE_FALSE(fetched->empty());
    for (const auto& m : *fetched) got.push_back(m.payload());
  }
  REQUIRE(got.size() == sent.size());
  for (size_t i = 0; i < sent.size(); ++i) {
    INFO("message " << i);
    CHECK((got[i].size() == sent[i].size() && got[i] == sent[i]));  // no megabytes printed
  }
  auto stats = f.client->Stats();
  REQUIRE(stats.ok());
  CHECK(stats->large_adopted == 12);  // every one from its spool file, none inline
  std::lock_guard<std::mutex> lock(mu);
  CHECK(failed == 0);
  REQUIRE(acks.size() == 12);
  // The resent batch's entry was stored already: answered as a duplicate.
  CHECK(acks.front().duplicate);
}

TEST_CASE("every call reaches the real broker through the stub: large, request, list, stats") {
  Inbox requests;  // what the server was asked; outlives both clients, whose threads call it
  BrokerOptions broker;
  broker.limits.max_message_bytes = 16 << 20;  // room for a large message
  Fixture f(Fixture::Fast(), broker);
  auto server = MakeBusClientWithStub(std::make_unique<FaultyBusStub>(f.bus), "faulty:0",
                                      testing::FaultyBusCredential("server"), Fixture::Fast());
  REQUIRE(server.ok());
  BusClient* answering = server->get();
  auto id = answering->Receive(
      StartAt::Earliest(),
      [&](const BusMessage& m) {
        requests.OnMessage()(m);
        answering->Reply(m.request_id(), "re:" + m.payload()).IgnoreError();  // checked below
      },
      requests.Options());
  REQUIRE(id.ok());
  auto reply = f.client->Request("server", "ping", 10s);
  REQUIRE(reply.ok());
  CHECK(reply->payload == "re:ping");
  CHECK(reply->replier == "server");

  const std::string large(kMaxInlineBytes + 1000, 'x');  // PublishLarge, chunk by chunk
  auto ack = f.client->Publish("big", large);
  INFO(ack.status().ToString());
  REQUIRE(ack.ok());
  auto fetched = f.client->Fetch("big", ack->offset, 1, 10s);
  REQUIRE(fetched.ok());
  REQUIRE(fetched->size() == 1);
  CHECK(fetched->front().payload() == large);

  auto topics = f.client->ListTopics();
  REQUIRE(topics.ok());
  CHECK(std::any_of(topics->begin(), topics->end(),
                    [](const BusTopicInfo& t) { return t.topic() == "big"; }));
  auto stats = f.client->Stats();
  REQUIRE(stats.ok());
  CHECK(stats->incarnation == 1);
  CHECK(stats->messages_published >= 2);
  CHECK(answering->Unsubscribe(*id).ok());
}

}  // namespace
}  // namespace agentrt
