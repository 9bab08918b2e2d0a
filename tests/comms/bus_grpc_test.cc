// The real broker and client over gRPC on loopback: ordering, no loss and no
// duplicates over 100,000 messages with publisher retries and subscriber
// reconnects, broker restart, OFFSET_EXPIRED, refusals, limits, hostile bytes
// on the port, inboxes, request/reply, TLS and the agentrt-bus program.
#include <arpa/inet.h>
#include <fcntl.h>
#include <grpcpp/grpcpp.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "common/file_util.h"
#include "comms/auth.h"
#include "comms/bus_client.h"
#include "comms/bus_server.h"
#include "comms/proto/bus.grpc.pb.h"
#include "plan/fence.h"
#include "tests/common/programs.h"
#include "tests/common/wait_for.h"
#include "tests/plan/plan_test_util.h"

using namespace agentrt;
namespace v1 = agentrt::bus::v1;
using namespace std::chrono_literals;

namespace {

constexpr char kSecret[] = "test-run-secret-0123456789abcdef";

BusAcl TestAcl() {
  BusAcl acl;
  acl.agents = {"pub", "sub", "sub2", "other"};
  acl.channels = {{"t*", {"pub"}, {"sub", "sub2"}}, {"private", {"other"}, {"other"}}};
  return acl;
}

std::unique_ptr<BusServer> StartServer(BusServerOptions opts = {}, BusAcl acl = TestAcl()) {
  opts.host = "127.0.0.1";
  auto s = BusServer::Start(opts, kSecret, std::move(acl));
  INFO(s.status().ToString());
  REQUIRE(s.ok());
  return std::move(s).value();
}

std::unique_ptr<BusClient> Client(const std::string& address, const std::string& agent,
                                  BusClientOptions o = {}, std::string token = "") {
  if (token.empty()) token = DeriveAgentToken(kSecret, agent);
  auto c = BusClient::Connect(address, Credential{agent, token}, std::move(o));
  REQUIRE(c.ok());
  return std::move(c).value();
}

using agentrt::testing::WaitFor;

// A broker with a publisher "pub" and a subscriber "sub" connected to it.
struct PubSub {
  std::unique_ptr<BusServer> server = StartServer();
  std::unique_ptr<BusClient> pub = Client(server->address(), "pub");
  std::unique_ptr<BusClient> sub = Client(server->address(), "sub");
};

// Collects a subscription's messages and events, thread-safely.
struct Collector {
  std::mutex mu;
  std::vector<BusMessage> msgs;
  std::vector<SubscriptionEvent> events;
  MessageCallback OnMessage() {
    return [this](const BusMessage& m) {
      std::lock_guard<std::mutex> l(mu);
      msgs.push_back(m);
    };
  }
  SubscribeOptions Options(bool skip_expired = false) {
    SubscribeOptions o;
    o.skip_expired = skip_expired;
    o.on_event = [this](const SubscriptionEvent& e) {
      std::lock_guard<std::mutex> l(mu);
      events.push_back(e);
    };
    return o;
  }
  size_t size() {
    std::lock_guard<std::mutex> l(mu);
    return msgs.size();
  }
  bool HasEvent(SubscriptionEvent::Kind k) {
    std::lock_guard<std::mutex> l(mu);
    for (const auto& e : events) {
      if (e.kind == k) return true;
    }
    return false;
  }
  Status Failure() {
    std::lock_guard<std::mutex> l(mu);
    for (const auto& e : events) {
      if (e.kind == SubscriptionEvent::Kind::kFailed) return e.status;
    }
    return Status::Ok();
  }
};

// Payload i is the decimal index; checks that exactly 0..n-1 arrived in order
// with consecutive offsets from `first_offset`.
void CheckExactSequence(const std::vector<BusMessage>& msgs, int n, int64_t first_offset = 0) {
  REQUIRE(msgs.size() == static_cast<size_t>(n));
  int bad = 0;
  for (int i = 0; i < n; ++i) {
    if (msgs[i].payload() != std::to_string(i) || msgs[i].offset() != first_offset + i) {
      if (bad++ < 5)
        FAIL_CHECK("message " << i << " has payload " << msgs[i].payload() << " offset "
                              << msgs[i].offset());
    }
  }
  CHECK(bad == 0);
}

std::unique_ptr<v1::Bus::Stub> RawStub(const std::string& address) {
  return v1::Bus::NewStub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
}

void Authorize(grpc::ClientContext* ctx, const std::string& agent, const std::string& token = "") {
  ctx->AddMetadata("x-agentrt-agent", agent);
  ctx->AddMetadata("x-agentrt-token", token.empty() ? DeriveAgentToken(kSecret, agent) : token);
  ctx->set_deadline(std::chrono::system_clock::now() + 10s);
}

std::filesystem::path TempDir() {
  char tmpl[] = "/tmp/agentrt-bus-test.XXXXXX";
  REQUIRE(::mkdtemp(tmpl) != nullptr);
  return tmpl;
}

}  // namespace

TEST_CASE("messages of a topic arrive in publish order, topics are independent") {
  PubSub bus;
  auto& [server, pub, sub] = bus;
  Collector a, b;
  REQUIRE(sub->Subscribe("ta", StartAt::Earliest(), a.OnMessage()).ok());
  REQUIRE(sub->Subscribe("tb", StartAt::Earliest(), b.OnMessage()).ok());
  PublishOptions text;
  text.content_type = "text/plain";
  for (int i = 0; i < 200; ++i) {
    auto ack = pub->Publish(i % 2 ? "tb" : "ta", std::to_string(i / 2), text);
    REQUIRE(ack.ok());
    CHECK(ack->offset == i / 2);
  }
  REQUIRE(WaitFor([&] { return a.size() == 100 && b.size() == 100; }));
  CheckExactSequence(a.msgs, 100);
  CheckExactSequence(b.msgs, 100);
  CHECK(a.msgs[0].publisher() == "pub");
  CHECK(a.msgs[0].content_type() == "text/plain");
  CHECK(a.msgs[0].publisher_id() == pub->publisher_id());
  auto topics = sub->ListTopics();
  REQUIRE(topics.ok());
  CHECK(topics->size() == 2);
  auto one = sub->ListTopics("tb");  // only the topic asked for
  REQUIRE(one.ok());
  REQUIRE(one->size() == 1);
  CHECK(one->front().topic() == "tb");
  CHECK(one->front().end_offset() == 100);
  auto none = sub->ListTopics("tc");
  REQUIRE(none.ok());
  CHECK(none->empty());
  auto fetched = sub->Fetch("ta", 10, 5, 5s);
  REQUIRE(fetched.ok());
  REQUIRE(fetched->size() == 5);
  CHECK((*fetched)[0].offset() == 10);
}

