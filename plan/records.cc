#include "plan/records.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <simdjson.h>
#include <unistd.h>

#include <cerrno>
#include <deque>
#include <fstream>
#include <limits>
#include <type_traits>

#include "common/random.h"
#include "plan/json_object.h"

namespace agentrt {
namespace {

using json = nlohmann::json;

// Every record of a JSON-lines file, in order: blank lines passed over, a
// torn last line (a writer killed mid-line) skipped, any other line that is
// not a Record DataLoss naming "<path>:<line>"; NotFound "<path><missing>"
// when there is no file.
template <typename Record>
Result<std::vector<Record>> ReadRecordLines(const std::string& path, std::string_view what,
                                            std::string_view missing) {
  std::ifstream in(path);
  if (!in) return NotFound(path + std::string(missing));
  std::vector<Record> out;
  std::string line;
  for (int number = 1; std::getline(in, line); ++number) {
    if (line.empty()) continue;
    auto record = Record::FromJson(json::parse(line, nullptr, /*allow_exceptions=*/false));
    if (!record.ok()) {
      if (in.peek() == EOF) break;
      return DataLoss(
          fmt::format("{}:{}: not a {}: {}", path, number, what, record.status().message()));
    }
    out.push_back(std::move(record).value());
  }
  return out;
}

// InvalidArgument "<what> is a JSON object" unless j is one.
Status RequireObject(const json& j, std::string_view what) {
  if (j.is_object()) return Status::Ok();
  return InvalidArgument(std::string(what) + " is a JSON object");
}

// Reads `key` of `j` into `out`. A missing key leaves `out` as it is unless
// `required`; a key of the wrong type is refused either way.
template <typename T>
Status Take(const json& j, const char* key, T* out, bool required = true) {
  const auto it = j.find(key);
  if (it == j.end() || it->is_null()) {
    return required ? InvalidArgument(fmt::format("'{}' is missing", key)) : Status::Ok();
  }
  bool fits = false;
  if constexpr (std::is_same_v<T, std::string>) {
    fits = it->is_string();
  } else if constexpr (std::is_same_v<T, bool>) {
    fits = it->is_boolean();
  } else if constexpr (std::is_integral_v<T>) {
    fits = it->is_number_integer();
  } else if constexpr (std::is_floating_point_v<T>) {
    fits = it->is_number();
  } else {
    fits = it->is_object();
  }
  if (!fits) return InvalidArgument(fmt::format("'{}' has the wrong type: {}", key, it->dump()));
  *out = it->template get<T>();
  return Status::Ok();
}

}  // namespace

// ---------------------------------------------------------------- metrics.jsonl

json MetricsRecord::ToJson() const {
  return {{"run_time", run_time}, {"time", time}, {"agent", agent},
          {"rank", rank},         {"step", step}, {"metrics", metrics}};
}

std::string MetricsRecord::ToLine() const {
  return ToJson().dump(-1, ' ', false, json::error_handler_t::replace);
}

Result<MetricsRecord> MetricsRecord::FromJson(const json& j) {
  AGENTRT_RETURN_IF_ERROR(RequireObject(j, "a metrics record"));
  MetricsRecord r;
  AGENTRT_RETURN_IF_ERROR(Take(j, "agent", &r.agent));
  AGENTRT_RETURN_IF_ERROR(Take(j, "step", &r.step));
  AGENTRT_RETURN_IF_ERROR(Take(j, "metrics", &r.metrics));
  AGENTRT_RETURN_IF_ERROR(Take(j, "rank", &r.rank, /*required=*/false));
  AGENTRT_RETURN_IF_ERROR(Take(j, "run_time", &r.run_time, /*required=*/false));
  AGENTRT_RETURN_IF_ERROR(Take(j, "time", &r.time, /*required=*/false));
  return r;
}

namespace {

using simdjson::dom::element_type;

Status WrongType(std::string_view key, const simdjson::dom::element& v) {
  return InvalidArgument(fmt::format("'{}' has the wrong type: {}", key, simdjson::minify(v)));
}

// An integer JSON number of `v` into `out`; anything else is the wrong type.
template <typename Int>
Status TakeInteger(std::string_view key, const simdjson::dom::element& v, Int* out) {
  int64_t value = 0;
  if (v.type() == element_type::DOUBLE || v.get_int64().get(value) != simdjson::SUCCESS ||
      value < std::numeric_limits<Int>::min() || value > std::numeric_limits<Int>::max()) {
    return WrongType(key, v);
  }
  *out = static_cast<Int>(value);
  return Status::Ok();
}

}  // namespace

// simdjson's DOM parser: its stages are chosen at run time for the CPU
// (AVX2, SSE4.2 or plain), and it keeps its buffers from line to line.
struct MetricsLineReader::Impl {
  simdjson::dom::parser parser;
  std::string padded;  // the line, with SIMDJSON_PADDING bytes of room after it
  std::vector<MetricValueView> values;
  std::deque<std::string> other;  // the JSON text of values neither numbers nor strings

