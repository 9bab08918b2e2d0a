// Weight streams on the real broker and client over gRPC on loopback: versions
// written once into the broker's spool and mapped by subscribers (no bytes
// over the socket), small ones inline, streamed ones where the spool is not
// visible; latest / wait_newer / pinned versions, keep_last, the ACL, a
// publisher that dies half-way, a forged spool name, and a durable broker's
// restart keeping every committed version.
#include "comms/weight_stream.h"

#include <fcntl.h>
#include <grpcpp/grpcpp.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "common/crc32c.h"
#include "comms/auth.h"
#include "comms/bus_client.h"
#include "comms/bus_server.h"
#include "comms/proto/bus.grpc.pb.h"
#include "comms/weight_delta.h"
#include "plan/run_dir.h"
#include "tests/common/temp_dir.h"
#include "tests/comms/bus_test_util.h"

using namespace agentrt;
namespace fs = std::filesystem;
namespace v1 = agentrt::bus::v1;
using namespace std::chrono_literals;

namespace {

constexpr char kSecret[] = "weights-test-secret-0123456789abcdef";

BusAcl TestAcl() {
  BusAcl acl;
  acl.agents = {"pub", "sub", "outsider"};
  acl.channels = {{"weights/kept", {"pub"}, {"sub"}, 2}, {"weights/*", {"pub"}, {"sub"}}};
  return acl;
}

// Searches the spool before every adoption unless told otherwise.
std::unique_ptr<BusServer> Start(const std::string& log_dir,
                                 BusDurability durability = BusDurability::kMemory,
                                 std::chrono::milliseconds reap_every = {}) {
  BusServerOptions o;
  o.broker.spool_reap_every = reap_every;
  o.broker.limits.max_message_bytes = 256 << 20;
  o.broker.log_dir = log_dir;
  o.broker.durability = durability;
  return testing::StartBus(o, kSecret, TestAcl());
}

std::unique_ptr<BusClient> Client(const std::string& address, const std::string& agent,
                                  bool local = true) {
  BusClientOptions o;
  o.write_local_files = local;
  return testing::ConnectBus(address, kSecret, agent, o);
}

// A client as a process on another node than the broker's has it.
std::unique_ptr<BusClient> RemoteClient(const std::string& address, const std::string& agent) {
  return testing::ConnectRemoteBus(address, kSecret, agent);
}

std::vector<float> Values(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<float> v(n);
  for (auto& x : v) x = static_cast<float>(rng()) / 4096.0f;
  return v;
}

// Two tensors: a big one (8 MiB of floats) and a small odd-sized one.
struct Policy {
  std::vector<float> w, b;
  explicit Policy(uint32_t seed, size_t n = size_t{2} << 20)
      : w(Values(n, seed)), b(Values(7, seed + 1)) {}
  std::vector<WeightTensor> Tensors() const {
    return {{"fc.weight",
             "float32",
             {static_cast<int64_t>(w.size() / 64), 64},
             w.data(),
             w.size() * sizeof(float)},
            {"fc.bias", "float32", {7}, b.data(), b.size() * sizeof(float)}};
  }
};

void CheckHolds(const WeightSet& set, const Policy& p) {
  const auto* w = set.Find("fc.weight");
  const auto* b = set.Find("fc.bias");
  REQUIRE(w != nullptr);
  REQUIRE(b != nullptr);
  CHECK(w->dtype == "float32");
  CHECK(w->shape == std::vector<int64_t>{static_cast<int64_t>(p.w.size() / 64), 64});
  CHECK(w->offset % kWeightsAlignment == 0);
  CHECK(b->offset % kWeightsAlignment == 0);
  REQUIRE(w->bytes == p.w.size() * sizeof(float));
  CHECK(std::memcmp(set.Data(*w), p.w.data(), w->bytes) == 0);
  REQUIRE(b->bytes == p.b.size() * sizeof(float));
  CHECK(std::memcmp(set.Data(*b), p.b.data(), b->bytes) == 0);
}

int SpoolFiles(const std::string& log_dir) {
  int n = 0;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(BusLogSpoolDir(log_dir), ec))
    n += e.path().extension() == ".part" ? 1 : 0;
  return n;
}

}  // namespace

