// The broker's publish and delivery fast paths do not allocate per message:
// this binary replaces the global operator new/delete and counts every
// allocation while a log at its retention bound takes batches of small
// messages (Broker::PublishBatch, what PublishStream calls) and a reader
// takes them back out (Broker::ReadBorrowed, what a Subscribe stream calls),
// in memory and with the durable log, the batches' entries as messages and
// packed.
#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <new>
#include <string>
#include <string_view>

#include "comms/broker.h"
#include "comms/packed_entries.h"
#include "tests/common/counting_new.h"
#include "tests/common/temp_dir.h"

namespace {

using namespace agentrt;
namespace v1 = agentrt::bus::v1;

constexpr int kBatch = 256;

// Publishes `batches` batches of kBatch 64-byte messages and reads each back
// at once; returns the allocations counted meanwhile.
// (As in a Subscribe stream, the response and its lease live as long as the reader.)
long PublishAndRead(Broker& broker, Broker::Reader& reader, v1::PublishBatchRequest& req,
                    v1::PublishBatchResponse& resp, v1::SubscribeResponse& out,
                    Broker::Lease& lease, int batches, uint64_t* seq) {
  const long before = agentrt::testing::AllocationCount();
  for (int b = 0; b < batches; ++b) {
    if (req.has_packed()) {  // the same entries packed (what the client's async publish sends)
      v1::PackedEntries& p = *req.mutable_packed();
      p.mutable_payloads()->clear();
      p.set_count(0);
      p.set_first_sequence(*seq);
      char payload[64];
      for (int k = 0; k < kBatch; ++k) {
        std::memset(payload, 'a' + k % 26, sizeof(payload));
        AppendPackedEntry(&p, std::string_view(payload, sizeof(payload)));
        ++*seq;
      }
    } else {
      for (int k = 0; k < kBatch; ++k) {
        v1::PublishRequest& e = *req.mutable_messages(k);
        e.mutable_payload()->assign(64, static_cast<char>('a' + k % 26));
        e.set_sequence((*seq)++);
      }
    }
    resp.Clear();
    REQUIRE(broker.PublishBatch("publisher", req, &resp).ok());
    REQUIRE(AnsweredEntries(resp) == kBatch);
    int64_t earliest = 0;
    int got = 0;
    while (got < kBatch) {
      lease.Release();
      out.Clear();
      REQUIRE(broker.ReadBorrowed(&reader, std::chrono::milliseconds(0), &lease, &earliest) ==
              Broker::ReadOutcome::kMessages);
      got += out.messages_size();
      REQUIRE(out.messages(out.messages_size() - 1).payload().size() == 64);
    }
  }
  return agentrt::testing::AllocationCount() - before;
}

void CheckNoAllocationPerMessage(BrokerOptions options, bool packed) {
  options.retention_messages = 2048;
  BusAcl acl;
  acl.agents = {"publisher", "reader"};
  acl.channels = {{"obs", {"publisher"}, {"reader"}}};
  Broker broker(options, acl, "secret-secret-secret-secret-0123", 42);
  std::vector<std::string> notes;
  REQUIRE(broker.Recover(&notes).ok());

  v1::PublishBatchRequest req;
  if (packed) {
    v1::PackedEntries* p = req.mutable_packed();
    p->set_topic("obs");
    p->set_content_type("application/x-obs");
    p->set_publisher_id(7);
  } else {
    for (int k = 0; k < kBatch; ++k) {
      v1::PublishRequest* e = req.add_messages();
      e->set_topic("obs");
      e->set_content_type("application/x-obs");
      e->set_publisher_id(7);
    }
  }
  v1::SubscribeRequest sub;
  sub.set_topic("obs");
  sub.mutable_start()->set_earliest(true);
  v1::SubscribeResponse::Header header;
  auto reader = broker.OpenTopicReader("reader", sub, &header);
  REQUIRE(reader.ok());
  v1::PublishBatchResponse resp;
  v1::SubscribeResponse out;
  Broker::Lease lease(&out);
  uint64_t seq = 1;
  // Warm-up: the log fills to its retention bound and every buffer reaches its size.
  const int warm_batches = 64;
  const long warm = PublishAndRead(broker, *reader, req, resp, out, lease, warm_batches, &seq);
  const int batches = 200;
  const long counted = PublishAndRead(broker, *reader, req, resp, out, lease, batches, &seq);
  INFO("warm-up: " << warm << " allocations for " << warm_batches * kBatch << " messages");
  INFO(counted << " allocations for " << batches * kBatch << " messages");
  // The counter counts: each message that filled the log to its bound allocated.
  CHECK(warm > options.retention_messages);
  CHECK(counted == 0);
}

}  // namespace

TEST_CASE("a log at its retention bound stores and delivers small messages without allocating") {
  const bool packed = GENERATE(false, true);
  INFO((packed ? "packed entries" : "messages"));
  CheckNoAllocationPerMessage(BrokerOptions{}, packed);
}

TEST_CASE("the same with the durable log (batch)") {
  const agentrt::testing::TempDir dir("agentrt-bus-alloc");
  BrokerOptions options;
  options.log_dir = dir.path;
  options.durability = BusDurability::kBatch;
  options.fsync_interval_ms = 60000;         // the fsync thread stays out of the counted window
  options.segment_bytes = int64_t{1} << 30;  // no new segment file inside it either
  const bool packed = GENERATE(false, true);
  INFO((packed ? "packed entries" : "messages"));
  CheckNoAllocationPerMessage(options, packed);
}