  Status ReadMetrics(const simdjson::dom::element& v) {
    simdjson::dom::object metrics;
    if (v.get_object().get(metrics) != simdjson::SUCCESS) return WrongType("metrics", v);
    for (const simdjson::dom::key_value_pair field : metrics) {
      MetricValueView m;
      m.name = field.key;
      const simdjson::dom::element value = field.value;
      switch (value.type()) {
        case element_type::INT64:
          m.kind = MetricValueView::Kind::kInteger;
          m.integer = value.get_int64().value_unsafe();
          m.number = static_cast<double>(m.integer);
          break;
        case element_type::UINT64:
        case element_type::DOUBLE:
          m.kind = MetricValueView::Kind::kNumber;
          m.number = value.get_double().value_unsafe();
          break;
        case element_type::STRING:
          m.kind = MetricValueView::Kind::kString;
          m.text = value.get_string().value_unsafe();
          break;
        default:
          m.kind = MetricValueView::Kind::kOther;
          m.text = other.emplace_back(simdjson::minify(value));
          break;
      }
      values.push_back(m);
    }
    return Status::Ok();
  }
};

MetricsLineReader::MetricsLineReader() : impl_(std::make_unique<Impl>()) {}
MetricsLineReader::~MetricsLineReader() = default;

Result<MetricsLineView> MetricsLineReader::Parse(std::string_view line) {
  Impl& m = *impl_;
  m.values.clear();
  m.other.clear();
  simdjson::dom::object object;
  if (!ParseJsonObject(m.parser, m.padded, line, &object)) {
    return InvalidArgument("a metrics record is a JSON object");
  }
  MetricsLineView out;
  bool agent = false, step = false, metrics = false;
  for (const simdjson::dom::key_value_pair field : object) {
    const std::string_view key = field.key;
    const simdjson::dom::element v = field.value;
    if (v.is_null()) continue;  // as if missing
    if (key == "agent") {
      if (v.get_string().get(out.agent) != simdjson::SUCCESS) return WrongType(key, v);
      agent = true;
    } else if (key == "step") {
      AGENTRT_RETURN_IF_ERROR(TakeInteger(key, v, &out.step));
      step = true;
    } else if (key == "rank") {
      AGENTRT_RETURN_IF_ERROR(TakeInteger(key, v, &out.rank));
    } else if (key == "run_time" || key == "time") {
      double* to = key == "time" ? &out.time : &out.run_time;
      if (v.get_double().get(*to) != simdjson::SUCCESS) return WrongType(key, v);
    } else if (key == "metrics") {
      m.values.clear();
      m.other.clear();
      AGENTRT_RETURN_IF_ERROR(m.ReadMetrics(v));
      metrics = true;
    }
  }
  if (!agent) return InvalidArgument("'agent' is missing");
  if (!step) return InvalidArgument("'step' is missing");
  if (!metrics) return InvalidArgument("'metrics' is missing");
  out.metrics = m.values;
  return out;
}

Status ForEachMetricsLine(const std::string& path,
                          const std::function<void(const MetricsLineView&)>& visit) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return NotFound(path + " does not exist: is it a run directory?");
    return ErrnoStatus(errno, "read " + path);
  }
  MetricsLineReader reader;
  std::string text;
  std::string chunk(size_t{4} << 20, '\0');
  int number = 0;
  std::optional<Status> torn;  // a bad line: fine only as the file's last bytes
  Status result = Status::Ok();
  auto line_of = [&](std::string_view line) {
    ++number;
    if (torn) {  // anything after a bad line: it was not a torn last line
      result = *torn;
      return false;
    }
    if (line.empty()) return true;
    auto r = reader.Parse(line);
    if (!r.ok()) {
      torn = DataLoss(
          fmt::format("{}:{}: not a metrics record: {}", path, number, r.status().message()));
      return true;
    }
    visit(*r);
    return true;
  };
  for (;;) {
    const ssize_t n = ::read(fd, chunk.data(), chunk.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      result = ErrnoStatus(errno, "read " + path);
      break;
    }
    if (n == 0) {
      if (!text.empty()) line_of(text);
      break;
    }
    text.append(chunk.data(), static_cast<size_t>(n));
    size_t start = 0;
    bool go_on = true;
    for (size_t nl = text.find('\n'); go_on && nl != std::string::npos;
         nl = text.find('\n', start)) {
      go_on = line_of(std::string_view(text).substr(start, nl - start));
      start = nl + 1;
    }
    if (!go_on) break;
    text.erase(0, start);
  }
  ::close(fd);
  return result;
}

