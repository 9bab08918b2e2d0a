// Packed entries (comms/packed_entries.h, bus.proto PackedEntries): the
// field's codec, its validation, and the broker storing a packed batch as
// it stores the same entries as messages.
#include "comms/packed_entries.h"

#include <catch2/catch.hpp>
#include <chrono>
#include <string>
#include <string_view>
#include <vector>

#include "comms/broker.h"
#include "comms/bus_validate.h"
#include "tests/comms/bus_test_util.h"

namespace {

using namespace agentrt;
namespace v1 = agentrt::bus::v1;
using namespace std::chrono_literals;

std::vector<std::string> Entries(const v1::PackedEntries& p) {
  std::vector<std::string> out;
  PackedEntryReader r(p.payloads());
  std::string_view payload;
  while (r.Next(&payload)) out.emplace_back(payload);
  REQUIRE_FALSE(r.malformed());
  return out;
}

v1::PackedEntries Packed(const std::string& topic, const std::vector<std::string>& payloads,
                         uint64_t publisher_id = 0, uint64_t first_sequence = 0) {
  v1::PackedEntries p;
  p.set_topic(topic);
  p.set_publisher_id(publisher_id);
  p.set_first_sequence(first_sequence);
  for (const auto& payload : payloads) AppendPackedEntry(&p, payload);
  return p;
}

BusAcl TestAcl() {
  BusAcl acl;
  acl.agents = {"predator-0", "prey-0"};
  acl.channels = {{"sightings", {"predator-0"}, {"prey-0"}}};
  return acl;
}

std::vector<v1::Message> ReadAll(Broker& b, const std::string& topic) {
  v1::StartAt start;
  start.set_earliest(true);
  return agentrt::testing::ReadTopic(b, "prey-0", topic, start);
}

}  // namespace

TEST_CASE("packed entries round-trip, empty and long payloads included") {
  const std::vector<std::string> payloads = {"", "a", std::string(127, 'b'), std::string(128, 'c'),
                                             std::string(300000, 'd')};
  const v1::PackedEntries p = Packed("t", payloads);
  CHECK(p.count() == 5);
  // Lengths 0, 1, 127 take one byte, 128 two, 300000 three.
  CHECK(p.payloads().size() == 1 + (1 + 1) + (1 + 127) + (2 + 128) + (3 + 300000));
  CHECK(Entries(p) == payloads);
  v1::PackedEntries parsed;
  REQUIRE(parsed.ParseFromString(p.SerializeAsString()));
  CHECK(Entries(parsed) == payloads);
}

TEST_CASE("a torn packed field is told apart from its end") {
  v1::PackedEntries p = Packed("t", {"hello", "world"});
  std::string torn = p.payloads().substr(0, p.payloads().size() - 1);  // the last entry cut short
  PackedEntryReader r(torn);
  std::string_view payload;
  CHECK(r.Next(&payload));
  CHECK(payload == "hello");
  CHECK_FALSE(r.Next(&payload));
  CHECK(r.malformed());
  CHECK_FALSE(r.Next(&payload));  // stays there
  // A length that never ends (six continuation bytes).
  const std::string continuing(6, '\x80');
  PackedEntryReader endless(continuing);
  CHECK_FALSE(endless.Next(&payload));
  CHECK(endless.malformed());
  PackedEntryReader empty("");
  CHECK_FALSE(empty.Next(&payload));
  CHECK_FALSE(empty.malformed());
}

TEST_CASE("dropping the answered entries moves the sequences on with them") {
  v1::PackedEntries p = Packed("t", {"a", "bb", "ccc"}, /*publisher_id=*/9, /*first_sequence=*/40);
  REQUIRE(DropPackedEntries(&p, 2));
  CHECK(p.count() == 1);
  CHECK(p.first_sequence() == 42);
  CHECK(Entries(p) == std::vector<std::string>{"ccc"});
  CHECK_FALSE(DropPackedEntries(&p, 2));  // more than it has: unchanged
  CHECK(p.count() == 1);
  CHECK(Entries(p) == std::vector<std::string>{"ccc"});
  REQUIRE(DropPackedEntries(&p, 1));
  CHECK(p.count() == 0);
  CHECK(p.payloads().empty());
  // Sequences move on whenever there are any (the broker numbers them so),
  // with or without a publisher_id.
  v1::PackedEntries anonymous = Packed("t", {"a", "b"}, /*publisher_id=*/0, /*first_sequence=*/5);
  REQUIRE(DropPackedEntries(&anonymous, 1));
  CHECK(anonymous.first_sequence() == 6);
}

