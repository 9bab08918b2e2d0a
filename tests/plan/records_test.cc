// The run directory's JSON-lines records: each round-trips through its type,
// its readers refuse or skip what is not a record, and its keys keep to the
// documented schema (plan/records.schema.json) that scripts and the page read.
#include "plan/records.h"

#include <fmt/format.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <fstream>
#include <limits>
#include <set>

#include "tests/common/temp_dir.h"

namespace agentrt {
namespace {

using json = nlohmann::json;

MetricsRecord SomeMetrics() {
  MetricsRecord r;
  r.run_time = 12.5;
  r.time = 1764464671.25;
  r.agent = "predator";
  r.rank = 1;
  r.step = 30720;
  r.metrics = {{"episode_return_mean", 413.25}, {"loss", -0.5}};
  return r;
}

LineageRecord SomeExploit() {
  LineageRecord l;
  l.time = 1764464671.5;
  l.decision.population = "carts";
  l.decision.recipient = "cart-0";
  l.decision.donor = "cart-2";
  l.decision.step = 30720;
  l.decision.recipient_metric = 20.4;
  l.decision.donor_metric = 413.3;
  l.decision.old_hyperparameters = {{"lr", 1e-6}};
  l.decision.new_hyperparameters = {{"lr", 6e-4}};
  l.decision.explore = {{"lr", "x1.2"}};
  l.outcome = LineageRecord::kExploited;
  l.donor_step = 25600;
  l.archived = "checkpoints/cart-0/replaced-1";
  return l;
}

// `record` keeps to the schema's definition `name`: every key is declared,
// with its type, and every required key is there.
void CheckAgainstSchema(const json& record, const std::string& name) {
  std::ifstream in(AGENTRT_RECORDS_SCHEMA);
  REQUIRE(in.good());
  const json schema = json::parse(in)["$defs"][name];
  REQUIRE(schema.is_object());
  for (const auto& key : schema["required"]) CHECK(record.contains(key.get<std::string>()));
  for (const auto& [key, value] : record.items()) {
    INFO(name << "." << key);
    REQUIRE(schema["properties"].contains(key));
    const json& p = schema["properties"][key];
    if (p.contains("enum")) {
      CHECK(std::find(p["enum"].begin(), p["enum"].end(), value) != p["enum"].end());
      continue;
    }
    const std::string type = p["type"];
    if (type == "integer") CHECK(value.is_number_integer());
    if (type == "number") CHECK(value.is_number());
    if (type == "string") CHECK(value.is_string());
    if (type == "object") CHECK(value.is_object());
    if (type == "array") CHECK(value.is_array());
    if (type == "boolean") CHECK(value.is_boolean());
  }
}

TEST_CASE("a metrics record round-trips through its line and keeps to the schema") {
  const MetricsRecord r = SomeMetrics();
  auto back = MetricsRecord::FromJson(json::parse(r.ToLine()));
  REQUIRE(back.ok());
  CHECK(back->ToJson() == r.ToJson());
  CHECK(back->agent == "predator");
  CHECK(back->rank == 1);
  CHECK(back->step == 30720);
  CHECK(back->metrics["loss"] == -0.5);
  CheckAgainstSchema(r.ToJson(), "metrics_record");
}

TEST_CASE("a metrics record without its agent, step or metrics is refused by name") {
  json j = SomeMetrics().ToJson();
  j.erase("step");
  auto r = MetricsRecord::FromJson(j);
  REQUIRE_FALSE(r.ok());
  CHECK(r.status().code() == StatusCode::kInvalidArgument);
  CHECK_THAT(r.status().message(), Catch::Matchers::Contains("'step' is missing"));
  j = SomeMetrics().ToJson();
  j["metrics"] = "fast";
  CHECK_THAT(MetricsRecord::FromJson(j).status().message(),
             Catch::Matchers::Contains("'metrics' has the wrong type"));
  // A line from before rank was written reads as rank 0.
  j = SomeMetrics().ToJson();
  j.erase("rank");
  REQUIRE(MetricsRecord::FromJson(j).ok());
  CHECK(MetricsRecord::FromJson(j)->rank == 0);
}

TEST_CASE("a metrics file reads back in order; its torn last line is skipped, a bad one is not") {
  testing::TempDir dir;
  MetricsRecord second = SomeMetrics();
  second.step = 40960;
  const std::string lines = SomeMetrics().ToLine() + "\n" + second.ToLine() + "\n";
  auto read = ReadMetricsFile(dir.Write("ok.jsonl", lines + "{\"agent\": \"pre"));
  REQUIRE(read.ok());
  REQUIRE(read->size() == 2);
  CHECK((*read)[1].step == 40960);

  auto bad = ReadMetricsFile(dir.Write("bad.jsonl", "not json\n" + lines));
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.status().code() == StatusCode::kDataLoss);
  CHECK_THAT(bad.status().message(),
             Catch::Matchers::Contains("bad.jsonl:1: not a metrics record"));