Result<std::vector<MetricsRecord>> ReadMetricsFile(const std::string& path) {
  std::vector<MetricsRecord> out;
  AGENTRT_RETURN_IF_ERROR(ForEachMetricsLine(path, [&](const MetricsLineView& line) {
    MetricsRecord r;
    r.run_time = line.run_time;
    r.time = line.time;
    r.agent = line.agent;
    r.rank = line.rank;
    r.step = line.step;
    for (const MetricValueView& m : line.metrics) {
      nlohmann::json& v = r.metrics[std::string(m.name)];
      switch (m.kind) {
        case MetricValueView::Kind::kInteger:
          v = m.integer;
          break;
        case MetricValueView::Kind::kNumber:
          v = m.number;
          break;
        case MetricValueView::Kind::kString:
          v = std::string(m.text);
          break;
        case MetricValueView::Kind::kOther:
          v = nlohmann::json::parse(m.text, nullptr, /*allow_exceptions=*/false);
          break;
      }
    }
    out.push_back(std::move(r));
  }));
  return out;
}

// ---------------------------------------------------------------- lineage.jsonl

json LineageRecord::ToJson() const {
  const PbtDecision& d = decision;
  json j = {{"time", time},
            {"population", d.population},
            {"recipient", d.recipient},
            {"donor", d.donor},
            {"step", d.step},
            {"recipient_metric", d.recipient_metric},
            {"donor_metric", d.donor_metric},
            {"old", d.old_hyperparameters},
            {"new", d.new_hyperparameters},
            {"explore", d.explore},
            {"outcome", outcome}};
  if (!why.empty()) j["why"] = why;
  if (donor_step >= 0) j["donor_step"] = donor_step;
  if (!archived.empty()) j["archived"] = archived;
  return j;
}

Result<LineageRecord> LineageRecord::FromJson(const json& j) {
  AGENTRT_RETURN_IF_ERROR(RequireObject(j, "a lineage record"));
  LineageRecord r;
  AGENTRT_RETURN_IF_ERROR(Take(j, "population", &r.decision.population));
  AGENTRT_RETURN_IF_ERROR(Take(j, "recipient", &r.decision.recipient));
  AGENTRT_RETURN_IF_ERROR(Take(j, "donor", &r.decision.donor));
  AGENTRT_RETURN_IF_ERROR(Take(j, "outcome", &r.outcome));
  AGENTRT_RETURN_IF_ERROR(Take(j, "step", &r.decision.step));
  AGENTRT_RETURN_IF_ERROR(Take(j, "time", &r.time, /*required=*/false));
  AGENTRT_RETURN_IF_ERROR(Take(j, "recipient_metric", &r.decision.recipient_metric, false));
  AGENTRT_RETURN_IF_ERROR(Take(j, "donor_metric", &r.decision.donor_metric, false));
  AGENTRT_RETURN_IF_ERROR(Take(j, "old", &r.decision.old_hyperparameters, false));
  AGENTRT_RETURN_IF_ERROR(Take(j, "new", &r.decision.new_hyperparameters, false));
  AGENTRT_RETURN_IF_ERROR(Take(j, "explore", &r.decision.explore, false));
  AGENTRT_RETURN_IF_ERROR(Take(j, "why", &r.why, false));
  AGENTRT_RETURN_IF_ERROR(Take(j, "donor_step", &r.donor_step, false));
  AGENTRT_RETURN_IF_ERROR(Take(j, "archived", &r.archived, false));
  return r;
}