TEST_CASE("a packed batch unpacks into the same entries as messages") {
  v1::PublishBatchRequest req;
  *req.mutable_packed() = Packed("t", {"a", "", "c"}, /*publisher_id=*/9, /*first_sequence=*/7);
  req.mutable_packed()->set_content_type("text/plain");
  UnpackEntries(&req);
  CHECK_FALSE(req.has_packed());
  REQUIRE(req.messages_size() == 3);
  const std::vector<std::string> payloads = {"a", "", "c"};
  for (int i = 0; i < 3; ++i) {
    CHECK(req.messages(i).topic() == "t");
    CHECK(req.messages(i).payload() == payloads[static_cast<size_t>(i)]);
    CHECK(req.messages(i).content_type() == "text/plain");
    CHECK(req.messages(i).publisher_id() == 9);
    CHECK(req.messages(i).sequence() == static_cast<uint64_t>(7 + i));
  }
  CHECK(ValidatePublishBatch(req, BusLimits{}).ok());
}

TEST_CASE("packed validation names what is wrong and which entries are good") {
  BusLimits limits;
  limits.max_message_bytes = 16;
  limits.max_batch_messages = 4;
  int good = -1;
  CHECK(ValidatePackedEntries(Packed("t", {"a", "b"}, 7, 1), limits, &good).ok());
  CHECK(good == 2);

  // What concerns them all: no entry is good.
  Status s = ValidatePackedEntries(Packed("bad topic", {"a"}), limits, &good);
  CHECK(s.code() == StatusCode::kInvalidArgument);
  CHECK(good == 0);
  CHECK(ValidatePackedEntries(Packed("t", {"a"}, 7, 0), limits, &good).code() ==
        StatusCode::kInvalidArgument);  // a publisher_id with no sequence
  // The last sequence there is is one; two past it overflow.
  CHECK(ValidatePackedEntries(Packed("t", {"a"}, 7, UINT64_MAX), limits, &good).ok());
  CHECK(ValidatePackedEntries(Packed("t", {"a", "b"}, 7, UINT64_MAX), limits, &good).code() ==
        StatusCode::kInvalidArgument);
  CHECK(ValidatePackedEntries(Packed("t", {"a", "b", "c", "d", "e"}), limits, &good).code() ==
        StatusCode::kInvalidArgument);  // more than max_batch_messages
  CHECK(ValidatePackedEntries(Packed("t", {}), limits, &good).code() ==
        StatusCode::kInvalidArgument);

  // The framing: a count that does not match, bytes after the last entry, a torn entry.
  v1::PackedEntries miscounted = Packed("t", {"a", "b"});
  miscounted.set_count(3);
  s = ValidatePackedEntries(miscounted, limits, &good);
  CHECK(s.code() == StatusCode::kInvalidArgument);
  CHECK_THAT(s.message(), Catch::Contains("count says 3") && Catch::Contains("2 well-formed"));
  CHECK(good == 0);
  v1::PackedEntries trailing = Packed("t", {"a", "b"});
  trailing.mutable_payloads()->append("zz");
  trailing.set_count(2);
  CHECK_THAT(ValidatePackedEntries(trailing, limits, &good).message(),
             Catch::Contains("2 bytes more"));
  v1::PackedEntries torn = Packed("t", {"a", "bcd"});
  torn.mutable_payloads()->pop_back();
  CHECK_THAT(ValidatePackedEntries(torn, limits, &good).message(), Catch::Contains("torn"));
  CHECK(good == 0);

  // A payload over the limit: the entries before it are good.
  s = ValidatePackedEntries(Packed("t", {"a", "b", std::string(17, 'x'), "d"}), limits, &good);
  CHECK(s.code() == StatusCode::kResourceExhausted);
  CHECK_THAT(s.message(), Catch::Contains("packed entry 2") && Catch::Contains("17 bytes"));
  CHECK(good == 2);

  // A batch carries messages or packed entries, not both.
  v1::PublishBatchRequest both;
  *both.mutable_packed() = Packed("t", {"a"});
  both.add_messages()->set_topic("t");
  CHECK(ValidatePublishBatch(both, limits).code() == StatusCode::kInvalidArgument);
}