TEST_CASE("100,000 messages with retried publishes: no loss, no duplicates, in order") {
  PubSub bus;
  auto& [server, pub, sub] = bus;
  Collector c;
  REQUIRE(sub->Subscribe("t100k", StartAt::Earliest(), c.OnMessage()).ok());
  constexpr int kN = 100000;
  std::atomic<int> duplicates{0}, failures{0};
  auto on_ack = [&](const Result<PublishAck>& r) {
    if (!r.ok())
      failures++;
    else if (r->duplicate)
      duplicates++;
  };
  for (int i = 0; i < kN; ++i) {
    const uint64_t seq = pub->NextSequence();
    pub->PublishAsync("t100k", std::to_string(i), {}, on_ack);
    // Every 10th message is sent again with its sequence, as a retry after a
    // lost acknowledgement would be.
    if (i % 10 == 0) {
      PublishOptions retry;
      retry.sequence = seq;
      pub->PublishAsync("t100k", std::to_string(i), retry, on_ack);
    }
  }
  REQUIRE(pub->Flush(60s).ok());
  CHECK(failures == 0);
  CHECK(duplicates == kN / 10);
  REQUIRE(WaitFor([&] { return c.size() >= static_cast<size_t>(kN); }, 60s));
  // A sentinel published last: once it arrived, anything extra before it would have too.
  REQUIRE(pub->Publish("t100k", "end").ok());
  REQUIRE(WaitFor([&] { return c.size() >= static_cast<size_t>(kN) + 1; }, 60s));
  CHECK(c.msgs.back().payload() == "end");
  CheckExactSequence(std::vector<BusMessage>(c.msgs.begin(), c.msgs.end() - 1), kN);
  auto stats = server->Stats();
  CHECK(stats.messages_published == kN + 1);
  CHECK(stats.duplicates_dropped == kN / 10);
}

TEST_CASE(
    "100,000 messages while subscriber streams are cut and a subscriber restores from its "
    "offsets") {
  PubSub bus;
  auto& [server, pub, sub] = bus;
  Collector c;
  REQUIRE(sub->Subscribe("tcut", StartAt::Earliest(), c.OnMessage(), c.Options()).ok());

  // A second agent reads the first 30,000, "checkpoints" its offsets, goes away,
  // and a new incarnation resumes from the checkpoint.
  auto sub2 = Client(server->address(), "sub2");
  Collector first;
  std::atomic<int> seen{0};
  std::atomic<bool> released{false};
  SubscribeOptions small;
  small.max_batch_messages = 100;
  auto id = sub2->Subscribe(
      "tcut", StartAt::Earliest(),
      [&](const BusMessage& m) {
        if (released.load()) return;  // this incarnation is gone; nothing it reads counts
        if (seen.load() < 30000) {
          first.OnMessage()(m);
          seen++;
          return;
        }
        // Past the checkpoint: block until the test has read the offsets (bounded).
        const auto until = std::chrono::steady_clock::now() + 60s;
        while (!released.load() && std::chrono::steady_clock::now() < until) {
          std::this_thread::sleep_for(1ms);
        }
      },
      small);
  REQUIRE(id.ok());

  constexpr int kN = 100000;
  std::thread cutter([&] {
    for (int k = 0; k < 5; ++k) {
      std::this_thread::sleep_for(150ms);  // the pace of the cuts, not a synchronisation
      server->CloseStreams();
    }
  });
  for (int i = 0; i < kN; ++i) pub->PublishAsync("tcut", std::to_string(i));
  REQUIRE(pub->Flush(60s).ok());
  cutter.join();

  REQUIRE(WaitFor([&] { return seen.load() >= 30000; }, 60s));
  auto offsets = sub2->SubscriptionOffsets();
  released = true;
  REQUIRE(sub2->Unsubscribe(id.value()).ok());
  REQUIRE(offsets.count("tcut") == 1);
  CHECK(offsets["tcut"] == 30000);
  sub2.reset();
  auto restored = Client(server->address(), "sub2");
  Collector rest;
  REQUIRE(restored->Subscribe("tcut", StartAt::Offset(offsets["tcut"]), rest.OnMessage()).ok());

  REQUIRE(WaitFor([&] { return c.size() >= static_cast<size_t>(kN) && rest.size() >= kN - 30000u; },
                  60s));
  // A sentinel published last: once both have it, anything extra would have shown up.
  REQUIRE(pub->Publish("tcut", "end").ok());
  REQUIRE(WaitFor([&] { return c.size() >= kN + 1u && rest.size() >= kN - 30000u + 1; }, 60s));
  CHECK(c.msgs.back().payload() == "end");
  CHECK(rest.msgs.back().payload() == "end");
  CheckExactSequence(std::vector<BusMessage>(c.msgs.begin(), c.msgs.end() - 1), kN);
  std::vector<BusMessage> joined = first.msgs;
  joined.insert(joined.end(), rest.msgs.begin(), rest.msgs.end() - 1);
  CheckExactSequence(joined, kN);
  CHECK(c.HasEvent(SubscriptionEvent::Kind::kReconnecting));
  CHECK(sub->SubscriptionOffsets()["tcut"] == kN + 1);
}