Result<std::vector<LineageRecord>> ReadLineageFile(const std::string& path) {
  auto records = ReadRecordLines<LineageRecord>(path, "lineage record", " does not exist");
  if (records.status().code() == StatusCode::kNotFound) return std::vector<LineageRecord>{};
  return records;
}

// ---------------------------------------------------------------- preflight.json

json PreflightReport::ToJson() const {
  json j = {{"agent", agent}, {"ranks", ranks}, {"errors", errors}};
  if (bus) j["bus"] = {{"address", bus->address}, {"ok", bus->ok}};
  if (checkpoint)
    j["checkpoint"] = {{"dir", checkpoint->dir}, {"write_mb_s", checkpoint->write_mb_s}};
  j["sweep"] = json::array();
  for (const Point& p : sweep) {
    j["sweep"].push_back({{"op", p.op},
                          {"bytes", p.bytes},
                          {"time_us", p.time_us},
                          {"algbw_gbps", p.algbw_gbps},
                          {"busbw_gbps", p.busbw_gbps}});
  }
  j["largest_bytes"] = largest_bytes;
  j["largest_busbw_gbps"] = largest_busbw_gbps;
  j["clock_skew_ms"] = clock_skew_ms;
  return j;
}

Result<PreflightReport> PreflightReport::FromJson(const json& j) {
  AGENTRT_RETURN_IF_ERROR(RequireObject(j, "a preflight report"));
  PreflightReport r;
  AGENTRT_RETURN_IF_ERROR(Take(j, "agent", &r.agent));
  AGENTRT_RETURN_IF_ERROR(Take(j, "ranks", &r.ranks));
  const auto errors = j.find("errors");
  if (errors == j.end() || !errors->is_array()) return InvalidArgument("'errors' is not a list");
  for (const json& e : *errors) {
    if (!e.is_string()) return InvalidArgument("'errors' holds a non-string: " + e.dump());
    r.errors.push_back(e.get<std::string>());
  }
  if (const auto b = j.find("bus"); b != j.end()) {
    Bus bus;
    AGENTRT_RETURN_IF_ERROR(Take(*b, "address", &bus.address).WithContext("bus"));
    AGENTRT_RETURN_IF_ERROR(Take(*b, "ok", &bus.ok).WithContext("bus"));
    r.bus = std::move(bus);
  }
  if (const auto c = j.find("checkpoint"); c != j.end()) {
    Checkpoint ck;
    AGENTRT_RETURN_IF_ERROR(Take(*c, "dir", &ck.dir).WithContext("checkpoint"));
    AGENTRT_RETURN_IF_ERROR(Take(*c, "write_mb_s", &ck.write_mb_s).WithContext("checkpoint"));
    r.checkpoint = std::move(ck);
  }
  if (const auto s = j.find("sweep"); s != j.end() && s->is_array()) {
    for (const json& p : *s) {
      Point point;
      AGENTRT_RETURN_IF_ERROR(Take(p, "op", &point.op).WithContext("sweep"));
      AGENTRT_RETURN_IF_ERROR(Take(p, "bytes", &point.bytes).WithContext("sweep"));
      AGENTRT_RETURN_IF_ERROR(Take(p, "time_us", &point.time_us).WithContext("sweep"));
      AGENTRT_RETURN_IF_ERROR(Take(p, "algbw_gbps", &point.algbw_gbps).WithContext("sweep"));
      AGENTRT_RETURN_IF_ERROR(Take(p, "busbw_gbps", &point.busbw_gbps).WithContext("sweep"));
      r.sweep.push_back(std::move(point));
    }
  }
  AGENTRT_RETURN_IF_ERROR(Take(j, "largest_bytes", &r.largest_bytes, /*required=*/false));
  AGENTRT_RETURN_IF_ERROR(Take(j, "largest_busbw_gbps", &r.largest_busbw_gbps, false));
  AGENTRT_RETURN_IF_ERROR(Take(j, "clock_skew_ms", &r.clock_skew_ms, false));
  return r;
}

// ---------------------------------------------------------------- status.json "bus"

