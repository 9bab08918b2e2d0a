// The dashboard's views without a server: decimation keeps ends and spikes,
// metrics.jsonl is indexed incrementally (a half-written line waits), the
// Prometheus text carries every agent with escaped labels.
#include "dashboard/views.h"

#include <catch2/catch.hpp>
#include <fstream>
#include <string>

#include "dashboard/server.h"
#include "tests/common/temp_dir.h"

using namespace agentrt;

TEST_CASE("decimation keeps about max_points, the ends and every bucket's extremes") {
  std::vector<std::pair<double, double>> in;
  for (int i = 0; i < 100000; ++i) in.emplace_back(i, i == 54321 ? 1e6 : (i % 7));
  const auto out = Decimate(in, 300);
  CHECK(out.size() <= 301);
  CHECK(out.size() >= 200);
  CHECK(out.front() == in.front());
  CHECK(out.back() == in.back());
  CHECK(std::any_of(out.begin(), out.end(), [](const auto& p) { return p.second == 1e6; }));
  CHECK(std::is_sorted(out.begin(), out.end()));
  CHECK(Decimate({{1, 2}, {3, 4}}, 300).size() == 2);  // small series pass whole
}

TEST_CASE("metrics.jsonl is read as it grows; a partial last line waits for its end") {
  testing::TempDir dir("agentrt-dash");
  const std::string path = dir.Path("metrics.jsonl");
  MetricSeries series(path);
  REQUIRE(series.Refresh().ok());  // no file yet
  CHECK(series.points() == 0);
  {
    std::ofstream f(path);
    f << R"({"agent":"a","metrics":{"loss":1.5,"note":"x"},"rank":0,"step":10})"
      << "\n";
    f << R"({"agent":"a","metrics":{"loss":9.0},"rank":1,"step":10})"
      << "\n";  // rank 1: skipped
    f << R"({"agent":"b","metrics":{"loss":2.5},"rank":0,"st)";
  }
  REQUIRE(series.Refresh().ok());
  CHECK(series.points() == 1);
  {
    std::ofstream f(path, std::ios::app);
    f << R"(ep":20})"
      << "\n";
  }
  REQUIRE(series.Refresh().ok());
  CHECK(series.points() == 2);
  const auto q = series.Query("loss", {}, 100);
  REQUIRE(q.size() == 2);
  CHECK(q[0]["agent"] == "a");
  CHECK(q[0]["points"][0][1] == 1.5);
  CHECK(q[1]["points"][0][0] == 20.0);
  CHECK(series.Query("loss", {"b"}, 100).size() == 1);
  CHECK(series.Names()["a"] == std::vector<std::string>{"loss"});
}

TEST_CASE("a long series is held in bounded memory: merged, counted, never dropped unsaid") {
  testing::TempDir dir("agentrt-dash");
  const std::string path = dir.Path("metrics.jsonl");
  const int n = 5000;
  {
    std::ofstream f(path);
    for (int step = 1; step <= n; ++step) {
      f << R"({"agent":"a","metrics":{"loss":)" << (step % 2 == 0 ? 1.0 : 3.0)
        << R"(},"rank":0,"step":)" << step << "}\n";
    }
  }
  MetricSeries series(path);
  REQUIRE(series.Refresh().ok());
  CHECK(series.points() == n);
  const auto q = series.Query("loss", {}, 100000);  // every point held
  REQUIRE(q.size() == 1);
  const auto& points = q[0]["points"];
  CHECK(points.size() < MetricSeries::kMaxPoints);
  CHECK(q[0]["total"] == n);
  CHECK(q[0]["merged"].get<int64_t>() + static_cast<int64_t>(points.size()) == n);
  CHECK(points.front()[0] == 1.0);                        // the history starts where it did
  CHECK(points.back()[0].get<double>() > n - 10);         // and ends at the newest step
  CHECK(points.front()[1].get<double>() == Approx(2.0));  // merged values: means of neighbours
}