TEST_CASE(
    "after a broker restart, publishes are retried and subscriptions resume, told that the log "
    "restarted") {
  BusServerOptions opts;
  auto server = StartServer(opts);
  const int port = server->port();
  const std::string address = server->address();
  auto pub = Client(address, "pub");
  auto sub = Client(address, "sub");
  Collector c;
  REQUIRE(sub->Subscribe("trestart", StartAt::Earliest(), c.OnMessage(), c.Options()).ok());
  for (int i = 0; i < 100; ++i) REQUIRE(pub->Publish("trestart", std::to_string(i)).ok());
  REQUIRE(WaitFor([&] { return c.size() == 100; }));
  server->Shutdown();
  server.reset();

  // Publish while the broker is down: the client retries until it is back.
  PublishOptions patient;
  patient.timeout = 30s;
  std::thread late([&] {
    std::this_thread::sleep_for(300ms);  // how long the broker stays down
    opts.port = port;
    for (int attempt = 0; attempt < 50 && !server; ++attempt) {
      auto s = BusServer::Start(
          [&] {
            auto o = opts;
            o.host = "127.0.0.1";
            return o;
          }(),
          kSecret, TestAcl());
      if (s.ok())
        server = std::move(s).value();
      else
        std::this_thread::sleep_for(100ms);
    }
  });
  auto first_after = pub->Publish("trestart", "100", patient);
  late.join();
  REQUIRE(server);
  REQUIRE(first_after.ok());
  CHECK(first_after->offset == 0);  // a new, empty log
  for (int i = 101; i < 200; ++i) REQUIRE(pub->Publish("trestart", std::to_string(i)).ok());
  REQUIRE(WaitFor([&] { return c.size() == 200; }));
  CHECK(c.HasEvent(SubscriptionEvent::Kind::kBrokerRestarted));
  std::vector<BusMessage> after(c.msgs.begin() + 100, c.msgs.end());
  for (int i = 0; i < 100; ++i) {
    CHECK(after[i].payload() == std::to_string(100 + i));
    CHECK(after[i].offset() == i);
  }
}

TEST_CASE(
    "offsets restored from a checkpoint with their incarnation: on a new broker the subscriber "
    "reads the new log from its start, told so") {
  auto server = StartServer();
  auto pub = Client(server->address(), "pub");
  uint64_t incarnation = 0;
  std::map<std::string, int64_t> offsets;
  {
    auto sub = Client(server->address(), "sub");
    Collector c;
    REQUIRE(sub->Subscribe("tresume", StartAt::Earliest(), c.OnMessage(), c.Options()).ok());
    for (int i = 0; i < 50; ++i) REQUIRE(pub->Publish("tresume", std::to_string(i)).ok());
    REQUIRE(WaitFor([&] { return c.size() == 50; }));
    offsets = sub->SubscriptionOffsets();
    incarnation = sub->SubscriptionIncarnation();
  }
  CHECK(offsets["tresume"] == 50);
  CHECK(incarnation != 0);
  CHECK(incarnation != kMixedIncarnation);

  // Same broker: the saved position is exact.
  {
    auto same = Client(server->address(), "sub");
    Collector c;
    REQUIRE(same->Subscribe("tresume", StartAt::Offset(offsets["tresume"], incarnation),
                            c.OnMessage(), c.Options())
                .ok());
    REQUIRE(pub->Publish("tresume", "50").ok());
    REQUIRE(WaitFor([&] { return c.size() == 1; }));
    CHECK(c.msgs[0].offset() == 50);
    CHECK_FALSE(c.HasEvent(SubscriptionEvent::Kind::kBrokerRestarted));
  }

  // The controller died and a new broker serves the resumed run: its log is
  // new and shorter than the saved offset. Without the incarnation the
  // subscriber would wait at offset 50 and miss the first 50 messages.
  server->Shutdown();
  server = StartServer();
  auto pub2 = Client(server->address(), "pub");
  for (int i = 0; i < 5; ++i) REQUIRE(pub2->Publish("tresume", "new" + std::to_string(i)).ok());
  auto resumed = Client(server->address(), "sub");
  Collector c;
  REQUIRE(resumed
              ->Subscribe("tresume", StartAt::Offset(offsets["tresume"], incarnation),
                          c.OnMessage(), c.Options())
              .ok());
  REQUIRE(WaitFor([&] { return c.size() == 5; }));
  CHECK(c.HasEvent(SubscriptionEvent::Kind::kBrokerRestarted));
  CHECK(c.msgs[0].payload() == "new0");
  CHECK(c.msgs[0].offset() == 0);
  CHECK(resumed->SubscriptionIncarnation() != incarnation);
}

TEST_CASE(
    "a subscriber behind retention gets OFFSET_EXPIRED with the earliest offset, never a silent "
    "gap") {
  BusServerOptions opts;
  opts.broker.retention_messages = 100;
  auto server = StartServer(opts);
  auto pub = Client(server->address(), "pub");
  for (int i = 0; i < 300; ++i) pub->PublishAsync("texp", std::to_string(i));
  REQUIRE(pub->Flush(30s).ok());

  auto sub = Client(server->address(), "sub");
  Collector strict;
  auto id = sub->Subscribe("texp", StartAt::Offset(0), strict.OnMessage(), strict.Options());
  REQUIRE(id.ok());
  REQUIRE(WaitFor([&] { return !strict.Failure().ok(); }));
  Status failure = strict.Failure();
  CHECK(failure.code() == StatusCode::kOutOfRange);
  CHECK(failure.message().find("OFFSET_EXPIRED") != std::string::npos);
  CHECK(failure.message().find("earliest available offset is 200") != std::string::npos);
  CHECK(strict.size() == 0);
  CHECK(sub->SubscriptionStatus(id.value()).code() == StatusCode::kOutOfRange);

  Collector skipping;
  REQUIRE(sub->Subscribe("texp", StartAt::Offset(0), skipping.OnMessage(), skipping.Options(true))
              .ok());
  REQUIRE(WaitFor([&] { return skipping.size() == 100; }));
  CHECK(skipping.HasEvent(SubscriptionEvent::Kind::kOffsetExpired));
  {
    std::lock_guard<std::mutex> l(skipping.mu);
    for (const auto& e : skipping.events) {
      if (e.kind == SubscriptionEvent::Kind::kOffsetExpired) {
        CHECK(e.offset == 0);
        CHECK(e.earliest == 200);
      }
    }
    CHECK(skipping.msgs.front().offset() == 200);
    CHECK(skipping.msgs.back().offset() == 299);
  }
}

