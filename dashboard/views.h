// What the dashboard serves, as plain functions of a run directory's files
// (plan.json, status.json, metrics.jsonl, checkpoint manifests), so that they
// are testable without a server:
//
//   RunView          the run and its agents for the page: status, each rank's
//                    heartbeat age, the last checkpoint's age, nodes, GPUs
//                    and ports from the plan (the partition map)
//   PrometheusText   GET /metrics, the Prometheus text exposition format
//   MetricSeries     metrics.jsonl indexed by (agent, metric), read
//                    incrementally as the run appends to it, and decimated
//                    for a chart (per bucket the first, min and max points)
//
// Thread-safety: the functions are pure; MetricSeries is internally locked.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "common/status.h"
#include "plan/plan.h"
#include "plan/records.h"
#include "scheduler/league.h"
#include "scheduler/status.h"

namespace agentrt {

// The run's files read once; `now_unix_s` for ages.
struct RunSnapshot {
  std::shared_ptr<const Plan> plan = std::make_shared<const Plan>();  // never null
  RunStatus status;
  bool controller_alive = false;
  std::map<std::string, double> checkpoint_unix_s;  // agent -> its last checkpoint's commit time
  std::optional<LeagueState> league;                // the league's last commit (plan.league)
  std::vector<LineageRecord> lineage;               // PBT exploits (RUN_DIR/league/lineage.jsonl)
};

// plan.json as last read, read again only when the file was replaced (a run's
// plan changes on failover and PBT, not per request): a dashboard keeps one,
// so a request at 10,000 agents does not parse megabytes of plan each time.
// Thread-safe.
class PlanCache {
 public:
  Result<std::shared_ptr<const Plan>> Get(const std::string& path);

 private:
  std::mutex mu_;
  std::tuple<uint64_t, int64_t, int64_t> key_{0, -1, -1};  // inode, mtime ns, size
  std::shared_ptr<const Plan> plan_;
};

// `plans`: where plan.json is kept between reads (nullptr: read every time).
Result<RunSnapshot> ReadRunSnapshot(const std::string& run_dir, PlanCache* plans = nullptr);

// Modification time of `path` in ns since the Unix epoch, or -1 when it cannot be read.
int64_t FileMTimeNs(const std::string& path);

nlohmann::json RunView(const RunSnapshot& run, double now_unix_s);
std::string PrometheusText(const RunSnapshot& run, double now_unix_s);

// The metric curves of metrics.jsonl, read incrementally, in bounded memory:
// a series (one agent's metric) holds at most kMaxPoints points; when full,
// each pair of neighbours becomes one (the first step, the mean value), so the
// older history is coarser. Nothing is dropped unsaid: Query tells each
// series' `total` points read and how many of them were `merged` away.
class MetricSeries {
 public:
  static constexpr size_t kMaxPoints = 1024;

  explicit MetricSeries(std::string metrics_path) : path_(std::move(metrics_path)) {}

  // Reads what was appended since the last call (a partial last line waits).
  Status Refresh();
  // Metric names per agent.
  std::map<std::string, std::vector<std::string>> Names();
  // (step, value) of `metric` for each agent of `agents` (all when empty),
  // at most about `max_points` per agent, with the series' total and merged counts.
  nlohmann::json Query(const std::string& metric, const std::vector<std::string>& agents,
                       size_t max_points);
  int64_t points();

 private:
  struct Series {
    std::vector<std::pair<double, double>> points;  // (step, value), at most kMaxPoints
    int64_t total = 0;                              // points read
    int64_t merged = 0;                             // of those, merged into a neighbour
    void Append(double step, double value);
  };
  std::mutex mu_;
  const std::string path_;
  int64_t read_ = 0;  // bytes of the file consumed
  std::string partial_;
  MetricsLineReader reader_;
  // agent -> metric -> series
  std::map<std::string, std::map<std::string, Series, std::less<>>, std::less<>> series_;
  int64_t points_ = 0;
};

// The last `lines` lines (1..10000) of `agent`'s rank `rank` log that contain
// `filter` (all when empty). NotFound for an agent or rank the plan lacks (so
// no name reaches the file system unchecked), InvalidArgument for a bad count.
Result<std::vector<std::string>> TailLog(const std::string& run_dir, const Plan& plan,
                                         const std::string& agent, int rank, int lines,
                                         const std::string& filter);

// Keeps about max_points of `in` (sorted by x): per bucket its first, lowest
// and highest point, so spikes survive decimation.
std::vector<std::pair<double, double>> Decimate(const std::vector<std::pair<double, double>>& in,
                                                size_t max_points);

}  // namespace agentrt