  CHECK(ReadMetricsFile(dir.Path("none.jsonl")).status().code() == StatusCode::kNotFound);
}

TEST_CASE(
    "the metrics line reader reads and refuses what a metrics record's JSON reads and refuses") {
  const std::vector<std::string> good = {
      SomeMetrics().ToLine(),
      R"({"agent":"a\"b","step":3,"metrics":{"n":7,"x":-1.5e-3,"s":"q,\"\u00e9","o":{"k":[1,2]},)"
      R"("b":true,"z":null,"big":18446744073709551615},"rank":null,"time":5})",
      R"({"unknown":[1],"metrics":{},"step":0,"agent":"x"})",
  };
  MetricsLineReader reader;
  for (const std::string& line : good) {
    INFO(line);
    auto expected = MetricsRecord::FromJson(json::parse(line));
    REQUIRE(expected.ok());
    auto view = reader.Parse(line);
    REQUIRE(view.ok());
    CHECK(view->agent == expected->agent);
    CHECK(view->rank == expected->rank);
    CHECK(view->step == expected->step);
    CHECK(view->time == expected->time);
    CHECK(view->run_time == expected->run_time);
    REQUIRE(view->metrics.size() == expected->metrics.size());
    for (const MetricValueView& m : view->metrics) {
      const json& want = expected->metrics.at(std::string(m.name));
      INFO(m.name);
      const bool fits_int64 =
          want.is_number_integer() &&
          (!want.is_number_unsigned() ||
           want.get<uint64_t>() <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()));
      if (fits_int64) {
        CHECK(m.kind == MetricValueView::Kind::kInteger);
        CHECK(m.integer == want.get<int64_t>());
      } else if (want.is_number()) {
        CHECK(m.kind == MetricValueView::Kind::kNumber);
        CHECK(m.number == want.get<double>());
      } else if (want.is_string()) {
        CHECK(m.kind == MetricValueView::Kind::kString);
        CHECK(m.text == want.get<std::string>());
      } else {
        CHECK(m.kind == MetricValueView::Kind::kOther);
        CHECK(json::parse(m.text) == want);
      }
    }
  }
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"not json", "is a JSON object"},
      {"[1,2]", "is a JSON object"},
      {R"({"agent":"a","step":1,"metrics":{}} trailing)", "is a JSON object"},
      {R"({"step":1,"metrics":{}})", "'agent' is missing"},
      {R"({"agent":null,"step":1,"metrics":{}})", "'agent' is missing"},
      {R"({"agent":"a","metrics":{}})", "'step' is missing"},
      {R"({"agent":"a","step":1})", "'metrics' is missing"},
      {R"({"agent":"a","step":1.5,"metrics":{}})", "'step' has the wrong type: 1.5"},
      {R"({"agent":"a","step":"1","metrics":{}})", "'step' has the wrong type"},
      {R"({"agent":3,"step":1,"metrics":{}})", "'agent' has the wrong type: 3"},
      {R"({"agent":"a","step":1,"rank":0.5,"metrics":{}})", "'rank' has the wrong type"},
      {R"({"agent":"a","step":1,"time":"now","metrics":{}})", "'time' has the wrong type"},
      {R"({"agent":"a","step":1,"metrics":"fast"})", "'metrics' has the wrong type"},
  };
  for (const auto& [line, why] : bad) {
    INFO(line);
    CHECK_FALSE(MetricsRecord::FromJson(json::parse(line, nullptr, false)).ok());
    auto view = reader.Parse(line);
    REQUIRE_FALSE(view.ok());
    CHECK(view.status().code() == StatusCode::kInvalidArgument);
    CHECK_THAT(view.status().message(), Catch::Matchers::Contains(why));
  }
}

TEST_CASE(
    "a long metrics file reads back whole across the reader's chunks; a blank line after a "
    "bad one makes it DataLoss") {
  testing::TempDir dir;
  std::string lines;
  MetricsRecord r = SomeMetrics();
  const int count = 40000;  // about 5 MiB: more than one read
  for (int i = 0; i < count; ++i) {
    r.step = i;
    lines += r.ToLine() + "\n";
  }
  int64_t next = 0;
  bool in_order = true;
  REQUIRE(ForEachMetricsLine(dir.Write("long.jsonl", lines + "{\"agent\":"),
                             [&](const MetricsLineView& line) {
                               in_order = in_order && line.step == next;
                               ++next;
                             })
              .ok());
  CHECK(in_order);
  CHECK(next == count);

  auto bad = ReadMetricsFile(dir.Write("blank.jsonl", lines + "{\"agent\":\n\n"));
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.status().code() == StatusCode::kDataLoss);
  CHECK_THAT(bad.status().message(), Catch::Matchers::Contains(fmt::format(
                                         "blank.jsonl:{}: not a metrics record", count + 1)));
}