json BusSnapshot::ToJson() const {
  json j = {{"topics", json::array()},
            {"subscribers", json::array()},
            {"messages_published", messages_published},
            {"messages_delivered", messages_delivered},
            {"broker_pid", broker_pid},
            {"broker_restarts", broker_restarts}};
  for (const Topic& t : topics) {
    j["topics"].push_back({{"topic", t.topic},
                           {"earliest_offset", t.earliest_offset},
                           {"end_offset", t.end_offset},
                           {"retained_bytes", t.retained_bytes}});
  }
  for (const Subscriber& s : subscribers) {
    j["subscribers"].push_back(
        {{"agent", s.agent}, {"topic", s.topic}, {"offset", s.offset}, {"lag", s.lag}});
  }
  return j;
}

Result<BusSnapshot> BusSnapshot::FromJson(const json& j) {
  AGENTRT_RETURN_IF_ERROR(RequireObject(j, "the bus block"));
  BusSnapshot b;
  for (const json& t : j.value("topics", json::array())) {
    Topic topic;
    AGENTRT_RETURN_IF_ERROR(Take(t, "topic", &topic.topic).WithContext("topics"));
    AGENTRT_RETURN_IF_ERROR(
        Take(t, "earliest_offset", &topic.earliest_offset).WithContext("topics"));
    AGENTRT_RETURN_IF_ERROR(Take(t, "end_offset", &topic.end_offset).WithContext("topics"));
    AGENTRT_RETURN_IF_ERROR(Take(t, "retained_bytes", &topic.retained_bytes).WithContext("topics"));
    b.topics.push_back(std::move(topic));
  }
  for (const json& s : j.value("subscribers", json::array())) {
    Subscriber sub;
    AGENTRT_RETURN_IF_ERROR(Take(s, "agent", &sub.agent).WithContext("subscribers"));
    AGENTRT_RETURN_IF_ERROR(Take(s, "topic", &sub.topic).WithContext("subscribers"));
    AGENTRT_RETURN_IF_ERROR(Take(s, "offset", &sub.offset).WithContext("subscribers"));
    AGENTRT_RETURN_IF_ERROR(Take(s, "lag", &sub.lag).WithContext("subscribers"));
    b.subscribers.push_back(std::move(sub));
  }
  AGENTRT_RETURN_IF_ERROR(Take(j, "messages_published", &b.messages_published, false));
  AGENTRT_RETURN_IF_ERROR(Take(j, "messages_delivered", &b.messages_delivered, false));
  AGENTRT_RETURN_IF_ERROR(Take(j, "broker_pid", &b.broker_pid, false));
  AGENTRT_RETURN_IF_ERROR(Take(j, "broker_restarts", &b.broker_restarts, false));
  return b;
}

json BrokerReport::ToJson() const {
  return {{"pid", pid},
          {"port", port},
          {"incarnation", Hex64(incarnation)},
          {"log_sync_errors", log_sync_errors},
          {"recovery_notes", recovery_notes},
          {"bus", bus.ToJson()}};
}

Result<BrokerReport> BrokerReport::FromJson(const json& j) {
  AGENTRT_RETURN_IF_ERROR(RequireObject(j, "the broker report"));
  BrokerReport r;
  std::string incarnation;
  const char* const what = "the broker report";
  AGENTRT_RETURN_IF_ERROR(Take(j, "pid", &r.pid).WithContext(what));
  AGENTRT_RETURN_IF_ERROR(Take(j, "port", &r.port).WithContext(what));
  AGENTRT_RETURN_IF_ERROR(Take(j, "incarnation", &incarnation).WithContext(what));
  AGENTRT_RETURN_IF_ERROR(Take(j, "log_sync_errors", &r.log_sync_errors).WithContext(what));
  for (const json& note : j.value("recovery_notes", json::array())) {
    if (!note.is_string()) {
      return InvalidArgument("the broker report: a recovery note is not a string: " + note.dump());
    }
    r.recovery_notes.push_back(note.get<std::string>());
  }
  const std::optional<uint64_t> parsed = ParseHex64(incarnation);
  if (!parsed) {
    return InvalidArgument("the broker report: 'incarnation' is not 16 hex digits: '" +
                           incarnation + "'");
  }
  r.incarnation = *parsed;
  if (!j.contains("bus")) return InvalidArgument("the broker report: 'bus' is missing");
  auto bus = BusSnapshot::FromJson(j["bus"]);
  if (!bus.ok()) return bus.status().WithContext(what);
  r.bus = std::move(bus).value();
  return r;
}

// ---------------------------------------------------------------- flight recorder, hangs