TEST_CASE("a weights payload round-trips through its layout, and a bad one is refused") {
  const Policy p(3, 1000);
  const auto tensors = p.Tensors();
  const WeightLayout layout = LayOutWeights("s", "pub", 42, 7, tensors);
  std::string payload = layout.header;
  for (size_t i = 0; i < tensors.size(); ++i) {
    payload.resize(layout.offsets[i], '\0');
    payload.append(static_cast<const char*>(tensors[i].data), tensors[i].bytes);
  }
  REQUIRE(payload.size() == layout.size);
  BusMessage m;
  m.set_topic("weights/s");
  m.set_publisher("pub");
  m.set_payload(payload);
  auto set = WeightSet::FromMessage(m, 5);
  INFO(set.status().ToString());
  REQUIRE(set.ok());
  CHECK((*set)->version() == 5);
  CHECK((*set)->stream() == "s");
  CHECK((*set)->step() == 42);
  CHECK((*set)->incarnation() == 7);
  CHECK_FALSE((*set)->mapped());
  CheckHolds(**set, p);

  BusMessage bad = m;
  (*bad.mutable_payload())[0] = 'X';
  CHECK_THAT(WeightSet::FromMessage(bad, 5).status().message(),
             Catch::Contains("does not start with AGRTWTS1"));
  bad = m;
  bad.mutable_payload()->resize(payload.size() - 1);  // the last tensor runs past the end
  auto cut = WeightSet::FromMessage(bad, 5);
  CHECK(cut.status().code() == StatusCode::kDataLoss);
  CHECK_THAT(cut.status().message(), Catch::Contains("fc.bias"));
}

TEST_CASE("weight versions go through the spool and are mapped by subscribers") {
  testing::TempDir dir("agentrt-weights");
  auto server = Start(dir.path);
  auto pub = Client(server->address(), "pub");
  auto sub = Client(server->address(), "sub");
  WeightStream out(*pub, "prey-0", /*incarnation=*/3);
  WeightStream in(*sub, "prey-0");

  auto none = in.Latest(5s);
  CHECK(none.status().code() == StatusCode::kNotFound);

  const Policy p1(1), p2(2);
  auto v1 = out.Publish(p1.Tensors(), 100);
  INFO(v1.status().ToString());
  REQUIRE(v1.ok());
  CHECK(*v1 == 1);
  auto v2 = out.Publish(p2.Tensors(), 200);
  REQUIRE(v2.ok());
  CHECK(*v2 == 2);
  CHECK(SpoolFiles(dir.path) == 0);  // every spool file was taken over
  {
    auto stats = sub->Stats();
    REQUIRE(stats.ok());
    CHECK(stats->large_adopted == 2);  // no payload byte crossed the socket
    CHECK(stats->large_streamed == 0);
  }

  auto latest = in.Latest(5s);
  INFO(latest.status().ToString());
  REQUIRE(latest.ok());
  const WeightSet& set = **latest;
  CHECK(set.version() == 2);
  CHECK(set.step() == 200);
  CHECK(set.incarnation() == 3);
  CHECK(set.agent() == "pub");
  CHECK(set.stream() == "prey-0");
  CHECK(set.mapped());  // views of the broker's file: no copy, no bytes over the socket
  CHECK_FALSE(set.path().empty());
  CheckHolds(set, p2);

  // A pinned version stays readable while newer ones come.
  auto pinned = in.At(1, 5s);
  REQUIRE(pinned.ok());
  CHECK((*pinned)->step() == 100);
  CheckHolds(**pinned, p1);
  CHECK(in.At(7, 200ms).status().code() == StatusCode::kNotFound);
}

TEST_CASE("weight streams: wait_newer waits for the next version, never for subscribers") {
  testing::TempDir dir("agentrt-weights");
  auto server = Start(dir.path);
  auto pub = Client(server->address(), "pub");
  auto sub = Client(server->address(), "sub");
  WeightStream out(*pub, "hunter");
  WeightStream in(*sub, "hunter");
  const Policy p1(11), p2(12);
  REQUIRE(out.Publish(p1.Tensors(), 1).ok());
  auto timed_out = in.WaitNewer(1, 300ms);
  CHECK(timed_out.status().code() == StatusCode::kDeadlineExceeded);
  CHECK_THAT(timed_out.status().message(), Catch::Contains("no version after 1"));

  std::thread later([&] {
    std::this_thread::sleep_for(100ms);
    REQUIRE(out.Publish(p2.Tensors(), 2).ok());
  });
  auto next = in.WaitNewer(1, 20s);
  later.join();
  INFO(next.status().ToString());
  REQUIRE(next.ok());
  CHECK((*next)->version() == 2);
  CheckHolds(**next, p2);
  // Asked with an older version, it answers at once with the newest.
  auto newest = in.WaitNewer(0, 1s);
  REQUIRE(newest.ok());
  CHECK((*newest)->version() == 2);
}

