// Broker logic without a transport: credentials, ACLs, validation, offsets,
// retention, duplicate suppression, inboxes and request/reply.
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <future>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "common/file_util.h"
#include "comms/auth.h"
#include "comms/broker.h"
#include "comms/bus_validate.h"
#include "plan/run_dir.h"
#include "tests/plan/plan_test_util.h"

using namespace agentrt;
namespace v1 = agentrt::bus::v1;
using namespace std::chrono_literals;

namespace {

std::filesystem::path TempDir() {
  char tmpl[] = "/tmp/agentrt-bus-unit.XXXXXX";
  REQUIRE(::mkdtemp(tmpl) != nullptr);
  return tmpl;
}

BusAcl TestAcl() {
  BusAcl acl;
  acl.agents = {"predator-0", "predator-1", "prey-0"};
  acl.channels = {
      {"sightings", {"predator-0", "predator-1"}, {"predator-0", "predator-1", "prey-0"}},
      {"policies/*", {"prey-0"}, {"prey-*"}}};
  return acl;
}

v1::PublishRequest Pub(const std::string& topic, const std::string& payload, uint64_t pid = 0,
                       uint64_t seq = 0) {
  v1::PublishRequest r;
  r.set_topic(topic);
  r.set_payload(payload);
  r.set_publisher_id(pid);
  r.set_sequence(seq);
  return r;
}

int64_t PublishOk(Broker& b, const std::string& agent, v1::PublishRequest r, bool* dup = nullptr) {
  v1::PublishResponse resp;
  Status s = b.Publish(agent, r, &resp);
  INFO(s.ToString());
  REQUIRE(s.ok());
  if (dup != nullptr) *dup = resp.duplicate();
  return resp.offset();
}

std::vector<v1::Message> ReadAll(Broker& b, Broker::Reader* r) {
  std::vector<v1::Message> out;
  for (;;) {
    v1::SubscribeResponse resp;
    int64_t earliest = 0;
    auto outcome = b.Read(r, 0ms, &resp, &earliest);
    if (outcome != Broker::ReadOutcome::kMessages) break;
    for (const auto& m : resp.messages()) out.push_back(m);
  }
  return out;
}

Broker::Reader Open(Broker& b, const std::string& agent, const std::string& topic,
                    v1::StartAt start, v1::SubscribeResponse::Header* header = nullptr) {
  v1::SubscribeRequest req;
  req.set_topic(topic);
  *req.mutable_start() = start;
  v1::SubscribeResponse::Header h;
  auto r = b.OpenTopicReader(agent, req, header ? header : &h);
  INFO(r.status().ToString());
  REQUIRE(r.ok());
  return std::move(r).value();
}

v1::StartAt Earliest() {
  v1::StartAt s;
  s.set_earliest(true);
  return s;
}

}  // namespace

