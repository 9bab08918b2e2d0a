#include "comms/telemetry.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <new>
#include <string>
#include <vector>

#include "common/file_util.h"
#include "comms/auth.h"

// Counts this thread's allocations through operator new while asked to: the
// intake's steady state must make none.
namespace {
thread_local bool counting_allocations = false;
thread_local long allocations = 0;
}  // namespace

void* operator new(std::size_t size) {
  if (counting_allocations) ++allocations;
  if (void* p = std::malloc(size == 0 ? 1 : size)) return p;
  throw std::bad_alloc();
}
// libstdc++'s operator delete frees with std::free, which pairs with this.

namespace agentrt {
namespace {

using std::chrono::milliseconds;

TelemetryMessage Metrics(int rank, int64_t step, double loss) {
  TelemetryMessage m;
  m.type = TelemetryType::kMetrics;
  m.agent = "predator-0";
  m.rank = rank;
  m.pid = ::getpid();
  m.time = UnixTimeSeconds();
  m.step = step;
  m.metrics = {{"loss", loss}, {"phase", "train"}};
  return m;
}

// Polls until `count` messages arrived or 10 s passed.
std::vector<TelemetryMessage> Receive(TelemetryReceiver& receiver, size_t count) {
  std::vector<TelemetryMessage> all;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (all.size() < count && std::chrono::steady_clock::now() < deadline) {
    auto got = receiver.Poll(milliseconds(100));
    REQUIRE(got.ok());
    for (auto& m : *got) all.push_back(std::move(m));
  }
  return all;
}

std::string TempDir() {
  std::string tmpl = (std::filesystem::temp_directory_path() / "agentrt-telemetry-XXXXXX").string();
  REQUIRE(::mkdtemp(tmpl.data()) != nullptr);
  return tmpl;
}

TEST_CASE("telemetry messages round-trip through the JSON wire format") {
  TelemetryMessage m = Metrics(3, 42, 0.5);
  auto decoded = DecodeTelemetry(EncodeTelemetry(m));
  REQUIRE(decoded.ok());
  CHECK(decoded->type == TelemetryType::kMetrics);
  CHECK(decoded->agent == "predator-0");
  CHECK(decoded->rank == 3);
  CHECK(decoded->step == 42);
  CHECK(decoded->metrics["loss"].get<double>() == 0.5);
  CHECK(decoded->metrics["phase"] == "train");

  TelemetryMessage c;
  c.type = TelemetryType::kCheckpoint;
  c.agent = "prey-1";
  c.checkpoint_step = 400;
  auto dc = DecodeTelemetry(EncodeTelemetry(c));
  REQUIRE(dc.ok());
  CHECK(dc->checkpoint_step == 400);
}

TEST_CASE("malformed telemetry is rejected with a message naming what is wrong") {
  auto a = DecodeTelemetry("not json");
  REQUIRE_FALSE(a.ok());
  CHECK(a.status().message().find("not a JSON object") != std::string::npos);
  auto b = DecodeTelemetry(R"({"type":"explode","agent":"a","rank":0})");
  REQUIRE_FALSE(b.ok());
  CHECK(b.status().message().find("explode") != std::string::npos);
  auto c = DecodeTelemetry(R"({"type":"metrics","agent":"a","rank":1})");
  REQUIRE_FALSE(c.ok());
  CHECK(c.status().message().find("\"metrics\"") != std::string::npos);
  auto d = DecodeTelemetry(R"({"type":"heartbeat","rank":1})");
  REQUIRE_FALSE(d.ok());
  CHECK(d.status().message().find("agent") != std::string::npos);
}

TEST_CASE("an HMAC-SHA256 key with its pads hashed once gives RFC 4231's MACs and OpenSSL's") {
  char hex[kHmacSha256HexSize];
  // RFC 4231, test case 2.
  HmacSha256Key("Jefe").Hex("what do ya want for nothing?", hex);
  CHECK(std::string(hex, sizeof hex) ==
        "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
  // RFC 4231, test case 6: a key longer than a block is hashed first.
  HmacSha256Key(std::string(131, '\xaa'))
      .Hex("Test Using Larger Than Block-Size Key - Hash Key First", hex);
  CHECK(std::string(hex, sizeof hex) ==
        "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54");
  for (size_t key_size : {0, 1, 63, 64, 65, 200}) {
    const std::string key(key_size, 'k');
    const HmacSha256Key once(key);
    for (const std::string& data : {std::string(), std::string("x"), std::string(1000, 'd')}) {
      unsigned char mac[EVP_MAX_MD_SIZE];
      unsigned int mac_len = 0;
      HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
           reinterpret_cast<const unsigned char*>(data.data()), data.size(), mac, &mac_len);
      std::string openssl;
      for (unsigned int i = 0; i < mac_len; ++i) openssl += fmt::format("{:02x}", mac[i]);
      once.Hex(data, hex);
      CHECK(std::string(hex, sizeof hex) == openssl);
      CHECK(HmacSha256Hex(key, data) == openssl);
    }
  }
  allocations = 0;
  counting_allocations = true;
  const HmacSha256Key key("token");
  for (int i = 0; i < 100; ++i) key.Hex("a telemetry message", hex);
  counting_allocations = false;
  CHECK(allocations == 0);
}

TEST_CASE("a decoder reusing one message reads each message as a fresh decode does") {
  TelemetryMessage restore;
  restore.type = TelemetryType::kRestore;
  restore.agent = "prey-1";
  restore.rank = 2;
  restore.checkpoint_step = 300;
  restore.skipped_steps = {400, 500};
  TelemetryMessage bye;
  bye.type = TelemetryType::kBye;
  bye.agent = "predator-0";
  bye.reason = "done, at step 9";
  TelemetryMessage beat;
  beat.type = TelemetryType::kHeartbeat;
  beat.agent = "a";
  beat.step = 7;
  beat.flops_per_sample = 2.5e12;
  beat.collective = CollectiveSnapshot{};
  beat.collective->seq = 41;
  beat.collective->op = "all_reduce";
  TelemetryMessage other_names = Metrics(0, 43, 0.25);
  other_names.metrics = {{"reward", 3}, {"flag", true}, {"nested", {{"k", {1, 2}}}}};
  const std::vector<std::string> texts = {EncodeTelemetry(Metrics(3, 42, 0.5), 17),
                                          EncodeTelemetry(restore),
                                          EncodeTelemetry(bye),
                                          EncodeTelemetry(beat),
                                          EncodeTelemetry(other_names),
                                          EncodeTelemetry(Metrics(1, 44, 1.5))};
  TelemetryDecoder decoder;
  TelemetryMessage slot;
  for (const std::string& text : texts) {
    INFO(text);
    auto fresh = DecodeTelemetry(text);
    REQUIRE(fresh.ok());
    REQUIRE(decoder.Decode(text, &slot).ok());
    CHECK(EncodeTelemetry(slot) == EncodeTelemetry(*fresh));
    // A fresh decode reads what was sent.
    CHECK(nlohmann::json::parse(EncodeTelemetry(*fresh)) == nlohmann::json::parse(text));
  }
}

TEST_CASE("a metrics report decoded into a used slot keeps only its own names") {
  TelemetryDecoder decoder;
  TelemetryMessage slot;
  TelemetryMessage m = Metrics(0, 1, 0.5);
  m.metrics = {{"loss", 1}, {"acc", 0.5}, {"phase", "train"}};
  REQUIRE(decoder.Decode(EncodeTelemetry(m), &slot).ok());
  CHECK(slot.metrics.size() == 3);
  m.metrics = {{"loss", 2.5}, {"phase", 7}};
  REQUIRE(decoder.Decode(EncodeTelemetry(m), &slot).ok());
  CHECK(slot.metrics == nlohmann::json{{"loss", 2.5}, {"phase", 7}});
  REQUIRE(
      decoder.Decode(R"({"type":"metrics","agent":"a","rank":0,"metrics":{"x":1,"x":2}})", &slot)
          .ok());
  CHECK(slot.metrics ==
        nlohmann::json{{"x", 2}});  // the last of a repeated name, as a fresh decode
  CHECK(DecodeTelemetry(R"({"type":"metrics","agent":"a","rank":0,"metrics":{"x":1,"x":2}})")
            ->metrics == slot.metrics);
  // A refused message names what is wrong, as a fresh decode does.
  const Status bad = decoder.Decode(R"({"type":"checkpoint","agent":"a","rank":0})", &slot);
  CHECK_THAT(bad.message(), Catch::Matchers::Contains("has no \"checkpoint_step\""));
  CHECK(decoder.Decode(R"({"type":"heartbeat","agent":"a","rank":0.5})", &slot).message() ==
        DecodeTelemetry(R"({"type":"heartbeat","agent":"a","rank":0.5})").status().message());
}

TEST_CASE("decoding heartbeats and metrics reports into used slots allocates nothing") {
  TelemetryMessage beat;
  beat.type = TelemetryType::kHeartbeat;
  beat.agent = "predator-0";
  beat.rank = 1;
  beat.step = 1000;
  const std::string heartbeat = EncodeTelemetry(beat, 99);
  const std::string report = EncodeTelemetry(Metrics(1, 1000, 0.125), 100);
  TelemetryMessage next = Metrics(1, 1001, 0.0625);
  next.metrics["phase"] = "evaluate";
  const std::string report2 = EncodeTelemetry(next, 101);
  TelemetryDecoder decoder;
  TelemetryMessage heartbeat_slot, report_slot;
  // The first decodes size the parser's buffers and the slots.
  REQUIRE(decoder.Decode(report2, &report_slot).ok());
  REQUIRE(decoder.Decode(heartbeat, &heartbeat_slot).ok());
  allocations = 0;
  counting_allocations = true;
  bool ok = true;
  for (int i = 0; i < 1000; ++i) {
    ok = ok && decoder.Decode(heartbeat, &heartbeat_slot).ok();
    ok = ok && decoder.Decode(i % 2 == 0 ? report : report2, &report_slot).ok();
  }
  counting_allocations = false;
  CHECK(ok);
  CHECK(allocations == 0);
  CHECK(report_slot.metrics["phase"] == "evaluate");
  CHECK(heartbeat_slot.step == 1000);
}

TEST_CASE(
    "the metrics writer writes a record's line byte for byte, without allocating for names "
    "it wrote before") {
  const std::string path = std::filesystem::temp_directory_path() /
                           ("agentrt-metrics-writer-" + std::to_string(::getpid()) + ".jsonl");
  std::filesystem::remove(path);
  std::vector<TelemetryMessage> messages = {Metrics(0, 1, 0.5), Metrics(1, 2, 0.25)};
  messages.push_back(Metrics(2, 3, 1e-7));
  messages.back().metrics = {{"loss", 1}, {"note", "a \"quoted\", \xff broken \n line"}};
  messages.push_back(Metrics(0, 4, 2.0));
  messages.back().metrics = {{"loss", 2.0}, {"nested", {{"k", {1, 2}}}}, {"on", true}};
  messages.push_back(Metrics(0, 5, 3.0));  // back to the first names
  std::string expected;
  {
    auto writer = MetricsWriter::Open(path, 1000.0);
    REQUIRE(writer.ok());
    for (const TelemetryMessage& m : messages) {
      REQUIRE((*writer)->Write(m).ok());
      expected += MetricsRecordOf(m, 1000.0).ToLine() + "\n";
    }
    const TelemetryMessage steady = Metrics(3, 6, 0.125);
    REQUIRE((*writer)->Write(steady).ok());
    expected += MetricsRecordOf(steady, 1000.0).ToLine() + "\n";
    allocations = 0;
    counting_allocations = true;
    bool ok = true;
    for (int i = 0; i < 1000; ++i) ok = ok && (*writer)->Write(steady).ok();
    counting_allocations = false;
    CHECK(ok);
    CHECK(allocations == 0);
    REQUIRE((*writer)->Flush().ok());
  }
  auto read = ReadWholeFile(path);
  REQUIRE(read.ok());
  const std::string& text = *read;
  CHECK(text.substr(0, expected.size()) == expected);
  CHECK(std::count(text.begin(), text.end(), '\n') == static_cast<long>(messages.size()) + 1001);
  std::filesystem::remove(path);
}

TEST_CASE("a sender reaches a receiver bound on a wildcard tcp port") {
  auto receiver = TelemetryReceiver::Bind("tcp://127.0.0.1:*");
  REQUIRE(receiver.ok());
  CHECK((*receiver)->endpoint().rfind("tcp://127.0.0.1:", 0) == 0);
  CHECK((*receiver)->endpoint() != "tcp://127.0.0.1:*");
  auto sender = TelemetrySender::Connect((*receiver)->endpoint());
  REQUIRE(sender.ok());
  for (int i = 0; i < 5; ++i) CHECK((*sender)->Send(Metrics(0, i, i * 0.1)));
  auto got = Receive(**receiver, 5);
  REQUIRE(got.size() == 5);
  for (int i = 0; i < 5; ++i) CHECK(got[i].step == i);  // PUSH/PULL keeps one sender's order
  CHECK((*sender)->dropped() == 0);
  CHECK((*sender)->sent() == 5);
}

TEST_CASE("a sender reaches a receiver bound on an ipc socket in the run directory") {
  std::string dir = TempDir();
  std::string endpoint = "ipc://" + dir + "/telemetry.sock";
  {
    auto receiver = TelemetryReceiver::Bind(endpoint);
    REQUIRE(receiver.ok());
    auto sender = TelemetrySender::Connect(endpoint);
    REQUIRE(sender.ok());
    TelemetryMessage hb;
    hb.type = TelemetryType::kHeartbeat;
    hb.agent = "prey-0";
    hb.rank = 1;
    REQUIRE((*sender)->Send(hb));
    REQUIRE((*sender)->SendRaw("garbage"));
    REQUIRE((*sender)->Send(hb));
    auto got = Receive(**receiver, 2);
    REQUIRE(got.size() == 2);
    CHECK(got[0].type == TelemetryType::kHeartbeat);
    CHECK(got[0].agent == "prey-0");
    CHECK((*receiver)->malformed() == 1);
  }
  std::filesystem::remove_all(dir);
}

TEST_CASE("a receiver with the run's tokens takes only messages signed by the agent they name") {
  TelemetryReceiverOptions options;
  options.tokens = {{"predator-0", DeriveAgentToken("secret", "predator-0")},
                    {"prey-0", DeriveAgentToken("secret", "prey-0")}};
  auto receiver = TelemetryReceiver::Bind("tcp://127.0.0.1:*", options);
  REQUIRE(receiver.ok());
  const std::string endpoint = (*receiver)->endpoint();

  TelemetrySenderOptions signed_options;
  signed_options.token = options.tokens["predator-0"];
  auto good = TelemetrySender::Connect(endpoint, signed_options);
  REQUIRE(good.ok());
  auto unsigned_sender = TelemetrySender::Connect(endpoint);
  REQUIRE(unsigned_sender.ok());
  TelemetrySenderOptions wrong_options;  // prey-0's token, claiming to be predator-0
  wrong_options.token = options.tokens["prey-0"];
  auto impostor = TelemetrySender::Connect(endpoint, wrong_options);
  REQUIRE(impostor.ok());

  REQUIRE((*unsigned_sender)->Send(Metrics(0, 1, 0.0)));
  REQUIRE((*impostor)->Send(Metrics(0, 2, 0.0)));
  // Signed with a guessed token, or a valid signature over other bytes.
  TelemetryMessage forged = Metrics(0, 3, 0.0);
  forged.seq = 7;
  const std::string text = EncodeTelemetry(forged);
  REQUIRE((*unsigned_sender)->SendRaw(text, HmacSha256Hex(std::string(64, '0'), text)));
  REQUIRE(
      (*unsigned_sender)->SendRaw(text, HmacSha256Hex(options.tokens["predator-0"], text + " ")));
  for (int i = 10; i < 13; ++i) REQUIRE((*good)->Send(Metrics(1, i, 0.5)));

  auto got = Receive(**receiver, 3);
  REQUIRE(got.size() == 3);
  for (int i = 0; i < 3; ++i) {
    CHECK(got[i].step == 10 + i);
    CHECK(got[i].seq > 0);
    if (i > 0) CHECK(got[i].seq > got[i - 1].seq);
  }
  // The four bad ones were counted, not dropped silently; none slipped through.
  // (They come over other connections: they may arrive after the good ones.)
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while ((*receiver)->rejected() < 4 && std::chrono::steady_clock::now() < deadline) {
    auto late = (*receiver)->Poll(milliseconds(100));
    REQUIRE(late.ok());
    CHECK(late->empty());
  }
  CHECK((*receiver)->rejected() == 4);
  CHECK((*receiver)->malformed() == 0);
}

TEST_CASE("a replayed signed message is refused; a new restart of the rank starts afresh") {
  TelemetryReceiverOptions options;
  options.tokens = {{"predator-0", DeriveAgentToken("secret", "predator-0")}};
  auto receiver = TelemetryReceiver::Bind("tcp://127.0.0.1:*", options);
  REQUIRE(receiver.ok());
  auto raw = TelemetrySender::Connect((*receiver)->endpoint());
  REQUIRE(raw.ok());
  const std::string& token = options.tokens["predator-0"];
  TelemetryMessage hb;
  hb.type = TelemetryType::kHeartbeat;
  hb.agent = "predator-0";
  hb.seq = 100;
  const std::string first = EncodeTelemetry(hb);
  REQUIRE((*raw)->SendRaw(first, HmacSha256Hex(token, first)));
  REQUIRE((*raw)->SendRaw(first, HmacSha256Hex(token, first)));  // captured and sent again
  hb.seq = 50;                                                   // older
  const std::string older = EncodeTelemetry(hb);
  REQUIRE((*raw)->SendRaw(older, HmacSha256Hex(token, older)));
  hb.restart_count = 1;  // the next incarnation numbers on its own
  const std::string next = EncodeTelemetry(hb);
  REQUIRE((*raw)->SendRaw(next, HmacSha256Hex(token, next)));
  auto got = Receive(**receiver, 2);
  REQUIRE(got.size() == 2);
  CHECK(got[0].restart_count == 0);
  CHECK(got[0].seq == 100);
  CHECK(got[1].restart_count == 1);
  CHECK(got[1].seq == 50);
  auto late = (*receiver)->Poll(milliseconds(200));
  REQUIRE(late.ok());
  CHECK(late->empty());
  CHECK((*receiver)->rejected() == 2);
}

// Run by tests/slurm/clock_offset_test.sh under the test cluster's clock shim
// (hidden here: it needs the shim to step this process's wall clock back).
TEST_CASE("a sender made after the wall clock stepped back numbers after the earlier one",
          "[.clock_step]") {
  const char* clock = std::getenv("AGENTRT_TESTCLUSTER_CLOCK_FILE");
  REQUIRE(clock != nullptr);
  // The offset the shim reads, mapped as it maps it; one store steps the clock.
  const int fd = ::open(clock, O_RDWR | O_CLOEXEC);
  REQUIRE(fd >= 0);
  void* mapped = ::mmap(nullptr, 8, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ::close(fd);
  REQUIRE(mapped != MAP_FAILED);
  auto* offset = static_cast<std::atomic<int64_t>*>(mapped);
  const auto step_clock = [&](int64_t seconds) { offset->store(seconds * 1000000000); };
  step_clock(0);
  TelemetryReceiverOptions options;
  options.tokens = {{"predator-0", DeriveAgentToken("secret", "predator-0")}};
  auto receiver = TelemetryReceiver::Bind("tcp://127.0.0.1:*", options);
  REQUIRE(receiver.ok());
  TelemetrySenderOptions signed_options;
  signed_options.token = options.tokens["predator-0"];
  for (int sender = 0; sender < 2; ++sender) {
    // The second Runtime of the same rank and restart in this process, after a step back.
    if (sender == 1) {
      const double before = UnixTimeSeconds();
      step_clock(-60);
      REQUIRE(UnixTimeSeconds() < before - 50);  // the shim is in effect
    }
    auto s = TelemetrySender::Connect((*receiver)->endpoint(), signed_options);
    REQUIRE(s.ok());
    for (int i = 0; i < 3; ++i) REQUIRE((*s)->Send(Metrics(0, 10 * sender + i, 0.5)));
    auto got = Receive(**receiver, 3);
    REQUIRE(got.size() == 3);
    CHECK(got[0].step == 10 * sender);
  }
  step_clock(0);
  ::munmap(mapped, 8);
  CHECK((*receiver)->rejected() == 0);
}

TEST_CASE("a sender with no receiver drops instead of blocking, and counts the drops") {
  // Nobody listens on this ipc path: messages queue up to the high-water mark,
  // then every further Send returns false at once.
  std::string dir = TempDir();
  TelemetrySenderOptions options;
  options.send_high_water_mark = 10;
  options.linger = milliseconds(0);
  auto sender = TelemetrySender::Connect("ipc://" + dir + "/nobody.sock", options);
  REQUIRE(sender.ok());
  auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < 1000; ++i) (*sender)->Send(Metrics(0, i, 0));
  auto elapsed = std::chrono::steady_clock::now() - start;
  CHECK(elapsed < std::chrono::seconds(5));
  CHECK((*sender)->dropped() >= 900);
  CHECK((*sender)->sent() + (*sender)->dropped() == 1000);
  sender->reset();
  std::filesystem::remove_all(dir);
}

TEST_CASE("binding an unusable endpoint fails with the endpoint in the message") {
  auto r = TelemetryReceiver::Bind("tcp://no-such-host.invalid:1");
  REQUIRE_FALSE(r.ok());
  CHECK(r.status().message().find("no-such-host.invalid") != std::string::npos);
}

TEST_CASE("metrics messages become metrics.jsonl lines with run time, agent, rank and step") {
  std::string dir = TempDir();
  std::string path = dir + "/metrics.jsonl";
  TelemetryMessage m = Metrics(1, 7, 0.25);
  double start = m.time - 2.5;
  {
    auto writer = MetricsWriter::Open(path, start);
    REQUIRE(writer.ok());
    REQUIRE((*writer)->Write(m).ok());
    TelemetryMessage hb;  // heartbeats do not land in metrics.jsonl
    hb.agent = "x";
    REQUIRE((*writer)->Write(hb).ok());
    REQUIRE((*writer)->Write(Metrics(0, 8, 0.5)).ok());
    REQUIRE((*writer)->Flush().ok());
  }
  std::ifstream in(path);
  std::string line;
  std::vector<nlohmann::json> lines;
  while (std::getline(in, line)) lines.push_back(nlohmann::json::parse(line));
  REQUIRE(lines.size() == 2);
  CHECK(lines[0]["agent"] == "predator-0");
  CHECK(lines[0]["rank"] == 1);
  CHECK(lines[0]["step"] == 7);
  CHECK(lines[0]["run_time"].get<double>() == Approx(2.5).margin(1e-6));
  CHECK(lines[0]["metrics"]["loss"].get<double>() == 0.25);
  CHECK(lines[1]["step"] == 8);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace agentrt