TEST_CASE("weight streams: PublishAsync returns once the bytes are copied, and stores them after") {
  testing::TempDir dir("agentrt-weights");
  auto server = Start(dir.path);
  auto pub = Client(server->address(), "pub");
  auto sub = Client(server->address(), "sub");
  WeightStream in(*sub, "async");
  const Policy p1(41), p2(42);
  {
    WeightStream out(*pub, "async", /*incarnation=*/2);
    auto none = out.Flush(1s);
    REQUIRE(none.ok());
    CHECK(*none == 0);  // nothing published yet

    Policy trained = p1;
    REQUIRE(out.PublishAsync(trained.Tensors(), 10).ok());
    std::fill(trained.w.begin(), trained.w.end(), -1.0f);  // the loop trains on at once
    auto v1 = out.Flush(20s);
    INFO(v1.status().ToString());
    REQUIRE(v1.ok());
    CHECK(*v1 == 1);
    auto got = in.At(1, 5s);
    REQUIRE(got.ok());
    CHECK((*got)->mapped());
    CHECK((*got)->step() == 10);
    CHECK((*got)->incarnation() == 2);
    CheckHolds(**got, p1);  // the values at the call
    // The next version's slot is ready in the spool, already its size.
    CHECK(SpoolFiles(dir.path) == 1);

    REQUIRE(out.PublishAsync(p2.Tensors(), 20).ok());
    auto v2 = out.Flush(20s);
    REQUIRE(v2.ok());
    CHECK(*v2 == 2);
    auto latest = in.Latest(5s);
    REQUIRE(latest.ok());
    CHECK((*latest)->version() == 2);
    CheckHolds(**latest, p2);
    auto stats = sub->Stats();
    REQUIRE(stats.ok());
    CHECK(stats->large_adopted == 2);  // both went through the spool, no byte over the socket
    CHECK(stats->large_streamed == 0);

    // A size the ready slot does not have: the call makes its own slot.
    REQUIRE(out.PublishAsync(Policy(43, size_t{3} << 20).Tensors(), 30).ok());
    auto v3 = out.Flush(20s);
    REQUIRE(v3.ok());
    CheckHolds(**in.At(*v3, 5s), Policy(43, size_t{3} << 20));
    // The broker's spool made anew (as a restart does) while a slot waits in
    // it: that version is sent in chunks, and the next goes through the
    // spool again.
    REQUIRE(SpoolFiles(dir.path) == 1);
    for (const auto& e : fs::directory_iterator(BusLogSpoolDir(dir.path)))
      if (e.path().extension() == ".part") fs::remove(e.path());
    const Policy p3(45, size_t{3} << 20);  // the ready slot's size
    REQUIRE(out.PublishAsync(p3.Tensors(), 31).ok());
    auto chunked = out.Flush(20s);
    INFO(chunked.status().ToString());
    REQUIRE(chunked.ok());
    CheckHolds(**in.At(*chunked, 5s), p3);
    REQUIRE(out.PublishAsync(p1.Tensors(), 32).ok());
    REQUIRE(out.Flush(20s).ok());
    auto after = sub->Stats();
    REQUIRE(after.ok());
    CHECK(after->large_streamed == 1);
    CHECK(after->large_adopted == 4);  // v1, v2, v3 and the one after the spool was remade
    // One in flight when the stream goes: stored before it is gone.
    REQUIRE(out.PublishAsync(p1.Tensors(), 40).ok());
  }
  auto last = in.Latest(5s);
  REQUIRE(last.ok());
  CHECK((*last)->version() == 6);
  CHECK((*last)->step() == 40);
  CHECK(SpoolFiles(dir.path) == 0);  // the slot made ready for a fifth is removed with the stream

  // Where the spool is not used, the slot is the client's memory and the
  // version is streamed; small versions go inline.
  auto remote = Client(server->address(), "pub", /*local=*/false);
  WeightStream far(*remote, "async-far");
  REQUIRE(far.PublishAsync(p2.Tensors(), 1).ok());
  REQUIRE(far.PublishAsync(Policy(44, 1000).Tensors(), 2).ok());  // waits for the first
  auto small = far.Flush(20s);
  REQUIRE(small.ok());
  CHECK(*small == 2);
  WeightStream far_in(*sub, "async-far");
  CheckHolds(**far_in.At(1, 5s), p2);
  CheckHolds(**far_in.At(2, 5s), Policy(44, 1000));
  auto streamed = sub->Stats();
  REQUIRE(streamed.ok());
  CHECK(streamed->large_streamed == 2);  // this one and the one after the spool was remade
}