json CollectiveSnapshot::ToJson() const {
  json j = {{"seq", seq}, {"in", in}, {"busy_s", busy_s}, {"recent", json::array()}};
  if (seq > 0) {
    j["op"] = op;
    j["since"] = since;
  }
  if (in && in_for_s >= 0) j["in_for_s"] = in_for_s;
  for (const Call& c : recent) {
    j["recent"].push_back({{"seq", c.seq},
                           {"op", c.op},
                           {"bytes", c.bytes},
                           {"dtype", c.dtype},
                           {"start", c.start},
                           {"end", c.end},
                           {"state", c.state}});
  }
  return j;
}

Result<CollectiveSnapshot> CollectiveSnapshot::FromJson(const json& j) {
  AGENTRT_RETURN_IF_ERROR(RequireObject(j, "a collective snapshot"));
  CollectiveSnapshot s;
  AGENTRT_RETURN_IF_ERROR(Take(j, "seq", &s.seq));
  AGENTRT_RETURN_IF_ERROR(Take(j, "in", &s.in, /*required=*/false));
  AGENTRT_RETURN_IF_ERROR(Take(j, "op", &s.op, false));
  AGENTRT_RETURN_IF_ERROR(Take(j, "since", &s.since, false));
  AGENTRT_RETURN_IF_ERROR(Take(j, "in_for_s", &s.in_for_s, false));
  AGENTRT_RETURN_IF_ERROR(Take(j, "busy_s", &s.busy_s, false));
  for (const json& c : j.value("recent", json::array())) {
    Call call;
    AGENTRT_RETURN_IF_ERROR(Take(c, "seq", &call.seq).WithContext("recent"));
    AGENTRT_RETURN_IF_ERROR(Take(c, "op", &call.op).WithContext("recent"));
    AGENTRT_RETURN_IF_ERROR(Take(c, "bytes", &call.bytes, false).WithContext("recent"));
    AGENTRT_RETURN_IF_ERROR(Take(c, "dtype", &call.dtype, false).WithContext("recent"));
    AGENTRT_RETURN_IF_ERROR(Take(c, "start", &call.start, false).WithContext("recent"));
    AGENTRT_RETURN_IF_ERROR(Take(c, "end", &call.end, false).WithContext("recent"));
    AGENTRT_RETURN_IF_ERROR(Take(c, "state", &call.state, false).WithContext("recent"));
    s.recent.push_back(std::move(call));
  }
  return s;
}

json HangReport::ToJson() const {
  json j = {{"agent", agent},
            {"restart", restart},
            {"detected_unix_s", detected_unix_s},
            {"summary", summary},
            {"ranks", json::array()}};
  for (const Rank& r : ranks) {
    json rank = {{"rank", r.rank}, {"collective", r.collective ? r.collective->ToJson() : json()}};
    if (!r.node.empty()) rank["node"] = r.node;
    if (r.pid > 0) rank["pid"] = r.pid;
    j["ranks"].push_back(std::move(rank));
  }
  return j;
}

Result<HangReport> HangReport::FromJson(const json& j) {
  AGENTRT_RETURN_IF_ERROR(RequireObject(j, "a hang report"));
  HangReport h;
  AGENTRT_RETURN_IF_ERROR(Take(j, "agent", &h.agent));
  AGENTRT_RETURN_IF_ERROR(Take(j, "summary", &h.summary));
  AGENTRT_RETURN_IF_ERROR(Take(j, "restart", &h.restart, /*required=*/false));
  AGENTRT_RETURN_IF_ERROR(Take(j, "detected_unix_s", &h.detected_unix_s, false));
  for (const json& r : j.value("ranks", json::array())) {
    Rank rank;
    AGENTRT_RETURN_IF_ERROR(Take(r, "rank", &rank.rank).WithContext("ranks"));
    AGENTRT_RETURN_IF_ERROR(Take(r, "node", &rank.node, false).WithContext("ranks"));
    AGENTRT_RETURN_IF_ERROR(Take(r, "pid", &rank.pid, false).WithContext("ranks"));
    if (const auto c = r.find("collective"); c != r.end() && !c->is_null()) {
      AGENTRT_ASSIGN_OR_RETURN(rank.collective, CollectiveSnapshot::FromJson(*c));
    }
    h.ranks.push_back(std::move(rank));
  }
  return h;
}

}  // namespace agentrt