TEST_CASE("wrong credentials are UNAUTHENTICATED, channels outside the ACL are PERMISSION_DENIED") {
  auto server = StartServer();
  const auto addr = server->address();
  auto impostor = Client(addr, "pub", {}, DeriveAgentToken("another-run-secret", "pub"));
  auto r = impostor->Publish("ta", "x");
  REQUIRE_FALSE(r.ok());
  CHECK(r.status().code() == StatusCode::kUnauthenticated);
  CHECK(r.status().message().find("pub") != std::string::npos);

  auto stranger = Client(addr, "stranger");
  CHECK(stranger->Publish("ta", "x").status().code() == StatusCode::kUnauthenticated);

  auto sub = Client(addr, "sub");
  CHECK(sub->Publish("ta", "x").status().code() == StatusCode::kPermissionDenied);
  Collector denied;
  REQUIRE(
      sub->Subscribe("private", StartAt::Earliest(), denied.OnMessage(), denied.Options()).ok());
  REQUIRE(WaitFor([&] { return !denied.Failure().ok(); }));
  CHECK(denied.Failure().code() == StatusCode::kPermissionDenied);

  // Publishing as another agent with a valid token of one's own.
  auto stub = RawStub(addr);
  grpc::ClientContext ctx;
  Authorize(&ctx, "pub");
  v1::PublishRequest req;
  req.set_topic("ta");
  req.set_publisher("other");
  v1::PublishResponse resp;
  auto s = stub->Publish(&ctx, req, &resp);
  CHECK(s.error_code() == grpc::StatusCode::PERMISSION_DENIED);
  grpc::ClientContext none;
  none.set_deadline(std::chrono::system_clock::now() + 10s);
  CHECK(stub->Publish(&none, req, &resp).error_code() == grpc::StatusCode::UNAUTHENTICATED);
  CHECK(server->Stats().rejected_unauthenticated >= 3);
}

TEST_CASE("an oversized message is RESOURCE_EXHAUSTED and nothing else happens") {
  BusServerOptions opts;
  opts.broker.limits.max_message_bytes = 1024;
  auto server = StartServer(opts);
  auto pub = Client(server->address(), "pub");
  REQUIRE(pub->Publish("tbig", std::string(1024, 'x')).ok());
  auto over = pub->Publish("tbig", std::string(1025, 'x'));
  REQUIRE_FALSE(over.ok());
  CHECK(over.status().code() == StatusCode::kResourceExhausted);
  CHECK(over.status().message().find("1025 bytes") != std::string::npos);
  // Beyond the transport limit too (max(max_message_bytes, 4 MiB batches) + 1 MiB).
  auto huge = pub->Publish("tbig", std::string(6 << 20, 'x'));
  CHECK(huge.status().code() == StatusCode::kResourceExhausted);
  REQUIRE(pub->Publish("tbig", "small").ok());
  auto topics = Client(server->address(), "sub")->ListTopics();
  REQUIRE(topics.ok());
  REQUIRE(topics->size() == 1);
  CHECK((*topics)[0].end_offset() == 2);
}

TEST_CASE(
    "garbage TCP bytes and a truncated HTTP/2 frame on the broker port do not disturb other "
    "clients") {
  PubSub bus;
  auto& [server, pub, sub] = bus;
  Collector c;
  REQUIRE(sub->Subscribe("tgarbage", StartAt::Earliest(), c.OnMessage()).ok());
  REQUIRE(pub->Publish("tgarbage", "0").ok());

  auto send_raw = [&](const std::string& bytes) {
    int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    REQUIRE(fd >= 0);
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    sa.sin_port = htons(static_cast<uint16_t>(server->port()));
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(::connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) == 0);
    (void)!::write(fd, bytes.data(), bytes.size());
    // Done sending; wait (bounded) until the broker has read the bytes and
    // closed its end, or answered and stopped.
    ::shutdown(fd, SHUT_WR);
    timeval tv{5, 0};
    ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    char sink[4096];
    while (::read(fd, sink, sizeof sink) > 0) {
    }
    ::close(fd);
  };
  std::mt19937 rng(7);
  std::string garbage(64 << 10, '\0');
  for (auto& ch : garbage) ch = static_cast<char>(rng());
  send_raw(garbage);
  send_raw("GET / HTTP/1.1\r\nHost: x\r\n\r\n");
  const std::string preface = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
  // A SETTINGS frame header that promises 18 bytes, followed by 3.
  send_raw(preface + std::string("\x00\x00\x12\x04\x00\x00\x00\x00\x00", 9) +
           std::string("\x00\x03\x00", 3));
  // A HEADERS frame cut in the middle of its header.
  send_raw(preface + std::string("\x00\x00\x00\x04\x00\x00\x00\x00\x00", 9) +
           std::string("\x00\x40\x00\x01", 4));
  // Many at once, left open.
  std::vector<int> open_fds;
  for (int i = 0; i < 20; ++i) {
    int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    sa.sin_port = htons(static_cast<uint16_t>(server->port()));
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) == 0) {
      (void)!::write(fd, preface.data(), 10);
      open_fds.push_back(fd);
    } else {
      ::close(fd);
    }
  }
  for (int i = 1; i < 100; ++i) REQUIRE(pub->Publish("tgarbage", std::to_string(i)).ok());
  REQUIRE(WaitFor([&] { return c.size() == 100; }));
  CheckExactSequence(c.msgs, 100);
  for (int fd : open_fds) ::close(fd);
  // A fresh client after all that.
  auto late = Client(server->address(), "sub2");
  auto fetched = late->Fetch("tgarbage", 99, 1, 10s);
  REQUIRE(fetched.ok());
  REQUIRE(fetched->size() == 1);
  CHECK((*fetched)[0].payload() == "99");
}

TEST_CASE(
    "direct messages reach only the addressee's inbox; requests get their reply or a deadline") {
  auto server = StartServer();
  auto a = Client(server->address(), "pub");
  auto b = Client(server->address(), "sub");
  auto eve = Client(server->address(), "other");
  Collector inbox;
  REQUIRE(b->Receive(StartAt::Earliest(), inbox.OnMessage()).ok());
  REQUIRE(a->Send("sub", "hello b").ok());
  REQUIRE(eve->Send("sub", "hello from eve").ok());
  CHECK(a->Send("nobody", "x").status().code() == StatusCode::kNotFound);
  REQUIRE(WaitFor([&] { return inbox.size() == 2; }));
  CHECK(inbox.msgs[0].publisher() == "pub");
  CHECK(inbox.msgs[0].payload() == "hello b");
  CHECK(inbox.msgs[1].publisher() == "other");
  CHECK(b->SubscriptionOffsets()["@inbox/sub"] == 2);

  // b answers requests from its inbox.
  auto responder = Client(server->address(), "sub");
  Collector events;
  auto rid = responder->Receive(
      StartAt::Latest(),
      [&](const BusMessage& m) {
        if (m.request_id() != 0)
          (void)responder->Reply(m.request_id(), "re: " + m.payload(), "text/plain");
      },
      events.Options());
  REQUIRE(rid.ok());
  // The responder's stream opens at "latest": wait until it is connected.
  REQUIRE(WaitFor([&] { return events.HasEvent(SubscriptionEvent::Kind::kConnected); }));
  auto reply = a->Request("sub", "ping", 10s);
  REQUIRE(reply.ok());
  CHECK(reply->payload == "re: ping");
  CHECK(reply->replier == "sub");
  CHECK(reply->content_type == "text/plain");
  auto unanswered = a->Request("other", "anyone?", 200ms);
  CHECK(unanswered.status().code() == StatusCode::kDeadlineExceeded);
  REQUIRE(responder->Unsubscribe(rid.value()).ok());
}