TEST_CASE("weight streams: a version PublishAsync could not store is reported, never dropped") {
  testing::TempDir dir("agentrt-weights");
  auto server = Start(dir.path);
  // Through the spool, the ACL refuses before anything is copied.
  auto local = Client(server->address(), "outsider");
  WeightStream here(*local, "kept");
  CHECK(here.PublishAsync(Policy(50).Tensors(), 1).code() == StatusCode::kPermissionDenied);
  CHECK(SpoolFiles(dir.path) == 0);

  // Streamed, the refusal comes from the background: Flush reports it ...
  auto remote = Client(server->address(), "outsider", /*local=*/false);
  WeightStream far(*remote, "kept");
  REQUIRE(far.PublishAsync(Policy(51).Tensors(), 1).ok());
  auto flushed = far.Flush(20s);
  CHECK(flushed.status().code() == StatusCode::kPermissionDenied);
  // ... or, unflushed, the next PublishAsync, which then publishes nothing.
  REQUIRE(far.PublishAsync(Policy(52).Tensors(), 2).ok());
  const Status next = far.PublishAsync(Policy(53).Tensors(), 3);
  CHECK(next.code() == StatusCode::kPermissionDenied);
  CHECK_THAT(next.message(), Catch::Contains("the version before was not stored"));
  auto after = far.Flush(1s);
  REQUIRE(after.ok());
  CHECK(*after == 0);  // none stored, nothing in flight
}

TEST_CASE("weight streams: small versions inline, streamed ones where the spool is not visible") {
  testing::TempDir dir("agentrt-weights");
  auto server = Start(dir.path);
  auto sub = Client(server->address(), "sub");
  WeightStream in(*sub, "small");
  {
    auto pub = Client(server->address(), "pub");
    const Policy tiny(5, 64);
    REQUIRE(WeightStream(*pub, "small").Publish(tiny.Tensors(), 9).ok());
    auto got = in.Latest(5s);
    REQUIRE(got.ok());
    CHECK_FALSE((*got)->mapped());
    CheckHolds(**got, tiny);
  }
  {
    // A publisher that may not use the spool sends the same bytes in chunks.
    auto remote = Client(server->address(), "pub", /*local=*/false);
    const Policy p(6);
    REQUIRE(WeightStream(*remote, "small").Publish(p.Tensors(), 10).ok());
    auto got = in.Latest(5s);
    REQUIRE(got.ok());
    CHECK((*got)->version() == 2);
    CHECK((*got)->mapped());  // the broker wrote it to its file; this reader maps that
    CheckHolds(**got, p);
    auto stats = sub->Stats();
    REQUIRE(stats.ok());
    CHECK(stats->large_adopted == 0);
    CHECK(stats->large_streamed == 1);
  }
  {
    // The spool's id does not match: the folder is not the broker's (another node).
    std::ofstream(BusLogSpoolDir(dir.path) + "/" + kBusSpoolIdFile) << "0000000000000000\n";
    auto pub = Client(server->address(), "pub");
    const Policy p(7);
    REQUIRE(WeightStream(*pub, "small").Publish(p.Tensors(), 11).ok());
    CHECK(SpoolFiles(dir.path) == 0);
    auto got = in.Latest(5s);
    REQUIRE(got.ok());
    CHECK((*got)->version() == 3);
    CheckHolds(**got, p);
  }
}

