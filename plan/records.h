// The records a run leaves in its run directory as JSON lines, each with one
// type that writes it and reads it back. Writers and readers (the run driver,
// the dashboard, `agentctl export`/`league`/`status`, scripts/plot_curves.py)
// go through these; a round-trip test pins every key.
//
//   RUN_DIR/metrics.jsonl          MetricsRecord, one line per metrics report
//   RUN_DIR/league/lineage.jsonl   LineageRecord, one line per PBT exploit
//   <agent workdir>/preflight.json PreflightReport, `agentctl check`'s per-agent result
//   RUN_DIR/status.json "bus"      BusSnapshot, the bus as the controller last saw it
//   RUN_DIR/bus.report.json        BrokerReport, what the run's broker process says of itself
//   a heartbeat's "collective"     CollectiveSnapshot, a rank's flight recorder
//   RUN_DIR/hangs/<agent>-<t>.json HangReport, every rank's recorder at a detected hang
//
// Plain value types; reading a file is blocking I/O.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace agentrt {

// One line of RUN_DIR/metrics.jsonl:
//   {"run_time": s since the run started, "time": unix s, "agent", "rank", "step",
//    "metrics": {name: number, ...}}
struct MetricsRecord {
  double run_time = 0;
  double time = 0;
  std::string agent;
  int rank = 0;
  int64_t step = 0;
  nlohmann::json metrics = nlohmann::json::object();

  nlohmann::json ToJson() const;
  // One line, no newline; strings that are not UTF-8 are repaired, not refused.
  std::string ToLine() const;
  // InvalidArgument naming the key that is missing or of the wrong type.
  static Result<MetricsRecord> FromJson(const nlohmann::json& json);
};

// One metric of a metrics line as read: a number (an integer keeps its
// integer value too), or any other JSON value as text (a string unescaped; an
// object, array, boolean or null as its JSON).
struct MetricValueView {
  enum class Kind { kInteger, kNumber, kString, kOther };
  std::string_view name;
  Kind kind = Kind::kNumber;
  double number = 0;      // kInteger, kNumber
  int64_t integer = 0;    // kInteger
  std::string_view text;  // kString, kOther
  bool is_number() const { return kind == Kind::kInteger || kind == Kind::kNumber; }
};

// A metrics line as read, the same fields as MetricsRecord.
struct MetricsLineView {
  std::string_view agent;
  int rank = 0;
  int64_t step = 0;
  double run_time = 0;
  double time = 0;
  std::span<const MetricValueView> metrics;
};

// Reads metrics lines without building a JSON document per line (the views
// point into the reader's buffers and stay valid until the next Parse); the
// same rules as MetricsRecord::FromJson. The dashboard's curves and `agentctl
// export` read whole runs' histories with it.
class MetricsLineReader {
 public:
  MetricsLineReader();
  ~MetricsLineReader();
  MetricsLineReader(const MetricsLineReader&) = delete;
  MetricsLineReader& operator=(const MetricsLineReader&) = delete;

  // InvalidArgument naming the key that is missing or of the wrong type, or
  // saying the line is not JSON.
  Result<MetricsLineView> Parse(std::string_view line);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Every record of a metrics.jsonl file, in order, handed to `visit` one at a
// time. A run killed mid-write leaves at most its last line torn: that line is
// skipped. Any other line that is not a record is DataLoss naming
// "<path>:<line>". NotFound when there is no file.
Status ForEachMetricsLine(const std::string& path,
                          const std::function<void(const MetricsLineView&)>& visit);
// The same, as records.
Result<std::vector<MetricsRecord>> ReadMetricsFile(const std::string& path);

// A PBT decision (scheduler/pbt.h decides): `recipient` takes `donor`'s
// weights and new hyperparameters.
struct PbtDecision {
  std::string population;
  std::string recipient;
  std::string donor;
  int64_t step = 0;  // the recipient's env step when it was judged
  double recipient_metric = 0;
  double donor_metric = 0;
  nlohmann::json old_hyperparameters = nlohmann::json::object();  // the recipient's
  nlohmann::json new_hyperparameters = nlohmann::json::object();
  nlohmann::json explore = nlohmann::json::object();  // name -> "x1.2" | "resampled"
};

// One line of RUN_DIR/league/lineage.jsonl: a PBT exploit, done or failed.
struct LineageRecord {
  static constexpr std::string_view kExploited = "exploited";
  static constexpr std::string_view kFailed = "failed";

  double time = 0;  // unix s
  PbtDecision decision;
  std::string outcome;      // kExploited or kFailed
  std::string why;          // kFailed: what went wrong; kExploited: how it was recovered
                            // (RecoverExploits), empty when written as it happened
  int64_t donor_step = -1;  // kExploited: the adopted step
  std::string archived;     // kExploited: where the recipient's own checkpoints went