// Agent "pub"'s environment in `dir` (its token file written there), on the bus at `address`.
AgentEnv PubEnvironment(const std::filesystem::path& dir, const std::string& address) {
  const std::string token_file = (dir / "pub.token").string();
  REQUIRE(WriteTokenFile(token_file, {"pub", DeriveAgentToken(kSecret, "pub")}).ok());
  AgentEnv env;
  env.run_dir = dir.string();
  env.agent = "pub";
  env.ckpt_dir = (dir / "ckpt").string();
  env.bus = address;
  env.token_file = token_file;
  return env;
}

TEST_CASE("a client built from the agent environment connects with its token file") {
  auto server = StartServer();
  auto dir = TempDir();
  AgentEnv env = PubEnvironment(dir, server->address());
  auto c = BusClient::ForAgent(env);
  REQUIRE(c.ok());
  CHECK((*c)->agent() == "pub");
  REQUIRE((*c)->WaitForReady(10s).ok());
  CHECK((*c)->Publish("tenv", "x").ok());
  // FromEnvironment parses the same contract from the process's variables.
  for (const auto& [k, v] : env.ToVariables()) ::setenv(k.c_str(), v.c_str(), 1);
  auto from_env = BusClient::FromEnvironment();
  for (const auto& [k, v] : env.ToVariables()) ::unsetenv(k.c_str());
  REQUIRE(from_env.ok());
  CHECK((*from_env)->agent() == "pub");
  CHECK(BusClient::FromEnvironment().status().code() == StatusCode::kNotFound);
  env.bus.clear();
  CHECK(BusClient::ForAgent(env).status().code() == StatusCode::kFailedPrecondition);
  std::filesystem::remove_all(dir);
}

TEST_CASE("a launch the controller replaced is fenced off the bus; the current one is not") {
  BusAcl acl = TestAcl();
  acl.channels.push_back({"fence", {"pub"}, {"pub"}});  // pub may read what it publishes
  auto server = StartServer({}, acl);
  auto dir = TempDir();
  AgentEnv env = PubEnvironment(dir, server->address());
  env.telemetry = "127.0.0.1:1";  // launched by a controller: the fence names its launch
  std::filesystem::create_directories(env.ckpt_dir);
  REQUIRE(WriteCheckpointFence(env.ckpt_dir, "0.old").ok());
  server->SetAgentIncarnation("pub", "0.old");
  auto old_launch = BusClient::ForAgent(env);
  REQUIRE(old_launch.ok());
  REQUIRE((*old_launch)->Publish("fence", "before").ok());
  Collector open_before;  // a subscription the old launch holds open across the relaunch
  REQUIRE(
      (*old_launch)
          ->Subscribe("fence", StartAt::Earliest(), open_before.OnMessage(), open_before.Options())
          .ok());
  REQUIRE(WaitFor([&] { return open_before.size() == 1; }));

  // A relaunch elsewhere while the old process runs on (a partitioned node).
  REQUIRE(WriteCheckpointFence(env.ckpt_dir, "1.new").ok());
  server->SetAgentIncarnation("pub", "1.new");
  REQUIRE(WaitFor([&] { return !open_before.Failure().ok(); }));
  CHECK(open_before.Failure().code() == StatusCode::kPermissionDenied);
  CHECK(open_before.Failure().message().find("fenced") != std::string::npos);
  auto refused = (*old_launch)->Publish("fence", "from the old launch");
  REQUIRE_FALSE(refused.ok());
  CHECK(refused.status().code() == StatusCode::kPermissionDenied);
  CHECK(refused.status().message().find("fenced: launch 0.old of agent pub was replaced by "
                                        "launch 1.new") != std::string::npos);
  Collector old_reads;
  REQUIRE((*old_launch)
              ->Subscribe("fence", StartAt::Earliest(), old_reads.OnMessage(), old_reads.Options())
              .ok());
  REQUIRE(WaitFor([&] { return !old_reads.Failure().ok(); }));
  CHECK(old_reads.Failure().code() == StatusCode::kPermissionDenied);
  CHECK(old_reads.Failure().message().find("fenced") != std::string::npos);
  // The old process reads the fence once: a client it makes now is still the old launch's.
  CHECK((*BusClient::ForAgent(env))->Publish("fence", "x").status().code() ==
        StatusCode::kPermissionDenied);

  BusClientOptions successor;  // the new launch's process (it read 1.new at its start)
  successor.incarnation = "1.new";
  auto new_launch = BusClient::ForAgent(env, successor);
  REQUIRE(new_launch.ok());
  auto ack = (*new_launch)->Publish("fence", "from the new launch");
  REQUIRE(ack.ok());
  CHECK(ack->offset == 1);  // nothing of the old launch was stored after the relaunch
  // A client that is no agent's launch (agentrt-bus, a tool) presents none and is not fenced.
  CHECK(Client(server->address(), "pub")->Publish("fence", "a tool").ok());
  std::filesystem::remove_all(dir);
}