TEST_CASE("weight streams: delta versions, and a wrong or damaged one read whole") {
  testing::TempDir dir("agentrt-weights");
  auto server = Start(dir.path);
  auto pub = Client(server->address(), "pub");
  auto sub = RemoteClient(server->address(), "sub");  // every byte streamed
  WeightStream out(*pub, "delta", 0, {.delta = true});
  WeightStream in(*sub, "delta", 0, {.delta = true});
  Policy p(71);
  REQUIRE(out.Publish(p.Tensors(), 1).ok());
  auto v1 = in.Latest(5s);
  REQUIRE(v1.ok());
  CHECK_FALSE((*v1)->mapped());
  const int64_t full = static_cast<int64_t>((*v1)->payload_size());
  CHECK(in.stats().whole_bytes_read == full);

  // 1% of the values change: version 2 travels as its delta.
  for (size_t i = 0; i < p.w.size(); i += 100) p.w[i] += 1.0f;
  REQUIRE(out.Publish(p.Tensors(), 2).ok());
  CHECK(out.stats().deltas_published == 1);
  CHECK(out.stats().delta_bytes_published * 20 < full);
  auto v2 = in.WaitNewer(1, 5s);
  INFO(v2.status().ToString());
  REQUIRE(v2.ok());
  CHECK((*v2)->version() == 2);
  CHECK((*v2)->step() == 2);
  CheckHolds(**v2, p);
  WeightStreamStats s = in.stats();
  CHECK(s.versions_from_delta == 1);
  CHECK(s.delta_bytes_read == out.stats().delta_bytes_published);
  CHECK(s.whole_bytes_read == full);  // nothing more read whole

  // A reader that holds version 2 when version 4 is the newest: no delta
  // from its base, so version 4 is read whole.
  for (int step = 3; step <= 4; ++step) {
    for (size_t i = 0; i < p.w.size(); i += 100) p.w[i] += 1.0f;
    REQUIRE(out.Publish(p.Tensors(), step).ok());
  }
  auto v4 = in.WaitNewer(2, 5s);
  REQUIRE(v4.ok());
  CHECK((*v4)->version() == 4);
  CheckHolds(**v4, p);
  CHECK(in.stats().versions_from_delta == 1);
  CHECK(in.stats().whole_bytes_read == 2 * full);

  // Version 5 from a publisher without deltas, and a forged delta for it,
  // consistent in itself (it rebuilds version 4 and carries that CRC32C),
  // but not of the version stored: refused, and version 5 read whole.
  for (size_t i = 0; i < p.w.size(); i += 100) p.w[i] += 1.0f;
  WeightStream plain(*pub, "delta");
  REQUIRE(plain.Publish(p.Tensors(), 5).ok());
  const std::string_view held((*v4)->payload(), (*v4)->payload_size());
  auto forged =
      EncodeWeightDelta({5, 4, held.size(), Crc32c(held.data(), held.size())}, held, held);
  REQUIRE(forged.ok());
  REQUIRE(pub->Publish(WeightDeltaTopic("delta"), *forged).ok());
  auto v5 = in.WaitNewer(4, 5s);
  INFO(v5.status().ToString());
  REQUIRE(v5.ok());
  CheckHolds(**v5, p);
  CHECK(in.stats().delta_mismatches == 1);
  CHECK(in.stats().whole_bytes_read == 3 * full);
  // The delta publisher's kept version is 4, not 5: its next version has no
  // delta, and says so (a reader waiting for it reads it whole at once).
  REQUIRE(out.Publish(p.Tensors(), 6).ok());
  CHECK(out.stats().deltas_published == 3);  // versions 2, 3 and 4
  auto v6 = in.WaitNewer(5, 5s);
  REQUIRE(v6.ok());
  CHECK(in.stats().whole_bytes_read == 4 * full);

  // A reader already waiting when the next version comes, however long the
  // publisher takes, gets it from its delta; PublishAsync makes deltas too.
  std::thread later([&] {
    std::this_thread::sleep_for(1500ms);
    for (size_t i = 0; i < p.w.size(); i += 100) p.w[i] += 1.0f;
    REQUIRE(out.PublishAsync(p.Tensors(), 7).ok());
    REQUIRE(out.Flush(20s).ok());
  });
  auto v7 = in.WaitNewer(6, 20s);
  later.join();
  INFO(v7.status().ToString());
  REQUIRE(v7.ok());
  CHECK((*v7)->version() == 7);
  CheckHolds(**v7, p);
  CHECK(in.stats().versions_from_delta == 2);
  CHECK(in.stats().whole_bytes_read == 4 * full);

  // Only the stream's subscribers read its deltas, only its publishers write them.
  auto outsider = Client(server->address(), "outsider");
  CHECK(outsider->Fetch(WeightDeltaTopic("delta"), 0, 1, 1s).status().code() ==
        StatusCode::kPermissionDenied);
  CHECK(outsider->Publish(WeightDeltaTopic("delta"), "x").status().code() ==
        StatusCode::kPermissionDenied);
}

TEST_CASE("weight streams: a reader that cannot see the broker's files has the bytes streamed") {
  // The broker's folder reached through a link that readers then lose: what
  // a reader on another node (no shared file system) meets.
  testing::TempDir dir("agentrt-weights");
  const std::string real = dir.path + "/real", link = dir.path + "/link";
  fs::create_directories(real);
  fs::create_directory_symlink(real, link);
  auto server = Start(link);
  auto pub = Client(server->address(), "pub");
  auto sub = Client(server->address(), "sub");
  WeightStream out(*pub, "far");
  WeightStream in(*sub, "far");
  const Policy p1(61), p2(62);
  REQUIRE(out.Publish(p1.Tensors(), 1).ok());
  REQUIRE(out.Publish(p2.Tensors(), 2).ok());
  fs::remove(link);
  auto latest = in.Latest(5s);
  INFO(latest.status().ToString());
  REQUIRE(latest.ok());
  CHECK((*latest)->version() == 2);
  CHECK_FALSE((*latest)->mapped());
  CheckHolds(**latest, p2);
  // Remembered: the next read asks for the bytes at once, even once the
  // folder is back (the broker's files are not taken to come and go).
  fs::create_directory_symlink(real, link);
  auto first = in.At(1, 5s);
  REQUIRE(first.ok());
  CHECK_FALSE((*first)->mapped());
  CheckHolds(**first, p1);
  // Another client on this node maps them.
  auto near = Client(server->address(), "sub");
  auto mapped = WeightStream(*near, "far").At(1, 5s);
  REQUIRE(mapped.ok());
  CHECK((*mapped)->mapped());
}

