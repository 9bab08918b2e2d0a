// The league's rules (scheduler/league.h) and PBT's decisions (scheduler/pbt.h):
// pure logic, no processes.
#include "scheduler/league.h"

#include <catch2/catch.hpp>
#include <map>
#include <set>
#include <string>

#include "scheduler/pbt.h"

namespace agentrt {
namespace {

LeagueConfig TwoSided() {
  LeagueConfig c;
  c.keep_snapshots = 3;
  c.freeze_every_steps = 100;
  c.elo_k = 16;
  c.members = {{"h0", "main", "pfsp", 0.0, {"r"}},
               {"h1", "main", "uniform", 0.0, {"r"}},
               {"r", "main", "pfsp", 0.0, {"h0", "h1"}}};
  return c;
}

LeagueResult Game(const std::string& agent, uint64_t seq, const std::string& opponent, int64_t wins,
                  int64_t losses, uint64_t incarnation = 0) {
  LeagueResult r;
  r.agent = agent;
  r.incarnation = incarnation;
  r.seq = seq;
  r.opponent = opponent;
  r.opponent_snapshot = opponent + "@initial";
  r.wins = wins;
  r.losses = losses;
  return r;
}

TEST_CASE("Elo moves the winner up and the loser down by the same amount") {
  LeagueState s(TwoSided());
  std::string why;
  REQUIRE(s.Apply(Game("h0", 1, "r", 10, 0), 1.0, &why));
  // Equal ratings: expected 0.5, score 1: +K/2.
  CHECK(s.Rating("h0") == Approx(1008.0));
  CHECK(s.Rating("r") == Approx(992.0));
  CHECK(s.Rating("h1") == Approx(1000.0));
  REQUIRE(s.Apply(Game("h0", 2, "r", 5, 5), 2.0, &why));
  // Now h0 is favoured: a draw-like 50% score costs it.
  CHECK(s.Rating("h0") < 1008.0);
  CHECK(s.payoff().at("h0").at("r").wins == 15);
  CHECK(s.payoff().at("h0").at("r").losses == 5);
  CHECK(s.results_applied() == 2);
}

TEST_CASE("a result is applied once per (agent, incarnation, seq)") {
  LeagueState s(TwoSided());
  std::string why;
  REQUIRE(s.Apply(Game("h0", 1, "r", 3, 1), 1.0, &why));
  const double after = s.Rating("h0");
  CHECK_FALSE(s.Apply(Game("h0", 1, "r", 3, 1), 1.0, &why));
  CHECK_THAT(why, Catch::Matchers::Contains("applied already"));
  CHECK(s.Rating("h0") == after);
  // A new incarnation numbers from 1 again.
  CHECK(s.Apply(Game("h0", 1, "r", 3, 1, /*incarnation=*/1), 1.0, &why));
  CHECK(s.results_applied() == 2);
  // Not an opponent of h0, not a member, no games: refused, nothing changes.
  CHECK_FALSE(s.Apply(Game("h0", 2, "h1", 1, 0), 1.0, &why));
  CHECK_THAT(why, Catch::Matchers::Contains("not one of its opponents"));
  CHECK_FALSE(s.Apply(Game("x", 1, "r", 1, 0), 1.0, &why));
  CHECK_FALSE(s.Apply(Game("h0", 3, "r", 0, 0), 1.0, &why));
  CHECK(s.results_applied() == 2);
}

TEST_CASE("snapshots freeze every freeze_every_steps and the catalogue keeps the newest") {
  LeagueState s(TwoSided());
  for (int64_t step = 10; step <= 1000; step += 30) {
    s.Offer({"r", step, "weights/r", step, 0});
  }
  const auto& frozen = s.frozen("r");
  REQUIRE(frozen.size() == 3);  // keep_snapshots
  // One per 100-step window, the newest three windows.
  CHECK(frozen[0].step == 820);
  CHECK(frozen[1].step == 910);
  CHECK(frozen[2].step == 1000);
  // An older offer than the newest is ignored.
  CHECK_FALSE(s.Offer({"r", 500, "weights/r", 500, 0}));
}

TEST_CASE(
    "PFSP favours the snapshots that beat the member; the draw is a function of the request") {
  LeagueState s(TwoSided());
  s.Offer({"r", 0, "weights/r", 0, 0});
  s.Offer({"r", 100, "weights/r", 1, 0});
  std::string why;
  // h0 always beats r@0 and always loses to r@100.
  for (uint64_t i = 1; i <= 20; ++i) {
    LeagueResult easy = Game("h0", 2 * i - 1, "r", 10, 0);
    easy.opponent_snapshot = "r@0";
    LeagueResult hard = Game("h0", 2 * i, "r", 0, 10);
    hard.opponent_snapshot = "r@100";
    REQUIRE(s.Apply(easy, 1, &why));
    REQUIRE(s.Apply(hard, 1, &why));
  }
  CHECK(s.WinRate("h0", "r@0") > 0.95);
  CHECK(s.WinRate("h0", "r@100") < 0.05);
  std::map<std::string, int> picks;
  for (uint64_t m = 1; m <= 400; ++m) {
    auto match = s.Pick({"h0", 0, m});
    REQUIRE(match.ok());
    CHECK(match->how == "pfsp");
    ++picks[match->SnapshotId()];
    // The same request, the same opponent.
    CHECK(s.Pick({"h0", 0, m})->SnapshotId() == match->SnapshotId());
  }
  CHECK(picks["r@100"] > 390);
  // h1 draws uniformly from the same catalogue.
  std::map<std::string, int> uniform;
  for (uint64_t m = 1; m <= 400; ++m) ++uniform[s.Pick({"h1", 0, m})->SnapshotId()];
  CHECK(uniform["r@0"] > 140);
  CHECK(uniform["r@100"] > 140);
}

TEST_CASE("a snapshot no longer on the bus leaves the catalogue and is picked no more") {
  LeagueState s(TwoSided());
  s.Offer({"r", 0, "weights/r", 0, 0});
  s.Offer({"r", 100, "weights/r", 1, 0});
  std::string why;
  REQUIRE(s.Apply(Game("h0", 1, "r", 10, 0), 1, &why));
  REQUIRE(s.Forget("weights/r", 0));
  CHECK_FALSE(s.Forget("weights/r", 0));   // once
  CHECK_FALSE(s.Forget("weights/r", 77));  // never catalogued
  CHECK_FALSE(s.Forget("weights/h0", 1));  // another stream's offset 1
  REQUIRE(s.frozen("r").size() == 1);
  CHECK(s.frozen("r")[0].Id() == "r@100");
  for (uint64_t m = 1; m <= 50; ++m) CHECK(s.Pick({"h1", 0, m})->SnapshotId() == "r@100");
  CHECK(s.payoff().at("h0").at("r").wins == 10);  // what was played stands
  // The newest goes too when it is the one named; the next offer brings one back.
  REQUIRE(s.Forget("weights/r", 1));
  CHECK(s.frozen("r").empty());
  CHECK(s.Pick({"h1", 0, 1})->SnapshotId() == "r@initial");
  REQUIRE(s.Offer({"r", 130, "weights/r", 2, 0}));
  CHECK(s.Pick({"h1", 0, 2})->SnapshotId() == "r@130");
  // By message, not by id: the same step again (a restore) is another snapshot.
  REQUIRE(s.Offer({"r", 130, "weights/r", 3, 0}));
  CHECK_FALSE(s.Forget("weights/r", 2));
  CHECK(s.Pick({"h1", 0, 2})->snapshot->offset == 3);
  // A log that is gone takes every snapshot with it; ratings stay.
  const double rating = s.Rating("h0");
  REQUIRE(s.ForgetAll());
  CHECK_FALSE(s.ForgetAll());
  CHECK(s.frozen("r").empty());
  CHECK(s.Pick({"h1", 0, 3})->SnapshotId() == "r@initial");
  CHECK(s.Rating("h0") == rating);
}

TEST_CASE("before any snapshot, or with matchmaking self, the opponent's newest plays") {
  LeagueConfig c = TwoSided();
  c.members[0].matchmaking = "self";
  LeagueState s(c);
  auto first = s.Pick({"h0", 0, 1});
  REQUIRE(first.ok());
  CHECK(first->SnapshotId() == "r@initial");
  CHECK_FALSE(first->snapshot.has_value());
  s.Offer({"r", 0, "weights/r", 4, 0});
  s.Offer({"r", 150, "weights/r", 9, 0});
  auto newest = s.Pick({"h0", 0, 2});
  REQUIRE(newest->snapshot.has_value());
  CHECK(newest->snapshot->offset == 9);
  CHECK(newest->how == "newest");
  CHECK_FALSE(s.Pick({"nobody", 0, 1}).ok());
}

TEST_CASE("league state round-trips through JSON exactly") {
  LeagueState s(TwoSided());
  std::string why;
  s.Offer({"r", 0, "weights/r", 0, 0});
  s.Apply(Game("h0", 1, "r", 7, 3), 1.5, &why);
  s.Apply(Game("r", 1, "h1", 2, 8), 2.5, &why);
  s.inbox_offset = 17;
  s.inbox_incarnation = 99;
  Result<LeagueState> back = LeagueState::FromJson(TwoSided(), s.ToJson());
  REQUIRE(back.ok());
  CHECK(back->ToJson() == s.ToJson());
  CHECK(back->inbox_offset == 17);
  // Duplicates stay duplicates after a restart.
  CHECK_FALSE(back->Apply(Game("h0", 1, "r", 7, 3), 3, &why));
  // A state of members the config no longer has is refused.
  LeagueConfig other;
  other.members = {{"z", "main", "pfsp", 0, {"y"}}, {"y", "main", "pfsp", 0, {"z"}}};
  CHECK_FALSE(LeagueState::FromJson(other, s.ToJson()).ok());
  const std::string table = FormatLeague(&*back, {});
  CHECK_THAT(table, Catch::Matchers::Contains("h0"));
  CHECK_THAT(table, Catch::Matchers::Contains("7-3-0"));
}

PbtPopulation Carts() {
  PbtPopulation p;
  p.name = "carts";
  p.agents = {"a", "b", "c", "d"};
  p.interval_steps = 100;
  p.fraction = 0.25;
  p.resample_probability = 0;
  p.hyperparameters = {{"lr", 1e-6, 1e-2, {0.8, 1.2}, false}};
  return p;
}

std::map<std::string, nlohmann::json> Args() {
  return {
      {"a", {{"lr", 1e-3}}}, {"b", {{"lr", 2e-3}}}, {"c", {{"lr", 3e-3}}}, {"d", {{"lr", 1e-6}}}};
}

nlohmann::json Metric(double v) { return {{"episode_return_mean", v}}; }

TEST_CASE("PBT: the bottom member at its interval copies a top member and perturbs") {
  PbtScheduler pbt({Carts()}, Args());
  // Not due yet (interval 100): metrics are only recorded.
  CHECK_FALSE(pbt.OnReport("a", 50, Metric(300)));
  CHECK_FALSE(pbt.OnReport("b", 50, Metric(200)));
  CHECK_FALSE(pbt.OnReport("c", 50, Metric(400)));
  CHECK_FALSE(pbt.OnReport("c", 100, Metric(400)));  // due, but the best
  auto d = pbt.OnReport("d", 120, Metric(20));
  REQUIRE(d.has_value());
  CHECK(d->recipient == "d");
  CHECK(d->donor == "c");  // the top quarter of four is one member
  CHECK(d->old_hyperparameters["lr"] == 1e-6);
  const double lr = d->new_hyperparameters["lr"].get<double>();
  CHECK((lr == Approx(3e-3 * 0.8) || lr == Approx(3e-3 * 1.2)));
  // Both are busy until it is done: c is no donor, d is not judged again.
  CHECK_FALSE(pbt.OnReport("d", 220, Metric(10)));
  pbt.Done(*d, {{"lr", lr}}, 90);
  // Judged again interval_steps after the adopted step, on its new weights.
  CHECK_FALSE(pbt.OnReport("d", 150, Metric(390)));
  auto again = pbt.OnReport("a", 200, Metric(100));  // now a is the worst
  REQUIRE(again.has_value());
  CHECK(again->recipient == "a");
}

TEST_CASE("PBT decisions are a function of the reports; resampling stays inside the bounds") {
  PbtPopulation p = Carts();
  p.resample_probability = 1.0;
  p.hyperparameters[0].log_scale = true;
  std::set<double> seen;
  for (int round = 0; round < 2; ++round) {
    PbtScheduler pbt({p}, Args());
    pbt.OnReport("a", 100, Metric(300));
    pbt.OnReport("b", 100, Metric(200));
    pbt.OnReport("c", 100, Metric(400));
    auto d = pbt.OnReport("d", 100, Metric(20));
    REQUIRE(d.has_value());
    const double lr = d->new_hyperparameters["lr"].get<double>();
    CHECK(lr >= 1e-6);
    CHECK(lr <= 1e-2);
    CHECK(d->explore["lr"] == "resampled");
    seen.insert(lr);
  }
  CHECK(seen.size() == 1);
}

TEST_CASE("PBT: a tie is no reason to copy, and members without a metric are left out") {
  PbtScheduler pbt({Carts()}, Args());
  pbt.OnReport("a", 100, Metric(500));
  pbt.OnReport("b", 100, Metric(500));
  CHECK_FALSE(pbt.OnReport("c", 100, Metric(500)));
  PbtScheduler lonely({Carts()}, Args());
  CHECK_FALSE(lonely.OnReport("d", 100, Metric(1)));  // nobody to compare with
}

}  // namespace
}  // namespace agentrt