TEST_CASE("TLS and mutual TLS from certificate files") {
  if (std::system("command -v openssl >/dev/null 2>&1") != 0) {
    WARN("openssl is not installed; TLS test skipped");
    return;
  }
  auto dir = TempDir();
  const std::string d = dir.string();
  const std::string script = "set -e; cd " + d +
                             ";"
                             "openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.pem "
                             "-days 1 -subj /CN=agentrt-test-ca 2>/dev/null;"
                             "openssl req -newkey rsa:2048 -nodes -keyout server.key -out "
                             "server.csr -subj /CN=localhost 2>/dev/null;"
                             "printf 'subjectAltName=DNS:localhost,IP:127.0.0.1' > san.ext;"
                             "openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key "
                             "-CAcreateserial -out server.pem -days 1 -extfile san.ext 2>/dev/null;"
                             "openssl req -newkey rsa:2048 -nodes -keyout client.key -out "
                             "client.csr -subj /CN=pub 2>/dev/null;"
                             "openssl x509 -req -in client.csr -CA ca.pem -CAkey ca.key "
                             "-CAcreateserial -out client.pem -days 1 2>/dev/null";
  REQUIRE(std::system(("bash -c \"" + script + "\"").c_str()) == 0);

  BusServerOptions opts;
  opts.tls_cert_file = d + "/server.pem";
  opts.tls_key_file = d + "/server.key";
  SECTION("server TLS") {
    auto server = StartServer(opts);
    BusClientOptions tls;
    tls.tls_ca_file = d + "/ca.pem";
    tls.call_timeout = 5s;
    auto good = Client("localhost:" + std::to_string(server->port()), "pub", tls);
    CHECK(good->Publish("ttls", "secret stuff").ok());
    BusClientOptions plain;
    plain.call_timeout = 2s;
    auto bad = Client(server->address(), "pub", plain);
    CHECK_FALSE(bad->Publish("ttls", "x").ok());
  }
  SECTION("mutual TLS refuses a client without a certificate") {
    opts.tls_client_ca_file = d + "/ca.pem";
    auto server = StartServer(opts);
    BusClientOptions mtls;
    mtls.tls_ca_file = d + "/ca.pem";
    mtls.tls_cert_file = d + "/client.pem";
    mtls.tls_key_file = d + "/client.key";
    auto good = Client("localhost:" + std::to_string(server->port()), "pub", mtls);
    CHECK(good->Publish("ttls", "x").ok());
    BusClientOptions no_cert;
    no_cert.tls_ca_file = d + "/ca.pem";
    no_cert.call_timeout = 2s;
    auto bad = Client("localhost:" + std::to_string(server->port()), "pub", no_cert);
    CHECK_FALSE(bad->Publish("ttls", "x").ok());
  }
  std::filesystem::remove_all(dir);
}