TEST_CASE("an agent token is the HMAC-SHA256 of its name under the run secret") {
  // RFC 4231 test case 2: key "Jefe", data "what do ya want for nothing?".
  CHECK(DeriveAgentToken("Jefe", "what do ya want for nothing?") ==
        "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
  CHECK(DeriveAgentToken("s", "a") != DeriveAgentToken("s", "b"));
  CHECK(TokenMatches(DeriveAgentToken("s", "a"), DeriveAgentToken("s", "a")));
  CHECK_FALSE(TokenMatches(DeriveAgentToken("s", "a"), DeriveAgentToken("s", "b")));
  CHECK_FALSE(TokenMatches("", DeriveAgentToken("s", "a")));
}

TEST_CASE("token and secret files are 0600 and round-trip; a readable-by-others file is refused") {
  auto dir = TempDir();
  const std::string token_path = (dir / "predator-0.token").string();
  REQUIRE(WriteTokenFile(token_path, {"predator-0", "abc123"}).ok());
  struct stat st {};
  REQUIRE(::stat(token_path.c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == 0600);
  auto cred = ReadTokenFile(token_path);
  REQUIRE(cred.ok());
  CHECK(cred->agent == "predator-0");
  CHECK(cred->token == "abc123");
  CHECK(cred->cert_file.empty());
  // bus.mtls: the client certificate's paths round-trip too, always as a pair.
  REQUIRE(WriteTokenFile(token_path, {"predator-0", "abc123", "/s/p.client.pem", "/s/p.client.key"})
              .ok());
  cred = ReadTokenFile(token_path);
  REQUIRE(cred.ok());
  CHECK(cred->cert_file == "/s/p.client.pem");
  CHECK(cred->key_file == "/s/p.client.key");
  REQUIRE(WriteFileAtomic(token_path, R"({"agent": "a", "token": "t", "cert_file": "/c.pem"})",
                          {.mode = 0600})
              .ok());
  CHECK_THAT(ReadTokenFile(token_path).status().message(),
             Catch::Contains("\"cert_file\" and \"key_file\" go together"));

  const RunDir run(dir.string());
  auto secret = run.CreateSecret(32);
  REQUIRE(secret.ok());
  CHECK(secret->size() == 32);
  const std::string secret_path = run.SecretPath();
  REQUIRE(::stat(secret_path.c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == 0600);
  auto back = ReadSecretFile(secret_path);
  REQUIRE(back.ok());
  CHECK(*back == *secret);

  ::chmod(secret_path.c_str(), 0644);
  auto refused = ReadSecretFile(secret_path);
  REQUIRE_FALSE(refused.ok());
  CHECK(refused.status().code() == StatusCode::kPermissionDenied);
  CHECK(refused.status().message().find(secret_path) != std::string::npos);

  // An empty secret is a damaged file, the same answer from every reader.
  REQUIRE(WriteFileAtomic(secret_path, "", {.mode = 0600}).ok());
  auto empty = ReadSecretFile(secret_path);
  REQUIRE_FALSE(empty.ok());
  CHECK(empty.status().code() == StatusCode::kDataLoss);
  CHECK(run.ReadSecret().status().code() == StatusCode::kDataLoss);

  auto missing = ReadTokenFile((dir / "nope").string());
  CHECK_FALSE(missing.ok());
  std::filesystem::remove_all(dir);
}

TEST_CASE("the ACL comes from the plan and applies channel globs") {
  const Plan plan = testing::TestPlan(
      "pp", std::vector<std::string>{"predator-0", "prey-0"},
      {{"sightings", {"predator-0"}, {"predator-0", "prey-0"}}, {"policies/*", {"prey-*"}, {}}});
  const BusAcl acl = AclFromPlan(plan);
  CHECK(acl.IsAgent("prey-0"));
  CHECK_FALSE(acl.IsAgent("wolf"));
  CHECK(acl.MayPublish("predator-0", "sightings"));
  CHECK_FALSE(acl.MayPublish("prey-0", "sightings"));
  CHECK(acl.MaySubscribe("prey-0", "sightings"));
  CHECK(acl.MayPublish("prey-0", "policies/prey-0"));
  CHECK_FALSE(acl.MayPublish("predator-0", "policies/x"));
  CHECK_FALSE(acl.MaySubscribe("prey-0", "policies/x"));
}

TEST_CASE("a weight stream's delta topic is governed as its stream") {
  BusAcl acl;
  acl.agents = {"learner", "actor", "outsider"};
  acl.channels = {{"weights/learner", {"learner"}, {"actor"}, 3}};
  CHECK(acl.MayPublish("learner", "weights-delta/learner"));
  CHECK_FALSE(acl.MayPublish("actor", "weights-delta/learner"));
  CHECK(acl.MaySubscribe("actor", "weights-delta/learner"));
  CHECK_FALSE(acl.MaySubscribe("outsider", "weights-delta/learner"));
  CHECK(acl.KeepLast("weights-delta/learner") == 3);
  CHECK_FALSE(acl.MaySubscribe("actor", "weights-delta/other"));
  CHECK_FALSE(acl.MaySubscribe("actor", "xweights-delta/learner"));
  // So is its device topic (agent_runtime/device_weights.h).
  CHECK(acl.MayPublish("learner", "weights-device/learner"));
  CHECK_FALSE(acl.MayPublish("actor", "weights-device/learner"));
  CHECK(acl.MaySubscribe("actor", "weights-device/learner"));
  CHECK_FALSE(acl.MaySubscribe("outsider", "weights-device/learner"));
  CHECK(acl.KeepLast("weights-device/learner") == 3);
}

TEST_CASE("request validation names what is wrong") {
  BusLimits limits;
  limits.max_message_bytes = 16;
  CHECK(ValidatePublish(Pub("a/b-c_d.e:f", "x"), limits).ok());
  CHECK(ValidatePublish(Pub("", "x"), limits).code() == StatusCode::kInvalidArgument);
  CHECK(ValidatePublish(Pub("@inbox/x", "x"), limits).code() == StatusCode::kInvalidArgument);
  CHECK(ValidatePublish(Pub(std::string(256, 'a'), "x"), limits).code() ==
        StatusCode::kInvalidArgument);
  auto nul = ValidatePublish(Pub(std::string("a\0b", 3), "x"), limits);
  CHECK(nul.code() == StatusCode::kInvalidArgument);
  CHECK(nul.message().find("\\x00") != std::string::npos);
  auto big = ValidatePublish(Pub("t", std::string(17, 'x')), limits);
  CHECK(big.code() == StatusCode::kResourceExhausted);
  CHECK(big.message().find("17 bytes") != std::string::npos);
  CHECK(ValidatePublish(Pub("t", "x", /*pid=*/5, /*seq=*/0), limits).code() ==
        StatusCode::kInvalidArgument);
  v1::SubscribeRequest sub;
  sub.set_topic("t");
  sub.mutable_start()->set_offset(-1);
  CHECK(ValidateSubscribe(sub, limits).code() == StatusCode::kInvalidArgument);
  v1::PublishBatchRequest empty;
  CHECK_FALSE(ValidatePublishBatch(empty, limits).ok());
}

TEST_CASE("the broker refuses a wrong token, an unknown agent and publishing as someone else") {
  Broker b({}, TestAcl(), "secret", 1);
  CHECK(b.Authenticate("predator-0", DeriveAgentToken("secret", "predator-0")).ok());
  CHECK(b.Authenticate("predator-0", DeriveAgentToken("secret", "prey-0")).code() ==
        StatusCode::kUnauthenticated);
  CHECK(b.Authenticate("predator-0", "").code() == StatusCode::kUnauthenticated);
  CHECK(b.Authenticate("wolf", DeriveAgentToken("secret", "wolf")).code() ==
        StatusCode::kUnauthenticated);
  CHECK(b.Authenticate("", "x").code() == StatusCode::kUnauthenticated);
  // Fencing: once an embedder names the current launch, only it (or a caller that is no
  // launch at all) gets in.
  const std::string token = DeriveAgentToken("secret", "predator-0");
  CHECK(b.Authenticate("predator-0", token, "0.a").ok());  // no launch named yet
  b.SetIncarnation("predator-0", "1.b");
  CHECK(b.Authenticate("predator-0", token, "0.a").code() == StatusCode::kPermissionDenied);
  CHECK(b.Authenticate("predator-0", token, "1.b").ok());
  CHECK(b.Authenticate("predator-0", token).ok());

  auto as_other = Pub("sightings", "x");
  as_other.set_publisher("predator-1");
  v1::PublishResponse resp;
  CHECK(b.Publish("predator-0", as_other, &resp).code() == StatusCode::kPermissionDenied);
  auto denied = Pub("sightings", "x");
  Status s = b.Publish("prey-0", denied, &resp);
  CHECK(s.code() == StatusCode::kPermissionDenied);
  CHECK(s.message().find("prey-0") != std::string::npos);
  v1::SubscribeRequest sub;
  sub.set_topic("policies/a");
  v1::SubscribeResponse::Header h;
  CHECK(b.OpenTopicReader("predator-0", sub, &h).status().code() == StatusCode::kPermissionDenied);
  CHECK(b.Stats().rejected_permission == 3);
  CHECK(b.Stats().rejected_unauthenticated == 4);
}

TEST_CASE(
    "without a controller, the launcher's record says which launch is current: a requeued "
    "array task's launch takes over and the old one is fenced") {
  // As agentrt-bus serve --plan reads each agent's checkpoint fence.
  std::map<std::string, std::string> fence = {{"predator-0", "slurm-7.0"}};
  int asked = 0;
  bool unreadable = false;
  BrokerOptions opts;
  opts.current_launch = [&](const std::string& agent) -> Result<std::string> {
    ++asked;
    if (unreadable) return Status(StatusCode::kInternal, "EIO");
    return fence.count(agent) ? fence[agent] : std::string();
  };
  Broker b(opts, TestAcl(), "secret", 1);
  const std::string token = DeriveAgentToken("secret", "predator-0");
  CHECK(b.Authenticate("predator-0", token, "slurm-7.0").ok());
  CHECK(b.CheckIncarnation("predator-0", "slurm-7.0").ok());
  CHECK(asked == 1);  // the current launch is not asked for again
  // The task is requeued: its new launch wrote the fence before starting.
  fence["predator-0"] = "slurm-7.1";
  CHECK(b.Authenticate("predator-0", token, "slurm-7.1").ok());
  const Status old = b.CheckIncarnation("predator-0", "slurm-7.0");
  CHECK(old.code() == StatusCode::kPermissionDenied);
  CHECK(old.message().find("fenced: launch slurm-7.0 of agent predator-0 was replaced by launch "
                           "slurm-7.1") != std::string::npos);
  // A refused launch stays refused without the fence being read again.
  const int asked_before = asked;
  CHECK(b.CheckIncarnation("predator-0", "slurm-7.0").code() == StatusCode::kPermissionDenied);
  CHECK(asked == asked_before);
  // A fence that cannot be read refuses no launch for good: UNAVAILABLE, and
  // the current one goes on.
  unreadable = true;
  fence["predator-0"] = "slurm-7.2";
  const Status unknown = b.CheckIncarnation("predator-0", "slurm-7.2");
  CHECK(unknown.code() == StatusCode::kUnavailable);
  CHECK(unknown.message().find("EIO") != std::string::npos);
  CHECK(b.CheckIncarnation("predator-0", "slurm-7.1").ok());
  unreadable = false;
  CHECK(b.CheckIncarnation("predator-0", "slurm-7.2").ok());
  CHECK(b.CheckIncarnation("predator-0", "slurm-7.1").code() == StatusCode::kPermissionDenied);
  CHECK(b.Authenticate("predator-0", token).ok());  // no launch (a tool): not fenced
  // An agent whose launcher wrote no fence: its first launch seen is current.
  const std::string other = DeriveAgentToken("secret", "prey-0");
  CHECK(b.Authenticate("prey-0", other, "a").ok());
  CHECK(b.Authenticate("prey-0", other, "b").code() == StatusCode::kPermissionDenied);
  CHECK(b.Authenticate("prey-0", other, "a").ok());
}

TEST_CASE(
    "a launch replaced by one that has not called yet is refused once the fence is read again") {
  // A partitioned rank's launch goes on calling; its successor has written the
  // fence but not used the bus yet. The current launch is taken on its word
  // for at most a second (Broker::kCurrentKept), then the fence is read again.
  std::string fence = "3.old";
  int asked = 0;
  BrokerOptions opts;
  opts.current_launch = [&](const std::string&) -> Result<std::string> {
    ++asked;
    return fence;
  };
  Broker b(opts, TestAcl(), "secret", 1);
  REQUIRE(b.CheckIncarnation("predator-0", "3.old").ok());
  fence = "4.new";
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  Status s;
  while ((s = b.CheckIncarnation("predator-0", "3.old")).ok() &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  CHECK(s.code() == StatusCode::kPermissionDenied);
  CHECK(s.message().find("replaced by launch 4.new") != std::string::npos);
  CHECK(asked < 20);  // read again about once a second, not at every call
  CHECK(b.CheckIncarnation("predator-0", "4.new").ok());
}

TEST_CASE("a fence read naming a launch it replaced (a stale cache) brings that launch not back") {
  std::string fence = "slurm-8.0";
  BrokerOptions opts;
  opts.current_launch = [&](const std::string&) -> Result<std::string> { return fence; };
  Broker b(opts, TestAcl(), "secret", 1);
  CHECK(b.CheckIncarnation("predator-0", "slurm-8.0").ok());
  fence = "slurm-8.1";
  CHECK(b.CheckIncarnation("predator-0", "slurm-8.1").ok());  // 8.0 replaced
  fence = "slurm-8.0";                                        // a stale read
  const Status early = b.CheckIncarnation("predator-0", "slurm-8.2");
  CHECK(early.code() == StatusCode::kPermissionDenied);
  CHECK(early.message().find("replaced by launch slurm-8.1") != std::string::npos);
  CHECK(b.CheckIncarnation("predator-0", "slurm-8.1").ok());
}

TEST_CASE("ranks of one launch calling at once, with no fence, are all let in") {
  // Each asks the launcher's record, which is slow (a file on a shared file
  // system) and names none: the first launch seen is current.
  std::atomic<int> asking{0}, most{0};
  BrokerOptions opts;
  opts.current_launch = [&](const std::string&) -> Result<std::string> {
    const int now = ++asking;
    int seen = most.load();
    while (now > seen && !most.compare_exchange_weak(seen, now)) {
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    --asking;
    return std::string();
  };
  Broker b(opts, TestAcl(), "secret", 1);
  const std::string token = DeriveAgentToken("secret", "predator-0");
  std::vector<Status> got(8);
  std::vector<std::thread> ranks;
  for (size_t i = 0; i < got.size(); ++i)
    ranks.emplace_back([&, i] { got[i] = b.Authenticate("predator-0", token, "slurm-9.0"); });
  for (auto& t : ranks) t.join();
  for (const Status& s : got) CHECK(s.ok());
  CHECK(most == 1);  // one asker at a time: the record follows the file's order
  CHECK(b.Authenticate("predator-0", token, "slurm-9.1").code() == StatusCode::kPermissionDenied);
}

TEST_CASE("a topic assigns consecutive offsets and stamps the authenticated publisher") {
  Broker b({}, TestAcl(), "s", 1);
  for (int i = 0; i < 10; ++i)
    CHECK(PublishOk(b, "predator-0", Pub("sightings", std::to_string(i))) == i);
  auto r = Open(b, "prey-0", "sightings", Earliest());
  auto msgs = ReadAll(b, &r);
  REQUIRE(msgs.size() == 10);
  for (int i = 0; i < 10; ++i) {
    CHECK(msgs[i].offset() == i);
    CHECK(msgs[i].payload() == std::to_string(i));
    CHECK(msgs[i].publisher() == "predator-0");
    CHECK(msgs[i].topic() == "sightings");
  }
  v1::SubscribeResponse::Header h;
  auto latest = Open(b, "prey-0", "sightings", v1::StartAt(), &h);
  CHECK(h.start_offset() == 10);
  CHECK(h.end_offset() == 10);
  CHECK(ReadAll(b, &latest).empty());
}

TEST_CASE(
    "a retried publish with the same (publisher, sequence) is stored once, also out of order") {
  Broker b({}, TestAcl(), "s", 1);
  bool dup = false;
  CHECK(PublishOk(b, "predator-0", Pub("sightings", "a", 7, 1), &dup) == 0);
  CHECK_FALSE(dup);
  CHECK(PublishOk(b, "predator-0", Pub("sightings", "b", 7, 3), &dup) == 1);
  CHECK(PublishOk(b, "predator-0", Pub("sightings", "a", 7, 1), &dup) == 0);
  CHECK(dup);
  CHECK(PublishOk(b, "predator-0", Pub("sightings", "c", 7, 2), &dup) == 2);  // late but new
  CHECK_FALSE(dup);
  // Another incarnation (publisher id) of the same agent is a different stream.
  CHECK(PublishOk(b, "predator-0", Pub("sightings", "d", 8, 1), &dup) == 3);
  CHECK_FALSE(dup);
  // The same sequence from another agent is not a duplicate either.
  CHECK(PublishOk(b, "predator-1", Pub("sightings", "e", 7, 1), &dup) == 4);
  CHECK_FALSE(dup);
  // Far behind the window: refused as a duplicate rather than stored twice.
  CHECK(PublishOk(b, "predator-0", Pub("sightings", "f", 7, 100000), &dup) == 5);
  PublishOk(b, "predator-0", Pub("sightings", "g", 7, 5), &dup);
  CHECK(dup);
  CHECK(b.Stats().duplicates_dropped == 2);
  CHECK(b.Stats().messages_published == 6);
}

TEST_CASE("a topic asked for by name is listed only to an agent that may read it") {
  Broker b({}, TestAcl(), "s", 1);
  PublishOk(b, "prey-0", Pub("policies/a", "w"));
  PublishOk(b, "predator-0", Pub("sightings", "s"));
  auto mine = b.ListTopics("prey-0", "policies/a");
  REQUIRE(mine.size() == 1);
  CHECK(mine[0].topic() == "policies/a");
  CHECK(mine[0].end_offset() == 1);
  CHECK(b.ListTopics("predator-0", "policies/a").empty());  // not a subscriber
  CHECK(b.ListTopics("prey-0", "policies/b").empty());      // no such topic
  CHECK(b.ListTopics("prey-0").size() == 2);
}

TEST_CASE("retention drops the oldest messages and a reader behind it gets OFFSET_EXPIRED") {
  BrokerOptions opts;
  opts.retention_messages = 5;
  opts.retention_bytes = 1 << 20;
  Broker b(opts, TestAcl(), "s", 1);
  auto reader = Open(b, "prey-0", "sightings", Earliest());
  for (int i = 0; i < 12; ++i) PublishOk(b, "predator-0", Pub("sightings", "m"));
  v1::SubscribeResponse resp;
  int64_t earliest = -1;
  CHECK(b.Read(&reader, 0ms, &resp, &earliest) == Broker::ReadOutcome::kExpired);
  CHECK(earliest == 7);
  auto topics = b.ListTopics("prey-0");
  REQUIRE(topics.size() == 1);
  CHECK(topics[0].earliest_offset() == 7);
  CHECK(topics[0].end_offset() == 12);
  CHECK(b.Stats().messages_expired == 7);

  SECTION("the byte cap bounds retention too") {
    BrokerOptions o2;
    o2.retention_bytes = 100;
    Broker b2(o2, TestAcl(), "s", 1);
    for (int i = 0; i < 10; ++i)
      PublishOk(b2, "predator-0", Pub("sightings", std::string(30, 'x')));
    auto t = b2.ListTopics("");
    REQUIRE(t.size() == 1);
    CHECK(t[0].retained_bytes() <= 100);
    CHECK(t[0].retained_messages() == 3);
    CHECK(t[0].earliest_offset() == 7);
  }
}

TEST_CASE("a resumed reader of a restarted broker starts at the earliest offset and is told so") {
  Broker b({}, TestAcl(), "s", /*incarnation=*/42);
  PublishOk(b, "predator-0", Pub("sightings", "x"));
  v1::SubscribeRequest req;
  req.set_topic("sightings");
  req.mutable_start()->set_offset(500);
  req.set_incarnation(41);
  v1::SubscribeResponse::Header h;
  auto r = b.OpenTopicReader("prey-0", req, &h);
  REQUIRE(r.ok());
  CHECK(h.broker_restarted());
  CHECK(h.incarnation() == 42);
  CHECK(r->next_offset == 0);
  req.set_incarnation(42);
  req.mutable_start()->set_offset(1);
  auto same = b.OpenTopicReader("prey-0", req, &h);
  REQUIRE(same.ok());
  CHECK_FALSE(h.broker_restarted());
  CHECK(same->next_offset == 1);
  // The same incarnation but past the end: a log that lost its tail; said, from the end.
  req.mutable_start()->set_offset(500);
  auto past = b.OpenTopicReader("prey-0", req, &h);
  REQUIRE(past.ok());
  CHECK(h.broker_restarted());
  CHECK(past->next_offset == 1);
}

TEST_CASE("a reader waits for the next message instead of spinning") {
  Broker b({}, TestAcl(), "s", 1);
  auto r = Open(b, "prey-0", "sightings", v1::StartAt());
  auto fut = std::async(std::launch::async, [&] {
    v1::SubscribeResponse resp;
    int64_t e = 0;
    auto outcome = b.Read(&r, 10s, &resp, &e);
    return std::make_pair(outcome, resp.messages_size());
  });
  // The reader is blocked (not spinning, not returned) before the message exists.
  const auto until = std::chrono::steady_clock::now() + 10s;
  while (b.WaitingReaders("sightings") == 0 && std::chrono::steady_clock::now() < until) {
    std::this_thread::yield();
  }
  REQUIRE(b.WaitingReaders("sightings") == 1);
  REQUIRE(fut.wait_for(0s) == std::future_status::timeout);
  PublishOk(b, "predator-0", Pub("sightings", "wake"));
  REQUIRE(fut.wait_for(10s) == std::future_status::ready);
  auto [outcome, n] = fut.get();
  CHECK(outcome == Broker::ReadOutcome::kMessages);
  CHECK(n == 1);
}

TEST_CASE("inboxes take messages from any agent, readable only through the owner's reader") {
  Broker b({}, TestAcl(), "s", 1);
  v1::SendRequest send;
  send.set_to("prey-0");
  send.set_payload("hello");
  v1::SendResponse resp;
  REQUIRE(b.Send("predator-1", send, &resp).ok());
  CHECK(resp.offset() == 0);
  send.set_to("nobody");
  CHECK(b.Send("predator-1", send, &resp).code() == StatusCode::kNotFound);
  v1::ReceiveRequest rr;
  rr.mutable_start()->set_earliest(true);
  v1::SubscribeResponse::Header h;
  auto mine = b.OpenInboxReader("prey-0", rr, &h);
  REQUIRE(mine.ok());
  auto msgs = ReadAll(b, &mine.value());
  REQUIRE(msgs.size() == 1);
  CHECK(msgs[0].publisher() == "predator-1");
  CHECK(msgs[0].topic() == "@inbox/prey-0");
  auto theirs = b.OpenInboxReader("predator-0", rr, &h);
  REQUIRE(theirs.ok());
  CHECK(ReadAll(b, &theirs.value()).empty());  // its own (empty) inbox, never prey-0's
}

TEST_CASE("a request is answered only by the agent it was addressed to, before its deadline") {
  Broker b({}, TestAcl(), "s", 1);
  auto fut = std::async(std::launch::async, [&] {
    v1::RequestRequest req;
    req.set_to("prey-0");
    req.set_payload("ping");
    v1::RequestResponse resp;
    Status s = b.Request("predator-0", req, std::chrono::system_clock::now() + 10s, nullptr, &resp);
    return std::make_pair(s, resp);
  });
  v1::ReceiveRequest rr;
  rr.mutable_start()->set_earliest(true);
  v1::SubscribeResponse::Header h;
  auto inbox = b.OpenInboxReader("prey-0", rr, &h);
  REQUIRE(inbox.ok());
  v1::SubscribeResponse got;
  int64_t e = 0;
  REQUIRE(b.Read(&inbox.value(), 10s, &got, &e) == Broker::ReadOutcome::kMessages);
  const uint64_t id = got.messages(0).request_id();
  REQUIRE(id != 0);
  v1::ReplyRequest reply;
  reply.set_request_id(id);
  reply.set_payload("pong");
  CHECK(b.Reply("predator-1", reply).code() == StatusCode::kPermissionDenied);
  REQUIRE(b.Reply("prey-0", reply).ok());
  REQUIRE(fut.wait_for(10s) == std::future_status::ready);
  auto [s, resp] = fut.get();
  REQUIRE(s.ok());
  CHECK(resp.payload() == "pong");
  CHECK(resp.replier() == "prey-0");
  CHECK(b.Reply("prey-0", reply).code() == StatusCode::kNotFound);  // already answered

  v1::RequestRequest late;
  late.set_to("prey-0");
  v1::RequestResponse lr;
  CHECK(
      b.Request("predator-0", late, std::chrono::system_clock::now() + 50ms, nullptr, &lr).code() ==
      StatusCode::kDeadlineExceeded);
}

TEST_CASE(
    "a publish batch stores runs in order, drops in-batch retries and stops at the first bad "
    "entry") {
  Broker b({}, TestAcl(), "s", 1);
  v1::PublishBatchRequest batch;
  *batch.add_messages() = Pub("sightings", "a", 9, 1);
  *batch.add_messages() = Pub("sightings", "b", 9, 2);
  *batch.add_messages() = Pub("sightings", "a", 9, 1);   // retry inside the batch
  *batch.add_messages() = Pub("policies/x", "p", 9, 3);  // predator-0 may not publish here
  *batch.add_messages() = Pub("sightings", "never", 9, 4);
  v1::PublishBatchResponse resp;
  Status s = b.PublishBatch("predator-0", batch, &resp);
  CHECK(s.code() == StatusCode::kPermissionDenied);
  CHECK(s.message().find("batch entry 3") != std::string::npos);
  REQUIRE(resp.acks_size() == 3);
  CHECK(resp.acks(0).offset() == 0);
  CHECK(resp.acks(1).offset() == 1);
  CHECK(resp.acks(2).duplicate());
  CHECK(resp.acks(2).offset() == 0);
  auto r = Open(b, "prey-0", "sightings", Earliest());
  auto msgs = ReadAll(b, &r);
  REQUIRE(msgs.size() == 2);
  CHECK(msgs[1].payload() == "b");

  v1::PublishBatchRequest empty;
  CHECK(b.PublishBatch("predator-0", empty, &resp).code() == StatusCode::kInvalidArgument);
}