TEST_CASE("weight streams: keep_last, the ACL, and publishes that never finish") {
  testing::TempDir dir("agentrt-weights");
  auto server = Start(dir.path);
  auto pub = Client(server->address(), "pub");
  auto sub = Client(server->address(), "sub");
  WeightStream out(*pub, "kept");
  WeightStream in(*sub, "kept");
  for (int i = 1; i <= 4; ++i) REQUIRE(out.Publish(Policy(20 + i).Tensors(), i).ok());
  // keep_last 2: versions 1 and 2 are gone, their files too.
  CHECK(in.At(1, 1s).status().code() == StatusCode::kNotFound);
  CHECK_THAT(in.At(2, 1s).status().message(), Catch::Contains("no longer kept"));
  REQUIRE(in.At(3, 1s).ok());
  REQUIRE(in.Latest(1s).ok());
  int blobs = 0;
  for (const auto& e : fs::recursive_directory_iterator(dir.path))
    blobs += e.path().extension() == ".blob" ? 1 : 0;
  CHECK(blobs == 2);

  // Not a subscriber: no version by any path (the stream, Fetch of its file's name).
  auto outsider = Client(server->address(), "outsider");
  WeightStream peek(*outsider, "kept");
  CHECK(peek.At(3, 1s).status().code() == StatusCode::kPermissionDenied);
  CHECK(peek.Latest(1s).status().code() != StatusCode::kOk);
  auto fetched = outsider->Fetch(WeightStreamTopic("kept"), 2, 1, 1s, {.local_paths = true});
  CHECK(fetched.status().code() == StatusCode::kPermissionDenied);
  // Not a publisher: refused, and nothing left in the spool.
  CHECK(WeightStream(*outsider, "kept").Publish(Policy(30).Tensors(), 1).status().code() ==
        StatusCode::kPermissionDenied);
  CHECK(SpoolFiles(dir.path) == 0);

  // A publish whose writer fails half-way stores nothing and leaves no file.
  auto failed = pub->PublishLargeFrom(WeightStreamTopic("kept"), size_t{8} << 20,
                                      [](LargePayloadWriter& w) {
                                        std::string half(size_t{4} << 20, 'x');
                                        AGENTRT_RETURN_IF_ERROR(w.Append(half.data(), half.size()));
                                        return Aborted("the trainer stopped");
                                      },
                                      {});
  CHECK(failed.status().code() == StatusCode::kAborted);
  CHECK(SpoolFiles(dir.path) == 0);
  auto latest = in.Latest(1s);
  REQUIRE(latest.ok());
  CHECK((*latest)->version() == 4);

  // What a publisher killed mid-write leaves: a spool file no one adopts. No
  // version appears; the broker removes the spool when it stops.
  { std::ofstream(BusLogSpoolDir(dir.path) + "/pub.00000000deadbeef.part") << "half a policy"; }
  CHECK((*in.Latest(1s))->version() == 4);

  // A forged name (another agent's file, a path out of the spool) is refused,
  // even to an agent that may publish to the topic.
  { std::ofstream(BusLogSpoolDir(dir.path) + "/sub.00000000deadbeef.part") << "sub's"; }
  auto stub =
      v1::Bus::NewStub(grpc::CreateChannel(server->address(), grpc::InsecureChannelCredentials()));
  for (const std::string name :
       {"sub.00000000deadbeef.part", "../logs/x.part", "pub.00000000deadbeef.part/../x", "sub"}) {
    grpc::ClientContext ctx;
    ctx.AddMetadata("x-agentrt-agent", "pub");
    ctx.AddMetadata("x-agentrt-token", DeriveAgentToken(kSecret, "pub"));
    v1::AdoptRequest req;
    req.mutable_head()->set_topic("weights/open");
    req.set_size(int64_t{8} << 20);
    req.set_name(name);
    v1::PublishResponse resp;
    const grpc::Status s = stub->AdoptLarge(&ctx, req, &resp);
    CHECK(s.error_code() == grpc::StatusCode::INVALID_ARGUMENT);
    CHECK_THAT(s.error_message(), Catch::Contains("is not a spool file of agent pub"));
  }
  CHECK(fs::exists(BusLogSpoolDir(dir.path) + "/sub.00000000deadbeef.part"));
  {
    // A file with a second name (a link to bytes the publisher does not own
    // alone) is not adopted: FAILED_PRECONDITION, and both names stay.
    const std::string linked = BusLogSpoolDir(dir.path) + "/pub.00000000000011aa.part";
    { std::ofstream(dir.path + "/elsewhere") << std::string(4096, 'w'); }
    REQUIRE(::link((dir.path + "/elsewhere").c_str(), linked.c_str()) == 0);
    grpc::ClientContext ctx;
    ctx.AddMetadata("x-agentrt-agent", "pub");
    ctx.AddMetadata("x-agentrt-token", DeriveAgentToken(kSecret, "pub"));
    v1::AdoptRequest req;
    req.mutable_head()->set_topic("weights/open");
    req.set_size(4096);
    req.set_name("pub.00000000000011aa.part");
    v1::PublishResponse resp;
    const grpc::Status s = stub->AdoptLarge(&ctx, req, &resp);
    CHECK(s.error_code() == grpc::StatusCode::FAILED_PRECONDITION);
    CHECK_THAT(s.error_message(), Catch::Contains("2 links"));
    CHECK(fs::exists(linked));
    CHECK(fs::exists(dir.path + "/elsewhere"));
    fs::remove(linked);
  }

  // A publish the broker would refuse is refused before a byte is written.
  bool wrote = false;
  auto too_big =
      pub->PublishLargeFrom(WeightStreamTopic("kept"), size_t{300} << 20, [&](LargePayloadWriter&) {
        wrote = true;
        return Status::Ok();
      });
  CHECK_FALSE(too_big.ok());
  CHECK_THAT(too_big.status().message(), Catch::Contains("max_message_bytes"));
  CHECK_FALSE(wrote);
  CHECK(fs::exists(BusLogSpoolDir(dir.path) + "/pub.00000000deadbeef.part"));

  // A long run does not keep what dead publishers left: a spool file no one
  // holds locked, unchanged for a minute, goes at the next adoption; one a
  // live publisher holds stays, however old.
  const std::string dead = BusLogSpoolDir(dir.path) + "/pub.00000000deadbeef.part";
  const std::string slow = BusLogSpoolDir(dir.path) + "/pub.00000000cafef00d.part";
  std::ofstream(slow) << "a publisher that is still writing";
  const int held = ::open(slow.c_str(), O_RDONLY | O_CLOEXEC);
  REQUIRE(held >= 0);
  REQUIRE(::flock(held, LOCK_EX) == 0);
  const auto old = fs::file_time_type::clock::now() - std::chrono::minutes(2);
  // A FIFO named like a spool file hangs neither the reaper nor an adoption.
  const std::string fifo = BusLogSpoolDir(dir.path) + "/pub.00000000f1f0f1f0.part";
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  fs::last_write_time(fifo, fs::file_time_type::clock::now() - std::chrono::minutes(2));
  fs::last_write_time(dead, old);
  fs::last_write_time(slow, old);
  REQUIRE(out.Publish(Policy(31).Tensors(), 5).ok());
  CHECK_FALSE(fs::exists(dead));
  CHECK(fs::exists(slow));
  {
    v1::AdoptRequest req;  // adopting the FIFO is refused at once
    req.mutable_head()->set_topic("weights/open");
    req.set_size(int64_t{8} << 20);
    req.set_name("pub.00000000f1f0f1f0.part");
    v1::PublishResponse resp;
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + 20s);
    ctx.AddMetadata("x-agentrt-agent", "pub");
    ctx.AddMetadata("x-agentrt-token", DeriveAgentToken(kSecret, "pub"));
    CHECK(stub->AdoptLarge(&ctx, req, &resp).error_code() == grpc::StatusCode::INVALID_ARGUMENT);
  }
  ::close(held);
  server.reset();
  CHECK_FALSE(fs::exists(BusLogSpoolDir(dir.path)));
}