// agentrt-bus of this build started with `args`, its stderr into `stderr_path`
// when given; returns its pid, and its address once it wrote `address_file`.
std::pair<pid_t, std::string> SpawnBroker(const std::vector<std::string>& args,
                                          const std::string& address_file,
                                          const std::string& stderr_path = "") {
  const std::string bin = testing::ProgramPath("agentrt-bus");
  std::vector<std::string> words{bin};
  words.insert(words.end(), args.begin(), args.end());
  words.insert(words.end(), {"--host", "127.0.0.1", "--port", "0", "--address-file", address_file});
  std::vector<char*> argv;
  for (std::string& w : words) argv.push_back(w.data());
  argv.push_back(nullptr);
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    if (!stderr_path.empty()) {
      const int fd = ::open(stderr_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
      if (fd < 0 || ::dup2(fd, STDERR_FILENO) < 0) ::_exit(126);
    }
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  if (!WaitFor([&] { return std::filesystem::exists(address_file); }, 30s)) {
    ::kill(pid, SIGKILL);
    ::waitpid(pid, nullptr, 0);
    FAIL("agentrt-bus wrote no address file within 30 s");
  }
  std::string address;
  std::ifstream(address_file) >> address;
  return {pid, address};
}

// Kills a broker of SpawnBroker (stopped with SIGSTOP or not) at the end of
// a test, however it ends.
struct StoppedBrokerReaper {
  pid_t pid;
  ~StoppedBrokerReaper() {
    ::kill(pid, SIGCONT);
    ::kill(pid, SIGKILL);
    ::waitpid(pid, nullptr, 0);
  }
};

// SIGTERM to a broker of SpawnBroker: true when it exited 0 within 20 s
// (else it is killed).
bool StopBroker(pid_t pid) {
  ::kill(pid, SIGTERM);
  int status = 0;
  if (!WaitFor([&] { return ::waitpid(pid, &status, WNOHANG) == pid; }, 20s)) {
    ::kill(pid, SIGKILL);
    ::waitpid(pid, &status, 0);
    return false;
  }
  return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

// In `dir`: the plan.json of a predator-0 publishing "sightings" to prey-0,
// and the run secret; the agentrt-bus arguments that serve them.
std::vector<std::string> PredatorPreyBrokerArgs(const std::filesystem::path& dir) {
  const std::string plan = (dir / "plan.json").string(), secret = (dir / "bus.secret").string();
  REQUIRE(WritePlanFile(testing::TestPlan("t", std::vector<std::string>{"predator-0", "prey-0"},
                                          {{"sightings", {"predator-0"}, {"prey-0"}}}),
                        plan)
              .ok());
  REQUIRE(WriteFileAtomic(secret, kSecret, {.mode = 0600}).ok());
  return {"--plan", plan, "--secret-file", secret};
}

TEST_CASE("agentrt-bus serves the plan's ACL, writes its address file and stops on SIGTERM") {
  auto dir = TempDir();
  const std::string address_file = (dir / "bus.address").string();
  const auto [pid, address] = SpawnBroker(PredatorPreyBrokerArgs(dir), address_file);
  CHECK(address.rfind("127.0.0.1:", 0) == 0);
  {
    auto predator = Client(address, "predator-0");
    auto prey = Client(address, "prey-0");
    REQUIRE(predator->Publish("sightings", "prey at (3,4)").ok());
    CHECK(prey->Publish("sightings", "no").status().code() == StatusCode::kPermissionDenied);
    auto got = prey->Fetch("sightings", 0, 10, 10s);
    REQUIRE(got.ok());
    REQUIRE(got->size() == 1);
    CHECK((*got)[0].publisher() == "predator-0");
  }
  CHECK(StopBroker(pid));
  CHECK_FALSE(std::filesystem::exists(address_file));
  std::filesystem::remove_all(dir);
}

TEST_CASE(
    "agentrt-bus --plan refuses a replaced launch as soon as its successor's fence is there") {
  auto dir = TempDir();
  const std::string address_file = (dir / "bus.address").string(),
                    log = (dir / "bus.stderr").string();
  const std::string ckpt = (dir / "checkpoints" / "predator-0").string();  // the plan's
  std::filesystem::create_directories(ckpt);
  REQUIRE(WriteCheckpointFence(ckpt, "0.old").ok());
  const auto [pid, address] = SpawnBroker(PredatorPreyBrokerArgs(dir), address_file, log);
  BusClientOptions old_options;
  old_options.incarnation = "0.old";
  auto old_launch = Client(address, "predator-0", old_options);
  REQUIRE(old_launch->Publish("sightings", "from the first launch").ok());
  // The controller relaunches the agent: its fence names the new launch,
  // which has not called yet. The broker sees the fence as it is written.
  REQUIRE(WriteCheckpointFence(ckpt, "1.new").ok());
  auto said = [&] {
    auto text = ReadWholeFile(log, 1 << 20);
    return text.ok() &&
           text->find("agent predator-0: launch 1.new is current (its fence)") != std::string::npos;
  };
  CHECK(WaitFor(said, 10s));
  auto refused = old_launch->Publish("sightings", "from the replaced launch");
  REQUIRE_FALSE(refused.ok());
  CHECK(refused.status().code() == StatusCode::kPermissionDenied);
  CHECK(refused.status().message().find("launch 0.old of agent predator-0 was replaced by launch "
                                        "1.new") != std::string::npos);
  CHECK(StopBroker(pid));
  std::filesystem::remove_all(dir);
}

TEST_CASE(
    "a stalled subscriber does not slow publishers; it learns what it missed when it catches up") {
  BusServerOptions opts;
  opts.broker.retention_messages = 1000;
  auto server = StartServer(opts);
  auto pub = Client(server->address(), "pub");
  auto sub = Client(server->address(), "sub");
  std::atomic<bool> stalled{true};
  std::atomic<int> received{0};
  Collector c;
  auto on_event = c.Options(/*skip_expired=*/true);
  REQUIRE(sub->Subscribe(
                 "tslow", StartAt::Earliest(),
                 [&](const BusMessage&) {
                   received++;
                   const auto until = std::chrono::steady_clock::now() + 60s;  // bounded
                   while (stalled.load() && std::chrono::steady_clock::now() < until) {
                     std::this_thread::sleep_for(1ms);
                   }
                 },
                 on_event)
              .ok());
  REQUIRE(pub->Publish("tslow", std::string(1024, 'x')).ok());
  REQUIRE(WaitFor([&] { return received.load() == 1; }));
  // The subscriber holds its first message; 20,000 x 1 KiB more must still go through.
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < 20000; ++i) pub->PublishAsync("tslow", std::string(1024, 'x'));
  REQUIRE(pub->Flush(30s).ok());
  CHECK(std::chrono::steady_clock::now() - t0 < 30s);
  auto topics = pub->Stats();
  REQUIRE(topics.ok());
  CHECK(topics->messages_published == 20001);
  CHECK(topics->messages_expired == 20001 - 1000);
  stalled = false;
  REQUIRE(WaitFor([&] { return c.HasEvent(SubscriptionEvent::Kind::kOffsetExpired); }));
  REQUIRE(WaitFor([&] { return sub->SubscriptionOffsets()["tslow"] == 20001; }));
}

TEST_CASE(
    "an async publish the broker refuses fails alone; the ones around it are stored in order") {
  auto server = StartServer();
  auto pub = Client(server->address(), "pub");
  std::mutex mu;
  std::vector<std::pair<int, StatusCode>> acks;
  auto ack_for = [&](int i) {
    return [&, i](const Result<PublishAck>& r) {
      std::lock_guard<std::mutex> l(mu);
      acks.emplace_back(i, r.ok() ? StatusCode::kOk : r.status().code());
    };
  };
  for (int i = 0; i < 10; ++i) pub->PublishAsync("tasync", std::to_string(i), {}, ack_for(i));
  pub->PublishAsync("private", "not mine", {}, ack_for(10));  // pub may not publish here
  for (int i = 11; i < 20; ++i) pub->PublishAsync("tasync", std::to_string(i - 1), {}, ack_for(i));
  Status flushed = pub->Flush(30s);
  CHECK(flushed.code() == StatusCode::kPermissionDenied);
  CHECK(pub->Flush(1s).ok());  // the error is reported once
  {
    std::lock_guard<std::mutex> l(mu);
    REQUIRE(acks.size() == 20);
    for (int i = 0; i < 20; ++i) {
      CHECK(acks[i].first == i);  // callbacks in queue order
      CHECK(acks[i].second == (i == 10 ? StatusCode::kPermissionDenied : StatusCode::kOk));
    }
  }
  auto sub = Client(server->address(), "sub");
  auto got = sub->Fetch("tasync", 0, 100, 10s);
  REQUIRE(got.ok());
  CheckExactSequence(*got, 19);
}

TEST_CASE("async publishes queued while the broker is down are delivered once it is back") {
  auto server = StartServer();
  const int port = server->port();
  const std::string address = server->address();
  auto pub = Client(address, "pub");
  REQUIRE(pub->Publish("tdown", "warm-up").ok());
  server->Shutdown();
  server.reset();
  for (int i = 0; i < 1000; ++i) pub->PublishAsync("tdown", std::to_string(i));
  std::this_thread::sleep_for(300ms);  // how long the broker stays down
  BusServerOptions opts;
  opts.host = "127.0.0.1";
  opts.port = port;
  for (int attempt = 0; attempt < 50 && !server; ++attempt) {
    auto s = BusServer::Start(opts, kSecret, TestAcl());
    if (s.ok())
      server = std::move(s).value();
    else
      std::this_thread::sleep_for(100ms);
  }
  REQUIRE(server);
  REQUIRE(pub->Flush(30s).ok());
  auto sub = Client(address, "sub");
  auto got = sub->Fetch("tdown", 0, 2000, 10s);
  REQUIRE(got.ok());
  CheckExactSequence(*got, 1000);
}

TEST_CASE(
    "keepalive notices a broker that stopped answering; the subscription resumes when it answers "
    "again") {
  auto dir = TempDir();
  const std::string secret = (dir / "bus.secret").string(),
                    address_file = (dir / "bus.address").string();
  REQUIRE(WriteFileAtomic(secret, kSecret, {.mode = 0600}).ok());
  const auto [pid, address] = SpawnBroker({"--open", "--secret-file", secret}, address_file);
  const StoppedBrokerReaper reaper{pid};

  BusClientOptions fast;
  fast.keepalive_time_ms = 1000;
  fast.keepalive_timeout_ms = 1000;
  auto sub = Client(address, "sub", fast);
  auto pub = Client(address, "pub");
  Collector c;
  REQUIRE(sub->Subscribe("tkeepalive", StartAt::Earliest(), c.OnMessage(), c.Options()).ok());
  REQUIRE(pub->Publish("tkeepalive", "0").ok());
  REQUIRE(WaitFor([&] { return c.size() == 1; }));

  REQUIRE(::kill(pid, SIGSTOP) == 0);  // the broker hangs: no FIN, no RST, just silence
  CHECK(WaitFor([&] { return c.HasEvent(SubscriptionEvent::Kind::kReconnecting); }, 30s));
  REQUIRE(::kill(pid, SIGCONT) == 0);
  REQUIRE(pub->Publish("tkeepalive", "1").ok());
  REQUIRE(WaitFor([&] { return c.size() == 2; }));
  CheckExactSequence(c.msgs, 2);
  std::filesystem::remove_all(dir);
}

TEST_CASE(
    "an async publisher keeps at most 64 spool files waiting; the next waits for room up to "
    "call_timeout, then goes inline") {
  auto dir = TempDir();
  const std::string secret = (dir / "bus.secret").string(),
                    address_file = (dir / "bus.address").string();
  REQUIRE(WriteFileAtomic(secret, kSecret, {.mode = 0600}).ok());
  // The broker's spill folder (its spool in it) under `dir`: its temp folder.
  const char* tmpdir = std::getenv("TMPDIR");
  const std::string saved = tmpdir != nullptr ? tmpdir : "";
  ::setenv("TMPDIR", dir.c_str(), 1);
  const auto [pid, address] = SpawnBroker({"--open", "--secret-file", secret}, address_file);
  if (tmpdir != nullptr) {
    ::setenv("TMPDIR", saved.c_str(), 1);
  } else {
    ::unsetenv("TMPDIR");
  }
  const StoppedBrokerReaper reaper{pid};
  auto waiting = [&dir] {
    int n = 0;
    std::error_code ec;
    for (const auto& e : std::filesystem::recursive_directory_iterator(dir, ec))
      n += e.path().extension() == ".part" ? 1 : 0;
    return n;
  };

  const std::string payload(256 << 10, 'w');  // spooled: at least 256 KiB
  auto stop_broker = [pid = pid] {
    REQUIRE(::kill(pid, SIGSTOP) == 0);  // nothing is answered from here on
    REQUIRE(WaitFor([pid] {              // every thread of it stopped ("T" in /proc/<pid>/stat)
      std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
      std::string line;
      std::getline(stat, line);
      const size_t paren = line.rfind(')');
      return paren != std::string::npos && line.compare(paren + 2, 1, "T") == 0;
    }));
  };
  auto adopted = [](BusClient& client) {
    auto stats = client.Stats();
    REQUIRE(stats.ok());
    return stats->large_adopted;
  };

  auto pub = Client(address, "pub");
  pub->PublishAsync("tcap", payload);  // the first asks for the spool
  REQUIRE(pub->Flush(30s).ok());
  REQUIRE(adopted(*pub) == 1);
  stop_broker();
  // 64 files fill the room (each counts 2 MiB of its 128); the 65th waits.
  std::atomic<int> returned{0};
  std::jthread publisher([&] {  // joined on the way out, should a REQUIRE fail
    for (int i = 0; i < 65; ++i) {
      pub->PublishAsync("tcap", payload);
      ++returned;
    }
  });
  REQUIRE(WaitFor([&] { return returned == 64; }));
  CHECK(waiting() == 64);
  std::this_thread::sleep_for(300ms);  // call_timeout is 10 s: still waiting
  CHECK(returned == 64);
  REQUIRE(::kill(pid, SIGCONT) == 0);  // answers free room: the 65th goes spooled too
  publisher.join();
  REQUIRE(pub->Flush(60s).ok());
  CHECK(waiting() == 0);
  CHECK(adopted(*pub) == 66);  // none inline

  // A publisher whose call_timeout passes without room sends inline.
  BusClientOptions brief;
  brief.call_timeout = 200ms;
  auto hurried = Client(address, "pub", brief);
  hurried->PublishAsync("tcap", payload);
  REQUIRE(hurried->Flush(30s).ok());
  REQUIRE(adopted(*pub) == 67);
  stop_broker();
  for (int i = 0; i < 66; ++i) hurried->PublishAsync("tcap", payload);
  CHECK(waiting() == 64);  // the last two inline, each after its 200 ms
  REQUIRE(::kill(pid, SIGCONT) == 0);
  REQUIRE(hurried->Flush(60s).ok());
  CHECK(waiting() == 0);
  CHECK(adopted(*pub) == 67 + 64);

  // A PublishAsync from an ack callback does not wait for room: the thread
  // running the callback is the one whose answers free it. The first answer
  // frees its batch's room only (async_batch_bytes, 4 MiB: 16 of these
  // payloads); the callback's 64 outrun it and the rest go inline at once
  // (waiting, each would take call_timeout, 20 s here).
  BusClientOptions patient;
  patient.call_timeout = 20s;
  auto chained = Client(address, "pub", patient);
  chained->PublishAsync("tcap", payload);
  REQUIRE(chained->Flush(30s).ok());
  stop_broker();
  std::atomic<int> from_callback{0};
  chained->PublishAsync("tcap", payload, {}, [&](const Result<PublishAck>&) {
    for (int i = 0; i < 64; ++i) {
      chained->PublishAsync("tcap", payload);
      ++from_callback;
    }
  });
  for (int i = 1; i < 64; ++i) chained->PublishAsync("tcap", payload);
  REQUIRE(::kill(pid, SIGCONT) == 0);
  CHECK(chained->Flush(15s).ok());
  CHECK(from_callback == 64);
  const int64_t spooled = adopted(*pub) - (67 + 64 + 1 + 64);
  CHECK(spooled > 0);   // those that found room
  CHECK(spooled < 64);  // not all of them: the others went inline

  auto sub = Client(address, "sub");
  Collector c;
  REQUIRE(sub->Subscribe("tcap", StartAt::Earliest(), c.OnMessage(), c.Options()).ok());
  REQUIRE(WaitFor([&] { return c.size() == 1 + 65 + 1 + 66 + 1 + 64 + 64; }, 30s));
  std::lock_guard<std::mutex> l(c.mu);
  for (const auto& m : c.msgs) CHECK(m.payload() == payload);
}