TEST_CASE("a lineage record round-trips, exploited or failed, and keeps to the schema") {
  const LineageRecord done = SomeExploit();
  auto back = LineageRecord::FromJson(json::parse(done.ToJson().dump()));
  REQUIRE(back.ok());
  CHECK(back->ToJson() == done.ToJson());
  CHECK(back->exploited());
  CHECK(back->donor_step == 25600);
  CheckAgainstSchema(done.ToJson(), "lineage_record");

  LineageRecord failed = SomeExploit();
  failed.outcome = LineageRecord::kFailed;
  failed.why = "no checkpoint of cart-2 verifies";
  failed.donor_step = -1;
  failed.archived.clear();
  const json j = failed.ToJson();
  CHECK_FALSE(j.contains("donor_step"));
  CHECK_FALSE(j.contains("archived"));
  auto failed_back = LineageRecord::FromJson(j);
  REQUIRE(failed_back.ok());
  CHECK_FALSE(failed_back->exploited());
  CHECK(failed_back->why == failed.why);
  CheckAgainstSchema(j, "lineage_record");
}

TEST_CASE("a lineage file skips its torn last line; no file is no exploit") {
  testing::TempDir dir;
  const std::string path =
      dir.Write("lineage.jsonl", SomeExploit().ToJson().dump() + "\n\n{\"popu");
  const auto read = ReadLineageFile(path);
  REQUIRE(read.ok());
  REQUIRE(read->size() == 1);
  CHECK((*read)[0].decision.recipient == "cart-0");
  const auto none = ReadLineageFile(dir.Path("none.jsonl"));
  REQUIRE(none.ok());
  CHECK(none->empty());
}

TEST_CASE("a lineage line that is not a record, before the last, is DataLoss naming it") {
  testing::TempDir dir;
  const std::string path =
      dir.Write("lineage.jsonl", "{\"outcome\": 3}\n" + SomeExploit().ToJson().dump() + "\n");
  const auto read = ReadLineageFile(path);
  REQUIRE_FALSE(read.ok());
  CHECK(read.status().code() == StatusCode::kDataLoss);
  CHECK_THAT(read.status().message(), Catch::Contains(path + ":1: not a lineage record"));
}

TEST_CASE("a preflight report round-trips with its bus, checkpoint and sweep") {
  PreflightReport r;
  r.agent = "predator";
  r.ranks = 2;
  r.errors = {"port 29512 is taken on node-2"};
  r.bus = PreflightReport::Bus{.address = "10.0.0.1:29400", .ok = true};
  r.checkpoint = PreflightReport::Checkpoint{.dir = "/ckpt/predator", .write_mb_s = 812.5};
  r.sweep = {{.op = "all_reduce",
              .bytes = 1 << 20,
              .time_us = 80,
              .algbw_gbps = 13.1,
              .busbw_gbps = 13.1}};
  r.largest_bytes = 1 << 20;
  r.largest_busbw_gbps = 13.1;
  r.clock_skew_ms = 0.25;
  auto back = PreflightReport::FromJson(json::parse(r.ToJson().dump()));
  REQUIRE(back.ok());
  CHECK(back->ToJson() == r.ToJson());
  REQUIRE(back->bus);
  CHECK(back->bus->ok);
  REQUIRE(back->checkpoint);
  CHECK(back->checkpoint->write_mb_s == 812.5);
  REQUIRE(back->sweep.size() == 1);
  CHECK(back->sweep[0].op == "all_reduce");
  CheckAgainstSchema(r.ToJson(), "preflight_report");

  // A rank that never reached the bus or the disk: neither block.
  PreflightReport bare;
  bare.agent = "prey";
  bare.ranks = 1;
  const json j = bare.ToJson();
  CHECK_FALSE(j.contains("bus"));
  auto bare_back = PreflightReport::FromJson(j);
  REQUIRE(bare_back.ok());
  CHECK_FALSE(bare_back->checkpoint);
  CheckAgainstSchema(j, "preflight_report");

  json wrong = r.ToJson();
  wrong["bus"]["ok"] = "yes";
  CHECK_THAT(PreflightReport::FromJson(wrong).status().message(),
             Catch::Matchers::Contains("bus: 'ok' has the wrong type"));
}