TEST_CASE("weight streams: the spool is searched for dead publishers' files at most so often") {
  testing::TempDir dir("agentrt-weights");
  auto server = Start(dir.path, BusDurability::kMemory, std::chrono::hours(1));
  auto pub = Client(server->address(), "pub");
  WeightStream out(*pub, "open");
  const std::string dead = BusLogSpoolDir(dir.path) + "/pub.00000000deadbeef.part";
  std::ofstream(dead) << "half a policy";
  fs::last_write_time(dead, fs::file_time_type::clock::now() - std::chrono::minutes(2));
  REQUIRE(out.Publish(Policy(51).Tensors(), 1).ok());  // the first adoption searches
  CHECK_FALSE(fs::exists(dead));
  std::ofstream(dead) << "half a policy";
  fs::last_write_time(dead, fs::file_time_type::clock::now() - std::chrono::minutes(2));
  REQUIRE(out.Publish(Policy(52).Tensors(), 2).ok());  // within the hour: not again
  CHECK(fs::exists(dead));
  server.reset();
  CHECK_FALSE(fs::exists(BusLogSpoolDir(dir.path)));
}

TEST_CASE("weight streams: a durable broker's restart keeps every committed version") {
  testing::TempDir dir("agentrt-weights");
  const Policy p1(41), p2(42);
  {
    auto server = Start(dir.path, BusDurability::kAlways);
    auto pub = Client(server->address(), "pub");
    WeightStream out(*pub, "durable");
    REQUIRE(out.Publish(p1.Tensors(), 1).ok());
    REQUIRE(out.Publish(p2.Tensors(), 2).ok());
    std::ofstream(BusLogSpoolDir(dir.path) + "/pub.00000000deadbeef.part") << "torn";
  }
  auto server = Start(dir.path, BusDurability::kAlways);
  CHECK(SpoolFiles(dir.path) == 0);  // a dead publisher's file is gone after the restart
  auto sub = Client(server->address(), "sub");
  WeightStream in(*sub, "durable");
  auto latest = in.Latest(5s);
  INFO(latest.status().ToString());
  REQUIRE(latest.ok());
  CHECK((*latest)->version() == 2);
  CheckHolds(**latest, p2);
  auto first = in.At(1, 5s);
  REQUIRE(first.ok());
  CheckHolds(**first, p1);
}