TEST_CASE("a packed batch is stored as the same entries as messages would be") {
  Broker b({}, TestAcl(), "s", 1);
  v1::PublishBatchRequest req;
  *req.mutable_packed() = Packed("sightings", {"a", "b", "c"}, /*publisher_id=*/5, 10);
  req.mutable_packed()->set_content_type("text/plain");
  v1::PublishBatchResponse resp;
  REQUIRE(b.PublishBatch("predator-0", req, &resp).ok());
  CHECK(resp.packed_entries());
  // Answered as a run stored at consecutive offsets, no ack each.
  CHECK(resp.stored() == 3);
  CHECK(resp.first_offset() == 0);
  CHECK(resp.acks_size() == 0);
  REQUIRE(AnsweredEntries(resp) == 3);
  for (int i = 0; i < 3; ++i) {
    CHECK(AnswerOf(resp, i).offset == i);
    CHECK_FALSE(AnswerOf(resp, i).duplicate);
  }
  // The same batch again (its answer lost): each entry a duplicate, nothing stored twice.
  v1::PublishBatchResponse again;
  REQUIRE(b.PublishBatch("predator-0", req, &again).ok());
  CHECK(again.stored() == 0);
  REQUIRE(AnsweredEntries(again) == 3);
  for (int i = 0; i < 3; ++i) {
    CHECK(AnswerOf(again, i).duplicate);
    CHECK(AnswerOf(again, i).offset == i);
  }
  // A duplicate inside the batch (sequence 15 stored before, as a message):
  // the run stored first ends before it, the entries after it get an ack each.
  v1::PublishBatchRequest single;
  v1::PublishRequest* m = single.add_messages();
  m->set_topic("sightings");
  m->set_payload("o");
  m->set_publisher_id(5);
  m->set_sequence(15);
  v1::PublishBatchResponse single_resp;
  REQUIRE(b.PublishBatch("predator-0", single, &single_resp).ok());
  CHECK(single_resp.stored() == 0);  // messages are answered an ack each, as ever
  REQUIRE(single_resp.acks_size() == 1);
  CHECK(single_resp.acks(0).offset() == 3);
  *req.mutable_packed() = Packed("sightings", {"d", "e", "f", "g"}, 5, 13);  // 13..16
  v1::PublishBatchResponse mixed;
  REQUIRE(b.PublishBatch("predator-0", req, &mixed).ok());
  CHECK(mixed.stored() == 2);
  CHECK(mixed.first_offset() == 4);
  REQUIRE(AnsweredEntries(mixed) == 4);
  CHECK(AnswerOf(mixed, 1).offset == 5);
  CHECK(AnswerOf(mixed, 2).duplicate);
  CHECK(AnswerOf(mixed, 2).offset == 3);
  CHECK_FALSE(AnswerOf(mixed, 3).duplicate);
  CHECK(AnswerOf(mixed, 3).offset == 6);

  const auto msgs = ReadAll(b, "sightings");
  REQUIRE(msgs.size() == 7);
  for (int i = 0; i < 3; ++i) {
    CHECK(msgs[i].offset() == i);
    CHECK(msgs[i].payload() == std::string(1, static_cast<char>('a' + i)));
    CHECK(msgs[i].publisher() == "predator-0");  // stamped by the broker
    CHECK(msgs[i].publisher_id() == 5);
    CHECK(msgs[i].sequence() == static_cast<uint64_t>(10 + i));
    CHECK(msgs[i].content_type() == "text/plain");
    CHECK(msgs[i].topic() == "sightings");
  }
  CHECK(msgs[6].payload() == "g");
  CHECK(b.Stats().duplicates_dropped == 4);
}

TEST_CASE("a packed batch stops at its first refused entry, as a batch of messages does") {
  BrokerOptions options;
  options.limits.max_message_bytes = 8;
  Broker b(options, TestAcl(), "s", 1);
  v1::PublishBatchRequest req;
  *req.mutable_packed() = Packed("sightings", {"a", "b", "far too long", "d"}, 5, 1);
  v1::PublishBatchResponse resp;
  Status s = b.PublishBatch("predator-0", req, &resp);
  CHECK(s.code() == StatusCode::kResourceExhausted);
  CHECK_THAT(s.message(), Catch::Contains("batch entry 2 (the 2 before it are stored)"));
  CHECK(resp.stored() == 2);
  CHECK(AnsweredEntries(resp) == 2);
  CHECK(ReadAll(b, "sightings").size() == 2);

  // An agent the ACL does not let publish there stores nothing.
  resp.Clear();
  *req.mutable_packed() = Packed("sightings", {"x"}, 6, 1);
  s = b.PublishBatch("prey-0", req, &resp);
  CHECK(s.code() == StatusCode::kPermissionDenied);
  CHECK_THAT(s.message(), Catch::Contains("batch entry 0"));
  CHECK(AnsweredEntries(resp) == 0);
  // Nor does a torn field, whatever its good entries.
  *req.mutable_packed() = Packed("sightings", {"x", "y"}, 7, 1);
  req.mutable_packed()->mutable_payloads()->pop_back();
  s = b.PublishBatch("predator-0", req, &resp);
  CHECK(s.code() == StatusCode::kInvalidArgument);
  CHECK_THAT(s.message(), Catch::Contains("batch entry 0"));
  CHECK(AnsweredEntries(resp) == 0);
  CHECK(ReadAll(b, "sightings").size() == 2);
  CHECK(b.Stats().rejected_invalid == 2);  // the long payload and the torn field
}