TEST_CASE("the Prometheus text has every agent, its state and escaped labels") {
  RunSnapshot run;
  run.status.run = "r\"1";
  run.status.started_unix_s = 100;
  run.controller_alive = true;
  AgentStatus a;
  a.name = "pred-0";
  a.state = AgentState::kRunning;
  a.restarts = 2;
  a.step = 500;
  a.last_checkpoint_step = 400;
  a.ranks.push_back({0, 1234, "node1", std::nullopt, 190.0});
  run.status.agents.push_back(a);
  run.checkpoint_unix_s["pred-0"] = 195;
  const std::string text = PrometheusText(run, 200);
  CHECK_THAT(text, Catch::Matchers::Contains(
                       "agentrt_agent_state{run=\"r\\\"1\",agent=\"pred-0\",state=\"running\"} 1"));
  CHECK_THAT(text, Catch::Matchers::Contains(
                       "agentrt_agent_state{run=\"r\\\"1\",agent=\"pred-0\",state=\"failed\"} 0"));
  CHECK_THAT(text, Catch::Matchers::Contains(
                       "agentrt_agent_restarts_total{run=\"r\\\"1\",agent=\"pred-0\"} 2"));
  CHECK_THAT(text, Catch::Matchers::Contains(
                       "agentrt_agent_checkpoint_age_seconds{run=\"r\\\"1\",agent=\"pred-0\"} 5"));
  CHECK_THAT(text, Catch::Matchers::Contains("rank=\"0\",node=\"node1\"} 10.000"));
  CHECK_THAT(text, Catch::Matchers::Contains("# TYPE agentrt_agent_restarts_total counter"));
}

TEST_CASE("an agent that runs shrunk shows its planned ranks beside its ranks") {
  RunSnapshot run;
  run.status.run = "r";
  AgentStatus wide;
  wide.name = "wide";
  wide.state = AgentState::kRunning;
  wide.ranks = {{0, 11, "n1", std::nullopt, 190.0}, {1, 12, "n1", std::nullopt, 190.0}};
  wide.planned_ranks = 4;
  run.status.agents = {wide};
  const nlohmann::json view = RunView(run, 200);
  CHECK(view["agents"][0]["ranks"].size() == 2);
  CHECK(view["agents"][0]["planned_ranks"] == 4);
  // The same words as `agentctl status` (ShrunkNote), and none once it ended.
  CHECK(view["agents"][0]["shrunk_note"] == ShrunkNote(wide));
  CHECK_THAT(view["agents"][0]["shrunk_note"].get<std::string>(),
             Catch::Matchers::Contains("runs 2 of its 4 planned ranks"));
  run.status.agents[0].state = AgentState::kSucceeded;
  CHECK(RunView(run, 200)["agents"][0]["shrunk_note"].is_null());
}

TEST_CASE("a rank that has exited, or whose agent has ended, shows no heartbeat age") {
  RunSnapshot run;
  run.status.run = "r";
  run.controller_alive = false;
  AgentStatus live;
  live.name = "live";
  live.state = AgentState::kRunning;
  live.ranks.push_back({0, 11, "n1", std::nullopt, 190.0});
  live.ranks.push_back({1, 12, "n1", 0, 190.0});  // this rank has exited
  AgentStatus done = live;
  done.name = "done";
  done.state = AgentState::kSucceeded;
  done.ranks[0].exit_code = 0;
  run.status.agents = {live, done};
  const nlohmann::json view = RunView(run, 200);
  CHECK(view["run"]["state"] == "controller_gone");  // running, by its last record only
  CHECK(view["agents"][0]["ranks"][0]["heartbeat_age_s"] == 10.0);
  CHECK(view["agents"][0]["ranks"][1]["heartbeat_age_s"].is_null());
  CHECK(view["agents"][1]["ranks"][0]["heartbeat_age_s"].is_null());
  CHECK(view["agents"][0]["planned_ranks"].is_null());  // as planned
  const std::string text = PrometheusText(run, 200);
  CHECK_THAT(text, Catch::Matchers::Contains("agent=\"live\",rank=\"0\",node=\"n1\"} 10.000"));
  CHECK_THAT(text, !Catch::Matchers::Contains("agent=\"live\",rank=\"1\""));
  CHECK_THAT(text, !Catch::Matchers::Contains("agent=\"done\",rank="));
}