TEST_CASE("the bus block of status.json round-trips and keeps to the schema") {
  BusSnapshot b;
  b.topics = {{.topic = "policies/predator",
               .earliest_offset = 3,
               .end_offset = 41,
               .retained_bytes = 1 << 20}};
  b.subscribers = {{.agent = "prey", .topic = "policies/predator", .offset = 40, .lag = 1}};
  b.messages_published = 41;
  b.messages_delivered = 40;
  b.broker_pid = 777;
  b.broker_restarts = 1;
  auto back = BusSnapshot::FromJson(json::parse(b.ToJson().dump()));
  REQUIRE(back.ok());
  CHECK(back->ToJson() == b.ToJson());
  REQUIRE(back->subscribers.size() == 1);
  CHECK(back->subscribers[0].lag == 1);
  CheckAgainstSchema(b.ToJson(), "bus_snapshot");

  json wrong = b.ToJson();
  wrong["topics"][0].erase("end_offset");
  CHECK_THAT(BusSnapshot::FromJson(wrong).status().message(),
             Catch::Matchers::Contains("topics: 'end_offset' is missing"));
}

TEST_CASE("the broker process's report round-trips and keeps to the schema") {
  BrokerReport r;
  r.pid = 4242;
  r.port = 31007;
  r.incarnation = 0x00c0ffee12345678;
  r.log_sync_errors = 2;
  r.recovery_notes = {"bus log: cut a torn tail of topic t"};
  r.bus.topics = {{.topic = "t", .earliest_offset = 0, .end_offset = 9, .retained_bytes = 90}};
  r.bus.broker_pid = 4242;
  auto back = BrokerReport::FromJson(json::parse(r.ToJson().dump()));
  REQUIRE(back.ok());
  CHECK(back->ToJson() == r.ToJson());
  CHECK(back->incarnation == 0x00c0ffee12345678);
  CHECK(back->ToJson()["incarnation"] == "00c0ffee12345678");
  CHECK(back->recovery_notes == r.recovery_notes);
  CheckAgainstSchema(r.ToJson(), "broker_report");
  CheckAgainstSchema(r.ToJson()["bus"], "bus_snapshot");

  json wrong = r.ToJson();
  wrong["incarnation"] = "c0ffee";
  CHECK_THAT(BrokerReport::FromJson(wrong).status().message(),
             Catch::Matchers::Contains("'incarnation' is not 16 hex digits: 'c0ffee'"));
  wrong = r.ToJson();
  wrong["bus"]["topics"][0].erase("end_offset");
  CHECK_THAT(BrokerReport::FromJson(wrong).status().message(),
             Catch::Matchers::Contains("the broker report") &&
                 Catch::Matchers::Contains("'end_offset' is missing"));
  wrong = r.ToJson();
  wrong.erase("pid");
  CHECK_THAT(BrokerReport::FromJson(wrong).status().message(),
             Catch::Matchers::Contains("'pid' is missing"));
}

TEST_CASE("a flight-recorder snapshot and a hang report round-trip and keep to the schema") {
  CollectiveSnapshot c;
  c.seq = 42;
  c.in = true;
  c.op = "all_reduce";
  c.since = 1764464671.5;
  c.in_for_s = 0.75;
  c.busy_s = 12.25;
  c.recent = {{.seq = 41,
               .op = "all_reduce",
               .bytes = 4096,
               .dtype = "float32",
               .start = 1.5,
               .end = 2.5,
               .state = "done"},
              {.seq = 42,
               .op = "all_reduce",
               .bytes = 4096,
               .dtype = "float32",
               .start = 3,
               .end = 0,
               .state = "running"}};
  auto back = CollectiveSnapshot::FromJson(json::parse(c.ToJson().dump()));
  REQUIRE(back.ok());
  CHECK(back->ToJson() == c.ToJson());
  CheckAgainstSchema(c.ToJson(), "collective_snapshot");
  // No collective yet: no op, no start.
  const json none = CollectiveSnapshot().ToJson();
  CHECK_FALSE(none.contains("op"));
  CheckAgainstSchema(none, "collective_snapshot");

  HangReport h;
  h.agent = "predator";
  h.restart = 1;
  h.detected_unix_s = 1764464680;
  h.summary = "rank 1 never entered all_reduce #42 that rank 0 entered 6 s ago";
  h.ranks = {{.rank = 0, .collective = c, .node = "node-1", .pid = 4242},
             {.rank = 1, .collective = std::nullopt, .node = "", .pid = 0}};
  auto hang = HangReport::FromJson(json::parse(h.ToJson().dump()));
  REQUIRE(hang.ok());
  CHECK(hang->ToJson() == h.ToJson());
  REQUIRE(hang->ranks.size() == 2);
  REQUIRE(hang->ranks[0].collective);
  CHECK(hang->ranks[0].collective->seq == 42);
  CHECK_FALSE(hang->ranks[1].collective);
  CHECK(h.ToJson()["ranks"][1]["collective"].is_null());
  CheckAgainstSchema(h.ToJson(), "hang_report");
}

}  // namespace
}  // namespace agentrt