TEST_CASE("weight streams: off the broker's node a version is fetched once per node") {
  testing::TempDir dir("agentrt-weights");
  auto server = Start(dir.path);
  auto pub = Client(server->address(), "pub");
  auto a = RemoteClient(server->address(), "sub");
  auto b = RemoteClient(server->address(), "sub");
  auto c = RemoteClient(server->address(), "sub");
  WeightStream out(*pub, "node");
  Policy p(81);
  std::string node_dir;
  {
    WeightStream in_a(*a, "node"), in_b(*b, "node");
    REQUIRE(out.Publish(p.Tensors(), 1).ok());
    REQUIRE(in_a.Latest(5s).ok());
    REQUIRE(in_b.Latest(5s).ok());
    node_dir = a->NodeCacheDir();
    REQUIRE_FALSE(node_dir.empty());
    CHECK(node_dir == b->NodeCacheDir());  // one folder per bus and node
    CHECK(node_dir.rfind("/dev/shm/agentrt-bus.", 0) == 0);
    for (int64_t v = 2; v <= 4; ++v) {
      p.w[static_cast<size_t>(v)] += 1.0f;
      REQUIRE(out.Publish(p.Tensors(), v).ok());
      const WeightStreamStats before_a = in_a.stats(), before_b = in_b.stats();
      auto got_a = in_a.WaitNewer(v - 1, 5s);
      INFO(got_a.status().ToString());
      REQUIRE(got_a.ok());
      CHECK((*got_a)->version() == v);
      CHECK_FALSE((*got_a)->mapped());  // fetched here, and left for the node
      CheckHolds(**got_a, p);
      auto got_b = in_b.WaitNewer(v - 1, 5s);
      REQUIRE(got_b.ok());
      CHECK((*got_b)->mapped());  // the file a fetched: no byte streamed to b
      CHECK((*got_b)->path().rfind(node_dir + "/", 0) == 0);
      CheckHolds(**got_b, p);
      CHECK(in_a.stats().whole_bytes_read - before_a.whole_bytes_read ==
            static_cast<int64_t>((*got_a)->payload_size()));
      CHECK(in_b.stats().whole_bytes_read == before_b.whole_bytes_read);
      CHECK(in_b.stats().versions_from_node_cache == before_b.versions_from_node_cache + 1);
    }
  }
  // The folder keeps the newest two versions (and their lock files), nothing else.
  std::vector<std::string> left;
  std::string v4;
  for (const auto& e : fs::directory_iterator(node_dir)) {
    const std::string name = e.path().filename();
    if (name == ".lock") continue;  // the folder's
    const bool lock = name.ends_with(".lock");
    left.push_back(name.substr(name.find('.') + 1, 1) + (lock ? " lock" : ""));
    if (!lock && name.find(".4.") != std::string::npos) v4 = e.path();
  }
  std::sort(left.begin(), left.end());
  CHECK(left == std::vector<std::string>{"3", "3 lock", "4", "4 lock"});
  REQUIRE_FALSE(v4.empty());

  // A file that is not the version's bytes is refused, removed and fetched anew.
  {
    std::fstream f(v4, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(4096);
    f.write("garbage!", 8);
  }
  {
    WeightStream in_c(*c, "node");
    auto again = in_c.At(4, 5s);
    INFO(again.status().ToString());
    REQUIRE(again.ok());
    CheckHolds(**again, p);
    CHECK(in_c.stats().versions_from_node_cache == 0);
    auto cached = in_c.At(4, 5s);  // the file it left in place of the damaged one
    REQUIRE(cached.ok());
    CHECK((*cached)->mapped());
    CheckHolds(**cached, p);
    CHECK(in_c.stats().versions_from_node_cache == 1);
  }

  // The last client of the node to go removes the folder.
  a.reset();
  b.reset();
  CHECK(fs::exists(node_dir));  // c still holds it
  c.reset();
  CHECK_FALSE(fs::exists(node_dir));
}
