// Large messages on the real broker and client over gRPC on loopback: chunked
// publish and delivery (whole or not at all), duplicates, refusals (size, CRC,
// a cut stream), the durable log's payload files across a restart and under
// retention, and recovery refusing a log whose payload file is gone.
#include <fcntl.h>
#include <grpcpp/grpcpp.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "common/crc32c.h"
#include "comms/auth.h"
#include "comms/bus_client.h"
#include "comms/bus_log.h"
#include "comms/bus_server.h"
#include "comms/bus_validate.h"
#include "comms/proto/bus.grpc.pb.h"
#include "tests/common/temp_dir.h"
#include "tests/common/wait_for.h"
#include "tests/comms/bus_test_util.h"

using namespace agentrt;
namespace v1 = agentrt::bus::v1;
namespace fs = std::filesystem;
using namespace std::chrono_literals;
using agentrt::testing::WaitFor;

namespace {

constexpr char kSecret[] = "large-test-secret-0123456789abcdef";

BusAcl TestAcl() {
  BusAcl acl;
  acl.agents = {"pub", "sub", "sub2"};
  acl.channels = {{"t*", {"pub"}, {"sub", "sub2"}}};
  return acl;
}

BusServerOptions Options(const std::string& log_dir = "",
                         BusDurability durability = BusDurability::kMemory) {
  BusServerOptions o;
  o.host = "127.0.0.1";
  o.broker.limits.max_message_bytes = 256 << 20;
  o.broker.log_dir = log_dir;
  o.broker.durability = durability;
  return o;
}

std::unique_ptr<BusServer> Start(const BusServerOptions& opts) {
  return agentrt::testing::StartBus(opts, kSecret, TestAcl());
}

std::unique_ptr<BusClient> Client(const std::string& address, const std::string& agent,
                                  bool read_local_files = false) {
  BusClientOptions o;
  o.read_local_files = read_local_files;
  return agentrt::testing::ConnectBus(address, kSecret, agent, o);
}

std::string RandomBytes(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::string s(n, '\0');
  for (size_t i = 0; i + 8 <= n; i += 8) {
    const uint64_t v = rng();
    std::memcpy(s.data() + i, &v, 8);
  }
  return s;
}

struct Collector {
  std::mutex mu;
  std::vector<BusMessage> msgs;
  std::vector<std::string> reconnect_reasons;
  std::atomic<int> reconnects{0};
  MessageCallback OnMessage() {
    return [this](const BusMessage& m) {
      std::lock_guard<std::mutex> l(mu);
      msgs.push_back(m);
    };
  }
  SubscribeOptions Events() {
    SubscribeOptions o;
    o.on_event = [this](const SubscriptionEvent& e) {
      if (e.kind != SubscriptionEvent::Kind::kReconnecting) return;
      ++reconnects;
      std::lock_guard<std::mutex> l(mu);
      reconnect_reasons.push_back(e.status.message());
    };
    return o;
  }
  size_t size() {
    std::lock_guard<std::mutex> l(mu);
    return msgs.size();
  }
};

int CountFiles(const std::string& dir, const std::string& ext) {
  int n = 0;
  std::error_code ec;
  for (const auto& e : fs::recursive_directory_iterator(dir, ec)) {
    if (e.path().extension() == ext) ++n;
  }
  return n;
}

// A raw PublishLarge stream (what a client of bus.proto in another language sends).
grpc::Status RawLarge(BusServer& server, const std::string& payload, uint32_t crc, size_t send,
                      v1::PublishResponse* resp, int64_t announced = -1) {
  auto stub =
      v1::Bus::NewStub(grpc::CreateChannel(server.address(), grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + 20s);
  ctx.AddMetadata("x-agentrt-agent", "pub");
  ctx.AddMetadata("x-agentrt-token", DeriveAgentToken(kSecret, "pub"));
  auto writer = stub->PublishLarge(&ctx, resp);
  v1::PublishChunk chunk;
  chunk.mutable_head()->set_topic("tlarge");
  chunk.set_size(announced >= 0 ? announced : static_cast<int64_t>(payload.size()));
  chunk.set_crc32c(crc);
  size_t pos = 0;
  do {  // the head goes even with no data
    chunk.set_data(payload.substr(pos, std::min<size_t>(kChunkBytes, send - pos)));
    if (!writer->Write(chunk)) break;
    chunk.clear_head();
    pos += kChunkBytes;
  } while (pos < send);
  writer->WritesDone();
  return writer->Finish();
}

}  // namespace

TEST_CASE("a large message arrives whole and in order between small ones, to every subscriber") {
  // sub reads the payload from the broker's file (same node), sub2 has it streamed.
  auto server = Start(Options());
  auto pub = Client(server->address(), "pub");
  const std::string big = RandomBytes(20 << 20, 1);
  Collector a, b;
  auto sub_a = Client(server->address(), "sub", /*read_local_files=*/true);
  auto sub_b = Client(server->address(), "sub2");
  REQUIRE(sub_a->Subscribe("tlarge", StartAt::Earliest(), a.OnMessage(), a.Events()).ok());
  REQUIRE(sub_b->Subscribe("tlarge", StartAt::Earliest(), b.OnMessage()).ok());
  REQUIRE(pub->Publish("tlarge", "before").ok());
  PublishOptions policy;
  policy.content_type = "application/x-policy";
  auto ack = pub->Publish("tlarge", big, policy);
  INFO(ack.status().ToString());
  REQUIRE(ack.ok());
  CHECK(ack->offset == 1);
  REQUIRE(pub->Publish("tlarge", "after").ok());
  for (Collector* c : {&a, &b}) {
    REQUIRE(WaitFor([&] { return c->size() == 3; }, 30s));
    std::lock_guard<std::mutex> l(c->mu);
    CHECK(c->msgs[0].payload() == "before");
    CHECK(c->msgs[1].offset() == 1);
    CHECK(c->msgs[1].payload().size() == big.size());
    CHECK(c->msgs[1].payload() == big);
    CHECK(c->msgs[1].content_type() == "application/x-policy");
    CHECK(c->msgs[1].publisher() == "pub");
    CHECK(c->msgs[1].chunked_size() == 0);  // delivered as an ordinary, whole message
    CHECK(c->msgs[2].payload() == "after");
    CHECK(c->msgs[2].offset() == 2);
  }
  CHECK(a.reconnects.load() == 0);  // sub read the file itself: no fall-back to streaming
  auto fetched = sub_a->Fetch("tlarge", 1, 1, 10s);
  REQUIRE(fetched.ok());
  REQUIRE(fetched->size() == 1);
  CHECK((*fetched)[0].payload() == big);
  // Retained once: the stats count its bytes once, not once per subscriber.
  CHECK(server->Stats().retained_bytes == static_cast<int64_t>(big.size() + 11));
}

TEST_CASE("a stream cut in the middle of a large message delivers it once, whole") {
  auto server = Start(Options());
  auto pub = Client(server->address(), "pub");
  std::vector<std::string> bigs;
  for (int i = 0; i < 3; ++i) bigs.push_back(RandomBytes(24 << 20, 10 + i));
  for (const auto& p : bigs) REQUIRE(pub->Publish("tlarge", p).ok());
  Collector c;
  auto sub = Client(server->address(), "sub");
  REQUIRE(sub->Subscribe("tlarge", StartAt::Earliest(), c.OnMessage(), c.Events()).ok());
  // Close every stream again and again while the 72 MiB flow: each break
  // comes between chunks or between messages, and the reader resumes at the
  // message it had not finished.
  for (int closes = 0; c.size() < 3 && closes < 40; ++closes) {
    std::this_thread::sleep_for(5ms);
    server->CloseStreams();
  }
  REQUIRE(WaitFor([&] { return c.size() >= 3; }, 60s));
  std::this_thread::sleep_for(100ms);  // a duplicate would arrive now
  std::lock_guard<std::mutex> l(c.mu);
  REQUIRE(c.msgs.size() == 3);
  for (int i = 0; i < 3; ++i) {
    CHECK(c.msgs[i].offset() == i);
    CHECK(c.msgs[i].payload() == bigs[i]);
  }
  CHECK(c.reconnects.load() >= 1);
}

TEST_CASE("a reader that cannot open the broker's file (another node) has the payload streamed") {
  const agentrt::testing::TempDir tmp("agentrt-large");
  auto server = Start(Options(tmp.path, BusDurability::kBatch));
  const std::string big = RandomBytes(8 << 20, 5);
  REQUIRE(Client(server->address(), "pub")->Publish("tlarge", big).ok());
  // The broker keeps its file open; under this name it is not found "here".
  for (const auto& e : fs::directory_iterator(tmp.path + "/logs/tlarge")) {
    if (e.path().extension() == ".blob") fs::rename(e.path(), e.path().string() + ".elsewhere");
  }
  Collector c;
  auto sub = Client(server->address(), "sub", /*read_local_files=*/true);
  REQUIRE(sub->Subscribe("tlarge", StartAt::Earliest(), c.OnMessage(), c.Events()).ok());
  REQUIRE(WaitFor([&] { return c.size() == 1; }, 30s));
  std::lock_guard<std::mutex> l(c.mu);
  CHECK(c.msgs[0].payload() == big);
  CHECK(c.msgs[0].chunked_path().empty());
  REQUIRE(c.reconnect_reasons.size() == 1);  // once: the subscription streams from then on
  CHECK_THAT(c.reconnect_reasons[0],
             Catch::Contains("reading a large message's file on this node"));
}

TEST_CASE(
    "memory mode: payload files in the spill folder, named while retained, gone with the broker") {
  const agentrt::testing::TempDir tmp("agentrt-large");
  BusServerOptions opts = Options(tmp.path, BusDurability::kMemory);
  opts.broker.retention_messages = 1;
  const std::string spill = tmp.path + "/spill";
  {
    auto server = Start(opts);
    auto pub = Client(server->address(), "pub");
    REQUIRE(pub->Publish("tlarge", RandomBytes(5 << 20, 6)).ok());
    CHECK(CountFiles(spill, ".blob") == 1);
    REQUIRE(pub->Publish("tlarge", RandomBytes(5 << 20, 7)).ok());
    CHECK(CountFiles(spill, ".blob") == 1);  // retention removed the first one's name at once
    auto got = Client(server->address(), "sub")->Fetch("tlarge", 1, 1, 10s);
    REQUIRE(got.ok());
    REQUIRE(got->size() == 1);
    CHECK((*got)[0].payload() == RandomBytes(5 << 20, 7));
  }
  CHECK(fs::exists(spill));
  CHECK(CountFiles(spill, ".blob") == 0);
}

TEST_CASE("a retried large publish is stored once; refusals store nothing and leave no file") {
  const agentrt::testing::TempDir tmp("agentrt-large");
  const std::string& dir = tmp.path;
  auto server = Start(Options(dir, BusDurability::kAlways));
  auto pub = Client(server->address(), "pub");
  const std::string big = RandomBytes(6 << 20, 2);
  PublishOptions seven;
  seven.sequence = 7;
  auto first = pub->Publish("tlarge", big, seven);
  REQUIRE(first.ok());
  auto again = pub->Publish("tlarge", big, seven);
  REQUIRE(again.ok());
  CHECK(again->duplicate);
  CHECK(again->offset == first->offset);
  CHECK(CountFiles(dir, ".blob") == 1);

  v1::PublishResponse resp;
  // The CRC does not match the bytes: DATA_LOSS, not stored.
  auto bad_crc = RawLarge(*server, big, Crc32c(big.data(), big.size()) ^ 1, big.size(), &resp);
  CHECK(bad_crc.error_code() == grpc::StatusCode::DATA_LOSS);
  CHECK(bad_crc.error_message().find("CRC32C") != std::string::npos);
  // The stream ends early: INVALID_ARGUMENT naming how far it got.
  auto cut = RawLarge(*server, big, Crc32c(big.data(), big.size()), 2 << 20, &resp);
  CHECK(cut.error_code() == grpc::StatusCode::INVALID_ARGUMENT);
  CHECK(cut.error_message().find("after 2097152 of its 6291456 bytes") != std::string::npos);
  // More than max_message_bytes: refused before a byte is read.
  auto over = RawLarge(*server, big, 0, 0, &resp, int64_t{300} << 20);
  CHECK(over.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED);
  CHECK(over.error_message().find("314572800 bytes") != std::string::npos);
  auto too_big = pub->Publish("tlarge", std::string((256 << 20) + 1, 'x'));
  CHECK(too_big.status().code() == StatusCode::kResourceExhausted);

  CHECK(CountFiles(dir, ".blob") == 1);  // only the stored one
  auto topics = Client(server->address(), "sub")->ListTopics();
  REQUIRE(topics.ok());
  REQUIRE(topics->size() == 1);
  CHECK((*topics)[0].end_offset() == 1);
  // Direct messages are one call each: at most 4 MiB, said before sending.
  auto send = pub->Send("sub", std::string(kMaxInlineBytes + 1, 'x'));
  CHECK(send.status().code() == StatusCode::kResourceExhausted);
  CHECK(send.status().message().find("publish it to a topic") != std::string::npos);
}

TEST_CASE("large payloads of a durable log survive a restart; retention removes their files") {
  const agentrt::testing::TempDir tmp("agentrt-large");
  const std::string& dir = tmp.path;
  BusServerOptions opts = Options(dir, BusDurability::kBatch);
  opts.broker.retention_messages = 3;
  std::vector<std::string> bigs;
  uint64_t incarnation = 0;
  {
    auto server = Start(opts);
    incarnation = server->incarnation();
    auto pub = Client(server->address(), "pub");
    for (int i = 0; i < 5; ++i) {
      bigs.push_back(RandomBytes(5 << 20, 20 + i));
      REQUIRE(pub->Publish("tlarge", bigs.back()).ok());
    }
    // Offsets 2, 3, 4 are retained: two payload files went with offsets 0 and 1.
    CHECK(CountFiles(dir, ".blob") == 3);
  }
  auto server = Start(opts);
  CHECK(server->incarnation() == incarnation);
  auto sub = Client(server->address(), "sub");
  auto got = sub->Fetch("tlarge", 2, 3, 10s);
  REQUIRE(got.ok());
  REQUIRE(got->size() == 1);  // a large message comes alone
  CHECK((*got)[0].offset() == 2);
  CHECK((*got)[0].payload() == bigs[2]);
  Collector c;
  REQUIRE(sub->Subscribe("tlarge", StartAt::Offset(3, incarnation), c.OnMessage()).ok());
  REQUIRE(WaitFor([&] { return c.size() == 2; }, 30s));
  std::lock_guard<std::mutex> l(c.mu);
  CHECK(c.msgs[0].payload() == bigs[3]);
  CHECK(c.msgs[1].payload() == bigs[4]);
}

TEST_CASE("recovery refuses a log whose payload file is gone or short, and removes unnamed ones") {
  const agentrt::testing::TempDir tmp("agentrt-large");
  const std::string& dir = tmp.path;
  BusServerOptions opts = Options(dir, BusDurability::kAlways);
  {
    auto server = Start(opts);
    auto pub = Client(server->address(), "pub");
    REQUIRE(pub->Publish("tlarge", RandomBytes(5 << 20, 3)).ok());
    REQUIRE(pub->Publish("tlarge", RandomBytes(6 << 20, 4)).ok());
  }
  const std::string topic_dir = dir + "/logs/tlarge";
  std::string first, second;  // the payload files of offsets 0 and 1 (told apart by size)
  for (const auto& e : fs::directory_iterator(topic_dir)) {
    if (e.path().extension() != ".blob") continue;
    (fs::file_size(e.path()) == (5u << 20) ? first : second) = e.path().string();
  }
  REQUIRE_FALSE(first.empty());
  REQUIRE_FALSE(second.empty());
  // A publish the crash cut short leaves a file no record names: removed, and said.
  const std::string stray = topic_dir + "/00000000000000ff.blob";
  { std::ofstream(stray) << "half a payload"; }
  {
    auto server = BusServer::Start(opts, kSecret, TestAcl());
    REQUIRE(server.ok());
    CHECK_FALSE(fs::exists(stray));
    bool said = false;
    for (const auto& n : (*server)->recovery_notes())
      said = said || n.find("removed 1 payload file") != std::string::npos;
    CHECK(said);
  }
  auto refused = [&] {
    auto s = BusServer::Start(opts, kSecret, TestAcl());
    REQUIRE_FALSE(s.ok());
    CHECK(s.status().code() == StatusCode::kDataLoss);
    CHECK_THAT(s.status().message(), Catch::Contains(second));
    CHECK_THAT(s.status().message(), Catch::Contains("offset 1"));
    return s.status().message();
  };
  fs::resize_file(second, 1000);
  CHECK_THAT(refused(), Catch::Contains("1000 of its 6291456 bytes"));
  fs::remove(second);  // gone after a present one: not retention's doing
  CHECK_THAT(refused(), Catch::Contains("No such file"));
  // Both gone: retention removes files from the oldest on, so this reads as
  // both messages expired (readers are told OFFSET_EXPIRED, never a gap).
  fs::remove(first);
  auto server = Start(opts);
  auto topics = Client(server->address(), "sub")->ListTopics();
  REQUIRE(topics.ok());
  REQUIRE(topics->size() == 1);
  CHECK((*topics)[0].earliest_offset() == 2);
  CHECK((*topics)[0].end_offset() == 2);
}

TEST_CASE("a memory broker without a log folder sweeps the spill folders of brokers that died") {
  const agentrt::testing::TempDir tmp("agentrt-spill");
  auto make = [&](const std::string& name) {
    const std::string dir = tmp.Path(name);
    fs::create_directories(dir + "/incoming");
    ::chmod(dir.c_str(), 0700);
    tmp.Write(name + "/.lock", "");
    return dir;
  };
  const std::string dead = make("agentrt-bus-spill.dead00");  // its broker was killed -9
  const std::string live = make("agentrt-bus-spill.live00");  // its broker still runs
  const int held = ::open((live + "/.lock").c_str(), O_RDONLY | O_CLOEXEC);
  REQUIRE(held >= 0);
  REQUIRE(::flock(held, LOCK_SH) == 0);
  BusServerOptions opts = Options();
  opts.broker.spill_root = tmp.path;
  std::string own;
  {
    auto server = Start(opts);
    CHECK_FALSE(fs::exists(dead));
    CHECK(fs::exists(live));
    for (const auto& e : fs::directory_iterator(tmp.path)) {
      if (e.path().filename().string().starts_with("agentrt-bus-spill.") && e.path() != live)
        own = e.path().string();
    }
    REQUIRE_FALSE(own.empty());
    // A large payload goes there; a second broker leaves the folder of the
    // first, which holds it, alone.
    auto pub = Client(server->address(), "pub");
    REQUIRE(pub->Publish("tlarge", RandomBytes(5 << 20, 9)).ok());
    auto second = Start(opts);
    CHECK(fs::exists(own));
    bool payload = false;
    for (const auto& e : fs::recursive_directory_iterator(own))
      payload = payload || (e.is_regular_file() && fs::file_size(e.path()) == (5u << 20));
    CHECK(payload);
  }
  CHECK_FALSE(fs::exists(own));  // removed on the way out
  CHECK(fs::exists(live));
  ::close(held);
}

namespace {

int SpoolFiles(const std::string& root) { return CountFiles(root, ".part"); }

// One PublishStream request of `entries` from agent `agent`, raw (what a
// client of bus.proto in another language sends): the stream's final status.
grpc::Status RawBatch(BusServer& server, const std::string& agent,
                      const std::vector<v1::PublishRequest>& entries) {
  auto stub =
      v1::Bus::NewStub(grpc::CreateChannel(server.address(), grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + 20s);
  ctx.AddMetadata("x-agentrt-agent", agent);
  ctx.AddMetadata("x-agentrt-token", DeriveAgentToken(kSecret, agent));
  auto stream = stub->PublishStream(&ctx);
  v1::PublishBatchRequest req;
  for (const auto& e : entries) *req.add_messages() = e;
  stream->Write(req);
  stream->WritesDone();
  v1::PublishBatchResponse resp;
  while (stream->Read(&resp)) {
  }
  return stream->Finish();
}

}  // namespace

TEST_CASE("async payloads from 256 KiB go through the spool on the broker's node, in order") {
  const agentrt::testing::TempDir tmp("agentrt-spooled");
  BusServerOptions opts = Options();
  opts.broker.spill_root = tmp.path;
  auto server = Start(opts);
  auto pub = Client(server->address(), "pub");
  auto sub = Client(server->address(), "sub");  // default options: the broker's files, on its node
  Collector c;
  REQUIRE(sub->Subscribe("tmix", StartAt::Earliest(), c.OnMessage(), c.Events()).ok());
  // Small, spooled (1 MiB and 256 KiB exactly) and inline just below the threshold, interleaved.
  const size_t sizes[] = {64, 1 << 20, (256 << 10) - 8, 256 << 10};
  std::vector<std::string> sent;
  for (int i = 0; i < 16; ++i) {
    sent.push_back(RandomBytes(sizes[i % 4], 100 + i));
    pub->PublishAsync("tmix", sent.back());
  }
  REQUIRE(pub->Flush(30s).ok());
  REQUIRE(WaitFor([&] { return c.size() == sent.size(); }, 30s));
  {
    std::lock_guard<std::mutex> l(c.mu);
    for (size_t i = 0; i < sent.size(); ++i) {
      INFO("message " << i);
      CHECK(c.msgs[i].offset() == static_cast<int64_t>(i));
      CHECK(c.msgs[i].payload() == sent[i]);
      CHECK(c.msgs[i].publisher() == "pub");
    }
    CHECK(c.reconnect_reasons.empty());  // every file was read here, none fell back
  }
  auto stats = sub->Stats();
  REQUIRE(stats.ok());
  CHECK(stats->large_adopted == 8);  // the 1 MiB and 256 KiB ones: no payload byte over the socket
  CHECK(stats->large_streamed == 0);
  CHECK(SpoolFiles(tmp.path) == 0);  // every spool file was taken over

  // An agent that may not publish to the topic: refused, its file removed.
  auto intruder = Client(server->address(), "sub");
  std::atomic<int> refused{0};
  intruder->PublishAsync("tmix", RandomBytes(1 << 20, 7), {}, [&](const Result<PublishAck>& r) {
    if (r.status().code() == StatusCode::kPermissionDenied) ++refused;
  });
  CHECK(intruder->Flush(30s).code() == StatusCode::kPermissionDenied);
  CHECK(refused == 1);
  CHECK(SpoolFiles(tmp.path) == 0);
  auto after = sub->Stats();
  REQUIRE(after.ok());
  CHECK(after->large_adopted == 8);
}

TEST_CASE("past max_open_payload_files a memory broker keeps spooled payloads in memory") {
  const agentrt::testing::TempDir tmp("agentrt-spooled");
  BusServerOptions opts = Options();
  opts.broker.spill_root = tmp.path;
  opts.broker.max_open_payload_files = 2;
  auto server = Start(opts);
  auto pub = Client(server->address(), "pub");
  auto sub = Client(server->address(), "sub");
  Collector c;
  REQUIRE(sub->Subscribe("tfiles", StartAt::Earliest(), c.OnMessage(), c.Events()).ok());
  std::vector<std::string> sent;
  for (int i = 0; i < 6; ++i) {
    sent.push_back(RandomBytes(1 << 20, 300 + i));
    pub->PublishAsync("tfiles", sent.back());
  }
  REQUIRE(pub->Flush(30s).ok());
  REQUIRE(WaitFor([&] { return c.size() == sent.size(); }, 30s));
  {
    std::lock_guard<std::mutex> l(c.mu);
    for (size_t i = 0; i < sent.size(); ++i) {
      INFO("message " << i);
      CHECK(c.msgs[i].payload() == sent[i]);
    }
  }
  CHECK(CountFiles(tmp.path, ".blob") == 2);  // the first two; the others read and kept inline
  CHECK(SpoolFiles(tmp.path) == 0);           // every spool file taken over or removed
  auto stats = sub->Stats();
  REQUIRE(stats.ok());
  CHECK(stats->large_adopted == 6);  // no payload byte over the publisher's socket either way
}

TEST_CASE("a spooled batch entry is checked: no payload, its own agent's file, present") {
  const agentrt::testing::TempDir tmp("agentrt-spooled");
  BusServerOptions opts = Options();
  opts.broker.spill_root = tmp.path;
  auto server = Start(opts);
  v1::PublishRequest e;
  e.set_topic("tmix");
  e.set_spooled_name("pub.0123456789abcdef.part");
  e.set_spooled_size(1 << 20);
  SECTION("a payload beside the file") {
    e.set_payload("x");
    const grpc::Status s = RawBatch(*server, "pub", {e});
    CHECK(s.error_code() == grpc::StatusCode::INVALID_ARGUMENT);
    CHECK(s.error_message().find("carries a payload") != std::string::npos);
  }
  SECTION("another agent's file name") {
    e.set_spooled_name("sub.0123456789abcdef.part");
    const grpc::Status s = RawBatch(*server, "pub", {e});
    CHECK(s.error_code() == grpc::StatusCode::INVALID_ARGUMENT);
    CHECK(s.error_message().find("is not a spool file of agent pub") != std::string::npos);
  }
  SECTION("a file that is not there (a publisher on another node)") {
    const grpc::Status s = RawBatch(*server, "pub", {e});
    CHECK(s.error_code() == grpc::StatusCode::FAILED_PRECONDITION);
    CHECK(s.error_message().find("cannot open") != std::string::npos);
  }
  SECTION("a unary Publish cannot name a file") {
    auto stub = v1::Bus::NewStub(
        grpc::CreateChannel(server->address(), grpc::InsecureChannelCredentials()));
    grpc::ClientContext ctx;
    ctx.AddMetadata("x-agentrt-agent", "pub");
    ctx.AddMetadata("x-agentrt-token", DeriveAgentToken(kSecret, "pub"));
    v1::PublishResponse resp;
    const grpc::Status s = stub->Publish(&ctx, e, &resp);
    CHECK(s.error_code() == grpc::StatusCode::INVALID_ARGUMENT);
    CHECK(s.error_message().find("belong to entries of PublishBatch") != std::string::npos);
  }
  auto topics = Client(server->address(), "sub")->ListTopics();
  REQUIRE(topics.ok());
  for (const auto& t : *topics) CHECK(t.end_offset() == 0);  // nothing was stored
}

// 40 async publishes of `size` bytes to `topic`; after the 13th the broker
// goes away, with publishes queued and in flight, and comes back on its port
// with a new spool (the old files' names gone). Every one is answered
// stored; what was sent, in order.
std::vector<std::string> PublishThroughRestart(BusClient& pub, const std::string& topic,
                                               size_t size, const BusServerOptions& opts,
                                               std::unique_ptr<BusServer>* server) {
  std::atomic<int> acked{0}, failed{0};
  std::vector<std::string> sent;
  for (int i = 0; i < 40; ++i) {
    sent.push_back(RandomBytes(size, 300 + i));
    pub.PublishAsync(topic, sent.back(), {},
                     [&](const Result<PublishAck>& r) { (r.ok() ? acked : failed)++; });
    if (i == 12) {
      server->reset();
      *server = Start(opts);
    }
  }
  const Status flushed = pub.Flush(60s);
  INFO(flushed.ToString());
  REQUIRE(flushed.ok());
  CHECK(acked == 40);
  CHECK(failed == 0);
  return sent;
}

TEST_CASE("spooled async publishes ride through a broker restart, each stored once") {
  const agentrt::testing::TempDir tmp("agentrt-spooled");
  BusServerOptions opts = Options(tmp.path, BusDurability::kBatch);
  auto server = Start(opts);
  opts.port = server->port();
  auto pub = Client(server->address(), "pub");
  const std::vector<std::string> sent =
      PublishThroughRestart(*pub, "tlarge", 512 << 10, opts, &server);
  CHECK(SpoolFiles(tmp.path) == 0);
  CHECK(CountFiles(tmp.path, ".blob") == 0);  // a durable log holds them in its records
  auto sub = Client(server->address(), "sub");
  std::vector<std::string> got;
  for (int64_t at = 0; at < 40;) {
    auto batch = sub->Fetch("tlarge", at, 8, 10s);
    REQUIRE(batch.ok());
    if (batch->empty()) break;
    for (const auto& m : *batch) got.push_back(m.payload());
    at = batch->back().offset() + 1;
  }
  REQUIRE(got.size() == sent.size());  // none lost, none twice
  for (size_t i = 0; i < sent.size(); ++i) CHECK(got[i] == sent[i]);
}

TEST_CASE(
    "a memory broker's restart: every spooled publish is answered, no file or descriptor kept") {
  const agentrt::testing::TempDir tmp("agentrt-spooled");
  BusServerOptions opts = Options();
  opts.broker.spill_root = tmp.path;
  auto open_spool_files = [] {  // descriptors of this process on files named like spool files
    int n = 0;
    std::error_code ec;
    for (const auto& e : fs::directory_iterator("/proc/self/fd", ec))
      n += fs::read_symlink(e.path(), ec).string().find(".part") != std::string::npos;
    return n;
  };
  auto server = Start(opts);
  opts.port = server->port();
  auto pub = Client(server->address(), "pub");
  (void)PublishThroughRestart(*pub, "tmem", 1 << 20, opts, &server);  // memory: lost with it
  CHECK(SpoolFiles(tmp.path) == 0);
  CHECK(open_spool_files() == 0);  // none held either
  auto topics = Client(server->address(), "sub")->ListTopics();
  REQUIRE(topics.ok());
  REQUIRE(topics->size() == 1);
  CHECK((*topics)[0].end_offset() >= 27);  // at least those published after the restart
}