  bool exploited() const { return outcome == kExploited; }
  nlohmann::json ToJson() const;
  static Result<LineageRecord> FromJson(const nlohmann::json& json);
};

// Every record of a lineage.jsonl file (none when there is no file yet). As
// with metrics.jsonl, a torn last line is skipped and any other line that is
// not a record is DataLoss naming "<path>:<line>".
Result<std::vector<LineageRecord>> ReadLineageFile(const std::string& path);

// What agentrt-preflight's rank 0 measured for its agent and writes to
// PreflightFile(<agent workdir>); `agentctl check` reads it back.
struct PreflightReport {
  struct Bus {
    std::string address;
    bool ok = false;  // every rank reached it
  };
  struct Checkpoint {
    std::string dir;
    double write_mb_s = -1;  // -1: the probe could not write
  };
  // One collective of the sweep (nccl-tests' algbw and busbw).
  struct Point {
    std::string op;
    int64_t bytes = 0;
    double time_us = 0;
    double algbw_gbps = 0;
    double busbw_gbps = 0;
  };

  std::string agent;
  int ranks = 0;
  std::vector<std::string> errors;
  std::optional<Bus> bus;  // when the agent has a bus
  std::optional<Checkpoint> checkpoint;
  std::vector<Point> sweep;
  int64_t largest_bytes = 0;  // the largest all_reduce of the sweep
  double largest_busbw_gbps = 0;
  double clock_skew_ms = 0;

  nlohmann::json ToJson() const;
  static Result<PreflightReport> FromJson(const nlohmann::json& json);
};

// The bus as the controller last saw it: the "bus" block of RUN_DIR/status.json
// (BusServer::Snapshot), shown by the dashboard and its /metrics.
struct BusSnapshot {
  struct Topic {
    std::string topic;
    int64_t earliest_offset = 0;
    int64_t end_offset = 0;  // the offset the next message gets
    int64_t retained_bytes = 0;
  };
  struct Subscriber {
    std::string agent;
    std::string topic;
    int64_t offset = 0;  // the next offset it is sent
    int64_t lag = 0;     // end_offset - offset
  };
  std::vector<Topic> topics;
  std::vector<Subscriber> subscribers;
  int64_t messages_published = 0;
  int64_t messages_delivered = 0;
  // The broker process serving the run (0: not known) and how often the
  // controller restarted it after it died.
  int64_t broker_pid = 0;
  int64_t broker_restarts = 0;

  nlohmann::json ToJson() const;
  static Result<BusSnapshot> FromJson(const nlohmann::json& json);
};

// What the run's broker process (agentrt-bus --report-file) says of itself,
// rewritten atomically while it serves (first before it writes its address):
//   {"pid", "port", "incarnation": 16 hex digits, "log_sync_errors",
//    "recovery_notes": [strings], "bus": BusSnapshot}
struct BrokerReport {
  int64_t pid = 0;
  int port = 0;
  uint64_t incarnation = 0;
  int64_t log_sync_errors = 0;              // failed fsyncs of its durable log so far
  std::vector<std::string> recovery_notes;  // what reading its log back found at start
  BusSnapshot bus;

  nlohmann::json ToJson() const;
  static Result<BrokerReport> FromJson(const nlohmann::json& json);
};

// A rank's flight recorder (agent_runtime/flight_recorder.h) as its heartbeats
// carry it (the "collective" key of a telemetry heartbeat) and hang reports
// keep it.
struct CollectiveSnapshot {
  struct Call {
    uint64_t seq = 0;
    std::string op;  // "all_reduce"
    uint64_t bytes = 0;
    std::string dtype;  // "float32"
    double start = 0;   // unix s
    double end = 0;     // 0 while running
    std::string state;  // "running", "done" or "failed"
  };
  uint64_t seq = 0;  // the last collective started (0: none yet)
  bool in = false;   // inside it now
  std::string op;    // its op ("" when none)
  double since = 0;  // its start, unix s (0: not known)
  // How long the rank has been inside it, by its steady clock (a step of the
  // node's wall clock changes `since`, not this); -1: not sent.
  double in_for_s = -1;
  double busy_s = 0;         // seconds spent in finished collectives, in all
  std::vector<Call> recent;  // the newest calls, oldest first

  nlohmann::json ToJson() const;
  static Result<CollectiveSnapshot> FromJson(const nlohmann::json& json);
};

// RUN_DIR/hangs/<agent>-<time>.json (RunDir::HangReportPath): what the
// controller knew of every rank of an agent whose group it found hung.
struct HangReport {
  struct Rank {
    int rank = 0;
    std::optional<CollectiveSnapshot> collective;  // unset: never heard one
    std::string node;                              // "" when unknown
    int64_t pid = 0;
  };
  std::string agent;
  int restart = 0;  // the agent's restart count
  double detected_unix_s = 0;
  std::string summary;  // what the controller saw, as it reported it
  std::vector<Rank> ranks;

  nlohmann::json ToJson() const;
  static Result<HangReport> FromJson(const nlohmann::json& json);
};

}  // namespace agentrt
