// The bus's durable log (comms/bus_log.h) under the broker: records read back
// after a restart with their offsets and duplicate suppression, a torn tail
// cut and reported, a corrupt record refused with its file and offset, whole
// segments deleted by retention, the age limit.
#include "comms/bus_log.h"

#include <sys/resource.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

#include "common/file_util.h"
#include "comms/broker.h"
#include "comms/packed_entries.h"
#include "tests/common/temp_dir.h"
#include "tests/comms/bus_test_util.h"

using namespace agentrt;
namespace v1 = agentrt::bus::v1;
namespace fs = std::filesystem;
using namespace std::chrono_literals;

namespace {

const std::string kSecret = "durable-log-secret";

BusAcl OpenAcl() {
  BusAcl acl;
  acl.open = true;
  acl.agents = {"a", "b"};
  return acl;
}

BrokerOptions Durable(const std::string& dir, BusDurability d = BusDurability::kBatch) {
  BrokerOptions o;
  o.log_dir = dir;
  o.durability = d;
  o.fsync_interval_ms = 20;
  return o;
}

std::unique_ptr<Broker> Start(const BrokerOptions& o, std::vector<std::string>* notes = nullptr) {
  auto b = std::make_unique<Broker>(o, OpenAcl(), kSecret, 77);
  std::vector<std::string> ignored;
  const Status s = b->Recover(notes ? notes : &ignored);
  INFO(s.ToString());
  REQUIRE(s.ok());
  return b;
}

int64_t Publish(Broker& b, const std::string& topic, const std::string& payload, uint64_t pid = 0,
                uint64_t seq = 0, bool* duplicate = nullptr) {
  v1::PublishRequest r;
  r.set_topic(topic);
  r.set_payload(payload);
  r.set_publisher_id(pid);
  r.set_sequence(seq);
  v1::PublishResponse resp;
  const Status s = b.Publish("a", r, &resp);
  INFO(s.ToString());
  REQUIRE(s.ok());
  if (duplicate) *duplicate = resp.duplicate();
  return resp.offset();
}

// Every message of `topic` from `from` on, or the earliest offset when `from` expired.
std::vector<v1::Message> ReadFrom(Broker& b, const std::string& topic, int64_t from,
                                  int64_t* expired_earliest = nullptr) {
  v1::StartAt start;
  start.set_offset(from);
  return agentrt::testing::ReadTopic(b, "b", topic, start, expired_earliest);
}

std::vector<fs::path> Segments(const std::string& dir, const std::string& log) {
  std::vector<fs::path> out;
  for (const auto& e : fs::directory_iterator(dir + "/logs/" + EscapeLogName(log)))
    out.push_back(e.path());
  std::sort(out.begin(), out.end());
  return out;
}

// The byte position of record `n` of a segment: [u32 length][u32 crc][body]
// records after the 8-byte magic.
size_t RecordAt(const std::string& segment, int n) {
  size_t at = 8;
  for (int i = 0; i < n; ++i) {
    uint32_t len = 0;
    for (int b = 0; b < 4; ++b)
      len |= uint32_t{static_cast<unsigned char>(segment[at + b])} << (8 * b);
    at += 8 + len;
  }
  return at;
}

// Ten 100-byte records published to log "t" under `dir`; then `tamper` edits the
// bytes of its last segment, which are written back. The segment and its new bytes.
template <typename Tamper>
std::pair<fs::path, std::string> TamperedLog(const std::string& dir, Tamper tamper) {
  {
    auto b = Start(Durable(dir));
    for (int i = 0; i < 10; ++i) Publish(*b, "t", std::string(100, 'x'));
  }
  const fs::path seg = Segments(dir, "t").back();
  std::string bytes = ReadWholeFile(seg.string()).value();
  tamper(bytes);
  std::ofstream f(seg, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  return {seg, bytes};
}

}  // namespace

TEST_CASE("log names escape to safe folder names") {
  for (const std::string name : {"policies/prey", "@inbox/a.b", "..", "x:y-z_0"}) {
    const std::string e = EscapeLogName(name);
    CHECK(e.find('/') == std::string::npos);
    CHECK(e.find('.') == std::string::npos);
    auto back = UnescapeLogName(e);
    REQUIRE(back.ok());
    CHECK(*back == name);
  }
  CHECK(EscapeLogName("policies/prey") == "policies%2Fprey");
  CHECK_FALSE(UnescapeLogName("bad%4").ok());
  CHECK(ParseBusDurability("always").value() == BusDurability::kAlways);
  CHECK_THAT(ParseBusDurability("sometimes").status().message(),
             Catch::Matchers::Contains("expected memory, batch or always"));
}

TEST_CASE("a restarted broker serves the same offsets and still suppresses duplicates") {
  testing::TempDir dir("agentrt-buslog");
  for (BusDurability d : {BusDurability::kBatch, BusDurability::kAlways}) {
    const std::string root = dir.Path(std::string(BusDurabilityName(d)));
    {
      auto b = Start(Durable(root, d));
      for (int i = 0; i < 100; ++i) {
        CHECK(Publish(*b, "policies/prey", "m" + std::to_string(i), 9, i + 1) == i);
      }
      CHECK(Publish(*b, "results", "r0") == 0);
      v1::SendRequest send;
      send.set_to("b");
      send.set_payload("hello b");
      v1::SendResponse sent;
      REQUIRE(b->Send("a", send, &sent).ok());
    }
    std::vector<std::string> notes;
    auto b = Start(Durable(root, d), &notes);
    REQUIRE(notes.size() == 1);
    CHECK_THAT(notes[0], Catch::Matchers::Contains("3 topics and inboxes, 102 messages"));
    const auto msgs = ReadFrom(*b, "policies/prey", 0);
    REQUIRE(msgs.size() == 100);
    for (int i = 0; i < 100; ++i) {
      CHECK(msgs[i].offset() == i);
      CHECK(msgs[i].payload() == "m" + std::to_string(i));
      CHECK(msgs[i].publisher() == "a");
    }
    // A retry of sequence 5 after the restart is the same message, not a new one.
    bool dup = false;
    CHECK(Publish(*b, "policies/prey", "m4", 9, 5, &dup) == 4);
    CHECK(dup);
    CHECK(Publish(*b, "policies/prey", "new", 9, 101) == 100);
    CHECK(ReadFrom(*b, "results", 0).size() == 1);
    CHECK(ReadFrom(*b, "policies/prey", 98).size() == 3);
  }
}

TEST_CASE("recovery cuts a torn tail, reports it, and appends after it") {
  testing::TempDir dir("agentrt-buslog");
  {
    auto b = Start(Durable(dir.path));
    for (int i = 0; i < 10; ++i) Publish(*b, "t", std::string(100, 'a' + i));
  }
  const fs::path seg = Segments(dir.path, "t").back();
  const auto good_size = fs::file_size(seg);
  {
    std::ofstream f(seg, std::ios::app | std::ios::binary);
    const char header[8] = {100, 0, 0, 0, 1, 2, 3, 4};  // 100 bytes announced, 10 written
    f.write(header, 8);
    f.write("0123456789", 10);
  }
  std::vector<std::string> notes;
  auto b = Start(Durable(dir.path), &notes);
  REQUIRE(notes.size() == 2);
  CHECK_THAT(notes[0], Catch::Matchers::Contains("torn tail cut: " + seg.string() + " byte " +
                                                 std::to_string(good_size) + " (offset 10)"));
  CHECK_THAT(notes[0], Catch::Matchers::Contains("cut off 18 bytes"));
  CHECK(fs::file_size(seg) == good_size);
  CHECK(ReadFrom(*b, "t", 0).size() == 10);
  CHECK(Publish(*b, "t", "after") == 10);
  b.reset();
  notes.clear();
  auto again = Start(Durable(dir.path), &notes);
  CHECK(notes.size() == 1);  // only the summary: nothing torn any more
  CHECK(ReadFrom(*again, "t", 10).at(0).payload() == "after");
}

TEST_CASE("zeros after the last record (unwritten data after a crash) are a torn tail") {
  testing::TempDir dir("agentrt-buslog");
  {
    auto b = Start(Durable(dir.path));
    for (int i = 0; i < 5; ++i) Publish(*b, "t", "m" + std::to_string(i));
  }
  const fs::path seg = Segments(dir.path, "t").back();
  const auto good_size = fs::file_size(seg);
  {
    std::ofstream f(seg, std::ios::app | std::ios::binary);
    const std::string zeros(4096, '\0');
    f.write(zeros.data(), static_cast<std::streamsize>(zeros.size()));
  }
  std::vector<std::string> notes;
  auto b = Start(Durable(dir.path), &notes);
  REQUIRE(notes.size() == 2);
  CHECK_THAT(notes[0], Catch::Matchers::Contains("zeros where a record belongs"));
  CHECK(fs::file_size(seg) == good_size);
  CHECK(ReadFrom(*b, "t", 0).size() == 5);
  CHECK(Publish(*b, "t", "next") == 5);
}

TEST_CASE("a corrupt length in the middle is corrupt, not a torn tail: nothing after it is cut") {
  testing::TempDir dir("agentrt-buslog");
  // Record 2's length says far more than the file holds.
  const auto [seg, bytes] =
      TamperedLog(dir.path, [](std::string& b) { b[RecordAt(b, 2) + 3] = 0x7f; });
  Broker b(Durable(dir.path), OpenAcl(), kSecret, 77);
  std::vector<std::string> notes;
  const Status s = b.Recover(&notes);
  CHECK(s.code() == StatusCode::kDataLoss);
  CHECK_THAT(s.message(), Catch::Matchers::Contains("(offset 2)"));
  CHECK_THAT(s.message(), Catch::Matchers::Contains("no record is that size"));
  CHECK(fs::file_size(seg) == bytes.size());
}

TEST_CASE("a saved position past the end of a log that lost its tail is told, not skipped") {
  testing::TempDir dir("agentrt-buslog");
  auto b = Start(Durable(dir.path));
  for (int i = 0; i < 3; ++i) Publish(*b, "t", "m");
  v1::SubscribeRequest req;
  req.set_topic("t");
  req.mutable_start()->set_offset(10);  // a reader that had seen offsets the log no longer has
  req.set_incarnation(b->incarnation());
  v1::SubscribeResponse::Header h;
  auto r = b->OpenTopicReader("b", req, &h);
  REQUIRE(r.ok());
  CHECK(h.broker_restarted());
  CHECK(r->next_offset == 3);
}

TEST_CASE("a corrupt record in the middle is an error naming the file, byte and offset") {
  testing::TempDir dir("agentrt-buslog");
  // Flip a payload byte of offset 3.
  size_t third = 0;
  const auto [seg, bytes] = TamperedLog(dir.path, [&third](std::string& b) {
    third = RecordAt(b, 3);
    b[third + 8 + 40] ^= 0x5a;
  });
  Broker b(Durable(dir.path), OpenAcl(), kSecret, 77);
  std::vector<std::string> notes;
  const Status s = b.Recover(&notes);
  CHECK(s.code() == StatusCode::kDataLoss);
  CHECK_THAT(s.message(), Catch::Matchers::Contains(seg.string() + " byte " +
                                                    std::to_string(third) + " (offset 3)"));
  CHECK_THAT(s.message(), Catch::Matchers::Contains("failing its CRC32C"));
  CHECK_THAT(s.message(), Catch::Matchers::Contains("not a torn tail"));
  CHECK(fs::file_size(seg) == bytes.size());  // nothing cut, nothing skipped
}

TEST_CASE("retention deletes whole old segments; a reader behind it gets the earliest offset") {
  testing::TempDir dir("agentrt-buslog");
  BrokerOptions o = Durable(dir.path);
  o.segment_bytes = 4096;  // ~30 records of 100 bytes each
  o.retention_messages = 100;
  int64_t earliest_before = 0;
  {
    auto b = Start(o);
    for (int i = 0; i < 1000; ++i) Publish(*b, "t", std::string(100, 'q'));
    int64_t earliest = -1;
    CHECK(ReadFrom(*b, "t", 0, &earliest).empty());
    CHECK(earliest == 900);
    earliest_before = earliest;
    // Only segments holding retained offsets remain (at most one partly expired).
    CHECK(Segments(dir.path, "t").size() <= 100 / 30 + 2);
  }
  auto b = Start(o);
  int64_t earliest = -1;
  CHECK(ReadFrom(*b, "t", 0, &earliest).empty());
  CHECK(earliest == earliest_before);
  CHECK(ReadFrom(*b, "t", earliest).size() == 100);
  CHECK(Publish(*b, "t", "next") == 1000);
}

TEST_CASE("messages older than retention_age_s expire, even on a quiet topic") {
  testing::TempDir dir("agentrt-buslog");
  BrokerOptions o = Durable(dir.path);
  o.retention_age_s = 0.2;
  auto b = Start(o);
  Publish(*b, "t", "old");
  Publish(*b, "t", "newest");
  // The fsync thread trims by age; the newest message always stays.
  const auto deadline = std::chrono::steady_clock::now() + 10s;
  int64_t earliest = 0;
  while (std::chrono::steady_clock::now() < deadline) {
    earliest = b->ListTopics("").at(0).earliest_offset();
    if (earliest == 1) break;
    std::this_thread::sleep_for(20ms);
  }
  CHECK(earliest == 1);
}

TEST_CASE("memory durability writes no file") {
  testing::TempDir dir("agentrt-buslog");
  auto b = Start(Durable(dir.path, BusDurability::kMemory));
  Publish(*b, "t", "x");
  CHECK_FALSE(fs::exists(dir.Path("logs")));
}

TEST_CASE("a full disk refuses the publish: nothing acknowledged is missing from the log") {
  testing::TempDir dir("agentrt-buslog");
  // The file size limit stands in for a full disk: write(2) fails with EFBIG.
  struct rlimit old {};
  REQUIRE(::getrlimit(RLIMIT_FSIZE, &old) == 0);
  auto* previous = std::signal(SIGXFSZ, SIG_IGN);
  struct Restore {  // whatever fails below, the limit and the signal come back
    rlimit limit;
    void (*handler)(int);
    ~Restore() {
      ::setrlimit(RLIMIT_FSIZE, &limit);
      std::signal(SIGXFSZ, handler);
    }
  } restore{old, previous};
  int64_t acked = 0;
  Status refused;
  {
    auto b = Start(Durable(dir.path));
    struct rlimit small = old;
    small.rlim_cur = 64 << 10;
    REQUIRE(::setrlimit(RLIMIT_FSIZE, &small) == 0);
    for (int i = 0; i < 1000 && refused.ok(); ++i) {
      v1::PublishRequest r;
      r.set_topic("t");
      r.set_payload(std::string(1000, 'p'));
      v1::PublishResponse resp;
      refused = b->Publish("a", r, &resp);
      if (refused.ok()) acked = resp.offset() + 1;
    }
    // A batch that no longer fits: none of it is acknowledged or kept.
    v1::PublishBatchRequest batch;
    for (int i = 0; i < 10; ++i) {
      auto* e = batch.add_messages();
      e->set_topic("t");
      e->set_payload(std::string(1000, 'q'));
    }
    v1::PublishBatchResponse batch_resp;
    const Status batch_refused = b->PublishBatch("a", batch, &batch_resp);
    // The same as packed entries (answered as a run stored first): none either.
    v1::PublishBatchRequest packed;
    v1::PackedEntries* p = packed.mutable_packed();
    p->set_topic("t");
    p->set_publisher_id(3);
    p->set_first_sequence(1);
    for (int i = 0; i < 10; ++i) AppendPackedEntry(p, std::string(1000, 'r'));
    v1::PublishBatchResponse packed_resp;
    const Status packed_refused = b->PublishBatch("a", packed, &packed_resp);
    REQUIRE(::setrlimit(RLIMIT_FSIZE, &old) == 0);
    CHECK(batch_refused.code() == StatusCode::kUnavailable);
    CHECK(batch_resp.acks_size() == 0);
    CHECK(packed_refused.code() == StatusCode::kUnavailable);
    CHECK(AnsweredEntries(packed_resp) == 0);
    CHECK(refused.code() == StatusCode::kUnavailable);
    CHECK_THAT(refused.message(), Catch::Matchers::Contains("not stored"));
    CHECK(acked > 10);
    CHECK(b->ListTopics("").at(0).end_offset() == acked);
    // With room again, the log goes on at the next offset.
    CHECK(Publish(*b, "t", "room again") == acked);
  }
  auto b = Start(Durable(dir.path));
  const auto msgs = ReadFrom(*b, "t", 0);
  REQUIRE(msgs.size() == static_cast<size_t>(acked + 1));
  CHECK(msgs.back().payload() == "room again");
}
