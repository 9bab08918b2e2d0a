#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <barrier>
#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <future>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "agent_runtime/checkpoint_files.h"
#include "agent_runtime/checkpointer.h"
#include "common/file_util.h"
#include "plan/fence.h"
#include "tests/agent_runtime/checkpoint_test_util.h"
#include "tests/agent_runtime/fake_device.h"
#include "tests/common/temp_dir.h"

namespace agentrt {
namespace {

namespace fs = std::filesystem;
using std::chrono::seconds;

using testing::TempDir;

CheckpointOptions Options(const std::string& dir, int rank = 0, int world = 1) {
  CheckpointOptions o{.dir = dir,
                      .agent = "learner-0",
                      .rank = rank,
                      .world_size = world,
                      .interval_s = 60,
                      .keep_last = 3};
  return o;
}

std::unique_ptr<Checkpointer> Make(CheckpointOptions o, const Clock* clock = SteadyClock()) {
  auto c = Checkpointer::Create(std::move(o), clock);
  REQUIRE(c.ok());
  return std::move(c).value();
}

std::vector<float> Weights(int64_t step, size_t n = 1000) {
  std::vector<float> w(n);
  for (size_t i = 0; i < n; ++i) w[i] = static_cast<float>(step) + static_cast<float>(i) * 0.5f;
  return w;
}

void SaveStep(Checkpointer& c, int64_t step) {
  auto w = Weights(step);
  CheckpointState s;
  s.AddArray("weights", w.data(), "float32", {static_cast<int64_t>(w.size())}, sizeof(float));
  s.AddBytes("step", &step, sizeof step);
  s.metadata = {{"bus_offsets", {{"sightings", step * 10}}}};
  REQUIRE(c.Save(step, s).ok());
}

void CheckStep(const RestoreResult& r, int64_t step) {
  REQUIRE(r.restored());
  CHECK(r.step == step);
  auto w = Weights(step);
  std::vector<float> got(w.size());
  REQUIRE(r.shard.CopyTo("weights", got.data(), got.size() * sizeof(float)).ok());
  CHECK(got == w);
  CHECK(r.metadata["bus_offsets"]["sightings"] == step * 10);
}

void FlipByte(const std::string& path, size_t offset) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  REQUIRE(f.good());
  f.seekg(static_cast<std::streamoff>(offset));
  char c;
  f.read(&c, 1);
  c = static_cast<char>(c ^ 0x40);
  f.seekp(static_cast<std::streamoff>(offset));
  f.write(&c, 1);
}

TEST_CASE("a saved checkpoint restores its named arrays and metadata") {
  TempDir dir;
  auto c = Make(Options(dir.path));
  auto fresh = c->Restore();
  REQUIRE(fresh.ok());
  CHECK(fresh->kind == RestoreResult::Kind::kFresh);
  SaveStep(*c, 7);
  CHECK(c->last_saved_step() == 7);

  auto c2 = Make(Options(dir.path));
  auto r = c2->Restore();
  REQUIRE(r.ok());
  CheckStep(*r, 7);
  CHECK(r->world_size == 1);
  const auto& e = r->shard.entries();
  REQUIRE(e.size() == 2);
  CHECK(e[0].name == "weights");
  CHECK(e[0].dtype == "float32");
  CHECK(e[0].shape == std::vector<int64_t>{1000});
  CHECK(r->shard.Bytes("missing").empty());
  CHECK_FALSE(r->shard.CopyTo("weights", nullptr, 3).ok());

  // Layout: step-<N>/rank-0.shard + manifest; directories 0700, files 0600.
  CHECK(fs::exists(dir.path + "/step-7/manifest.json"));
  CHECK(fs::exists(dir.path + "/step-7/rank-0.shard"));
  struct stat st;
  REQUIRE(::stat((dir.path + "/step-7").c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == 0700);
  REQUIRE(::stat((dir.path + "/step-7/rank-0.shard").c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == 0600);
}

TEST_CASE("a fenced-off incarnation can no longer save; the one the fence names can") {
  TempDir dir;
  CheckpointOptions old_options = Options(dir.path);
  old_options.incarnation = "0.aaaa";
  REQUIRE(WriteCheckpointFence(dir.path, "0.aaaa").ok());
  auto old = Make(old_options);
  SaveStep(*old, 10);
  nlohmann::json manifest =
      nlohmann::json::parse(std::ifstream(dir.path + "/step-10/manifest.json"));
  CHECK(manifest["incarnation"] == "0.aaaa");

  // The controller launched incarnation 1 elsewhere; the old one still runs.
  REQUIRE(WriteCheckpointFence(dir.path, "1.bbbb").ok());
  auto w = Weights(20);
  CheckpointState state;
  state.AddArray("weights", w.data(), "float32", {static_cast<int64_t>(w.size())}, sizeof(float));
  const Status refused = old->Save(20, state);
  REQUIRE_FALSE(refused.ok());
  CHECK(refused.code() == StatusCode::kFailedPrecondition);
  CHECK_THAT(refused.message(),
             Catch::Contains("fenced") && Catch::Contains("1.bbbb") && Catch::Contains("0.aaaa"));
  CHECK_FALSE(fs::exists(dir.path + "/step-20"));  // not even a shard was written

  CheckpointOptions new_options = Options(dir.path);
  new_options.incarnation = "1.bbbb";
  auto successor = Make(new_options);
  auto r = successor->Restore();
  REQUIRE(r.ok());
  CheckStep(*r, 10);
  SaveStep(*successor, 30);
  CHECK(ReadCheckpointFence(dir.path).value() == std::optional<std::string>("1.bbbb"));
  // No incarnation (no controller): the fence does not apply.
  SaveStep(*Make(Options(dir.path)), 40);
}

TEST_CASE("the checkpoint directory is created 0700 with its parents") {
  TempDir dir;
  std::string nested = dir.path + "/checkpoints/predator-0";
  auto c = Make(Options(nested));
  struct stat st;
  REQUIRE(::stat(nested.c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == 0700);
}

TEST_CASE("an async save snapshots the state: later changes do not leak into it") {
  TempDir dir;
  auto c = Make(Options(dir.path));
  auto w = Weights(3);
  int64_t step = 3;
  CheckpointState s;
  s.AddArray("weights", w.data(), "float32", {static_cast<int64_t>(w.size())}, sizeof(float));
  s.metadata = {{"bus_offsets", {{"sightings", 30}}}};
  REQUIRE(c->SaveAsync(step, s).ok());
  std::fill(w.begin(), w.end(), -1.0f);  // the training loop moves on at once
  REQUIRE(c->Wait().ok());
  auto r = Make(Options(dir.path))->Restore();
  REQUIRE(r.ok());
  CheckStep(*r, 3);
}

TEST_CASE("state copied by a custom copier (device memory) is saved") {
  TempDir dir;
  auto c = Make(Options(dir.path));
  std::vector<int64_t> device(16, 42);
  CheckpointState s;
  s.AddCustom("gpu_tensor", device.size() * sizeof(int64_t), "int64", {16}, [&](void* dst) {
    std::memcpy(dst, device.data(), device.size() * sizeof(int64_t));
    return Status::Ok();
  });
  REQUIRE(c->Save(1, s).ok());
  CheckpointState bad;
  bad.AddCustom("broken", 8, "int64", {1}, [](void*) { return Internal("cudaMemcpy failed"); });
  Status st = c->Save(2, bad);
  REQUIRE_FALSE(st.ok());
  CHECK(st.message().find("broken") != std::string::npos);
  CHECK(st.message().find("cudaMemcpy failed") != std::string::npos);
  auto r = Make(Options(dir.path))->Restore();
  REQUIRE(r.ok());
  REQUIRE(r->restored());
  CHECK(r->step == 1);
  std::vector<int64_t> got(16);
  REQUIRE(r->shard.CopyTo("gpu_tensor", got.data(), got.size() * sizeof(int64_t)).ok());
  CHECK(got == device);
}

TEST_CASE("a flipped byte in a shard is detected, named, and the previous checkpoint is used") {
  TempDir dir;
  auto c = Make(Options(dir.path));
  SaveStep(*c, 10);
  SaveStep(*c, 20);
  FlipByte(dir.path + "/step-20/rank-0.shard", 123);
  auto r = Make(Options(dir.path))->Restore();
  REQUIRE(r.ok());
  CheckStep(*r, 10);
  REQUIRE(r->skipped.size() == 1);
  CHECK(r->skipped[0].step == 20);
  CHECK(r->skipped[0].file == dir.path + "/step-20/rank-0.shard");
  CHECK(r->skipped[0].reason.find("checksum mismatch") != std::string::npos);
  CHECK(r->Describe().find("skipped step 20") != std::string::npos);
}

TEST_CASE("a truncated manifest or shard is detected, named, and the previous checkpoint is used") {
  TempDir dir;
  auto c = Make(Options(dir.path));
  SaveStep(*c, 1);
  SaveStep(*c, 2);
  SaveStep(*c, 3);
  fs::resize_file(dir.path + "/step-3/manifest.json", 40);
  fs::resize_file(dir.path + "/step-2/rank-0.shard", 100);
  auto r = Make(Options(dir.path))->Restore();
  REQUIRE(r.ok());
  CheckStep(*r, 1);
  REQUIRE(r->skipped.size() == 2);
  CHECK(r->skipped[0].file == dir.path + "/step-3/manifest.json");
  CHECK(r->skipped[0].reason.find("JSON") != std::string::npos);
  CHECK(r->skipped[1].file == dir.path + "/step-2/rank-0.shard");
  CHECK(r->skipped[1].reason.find("size is 100 bytes") != std::string::npos);
}

TEST_CASE("when every committed checkpoint is corrupt the result says so rather than fresh") {
  TempDir dir;
  auto c = Make(Options(dir.path));
  SaveStep(*c, 5);
  FlipByte(dir.path + "/step-5/rank-0.shard", 0);
  auto r = Make(Options(dir.path))->Restore();
  REQUIRE(r.ok());
  CHECK(r->kind == RestoreResult::Kind::kCorrupt);
  CHECK(r->skipped.size() == 1);
}

TEST_CASE("the wall-clock trigger follows the injected clock, not the step count") {
  TempDir dir;
  ManualClock clock;
  auto o = Options(dir.path);
  o.interval_s = 60;
  auto c = Make(o, &clock);
  CHECK_FALSE(c->SaveDue());
  clock.Advance(seconds(59));
  CHECK_FALSE(c->SaveDue());
  clock.Advance(seconds(1));
  CHECK(c->SaveDue());
  SaveStep(*c, 1);
  CHECK_FALSE(c->SaveDue());  // the interval restarts when a save starts
  clock.Advance(seconds(30));
  CHECK_FALSE(c->SaveDue());
  c->RequestSave();  // SIGUSR2 or a stop request
  CHECK(c->SaveDue());
  SaveStep(*c, 2);
  CHECK_FALSE(c->SaveDue());
  clock.Advance(seconds(60));
  CHECK(c->SaveDue());
}

TEST_CASE("a trigger firing while a save is in progress is absorbed, not doubled") {
  TempDir dir;
  ManualClock clock;
  auto o = Options(dir.path);
  std::promise<void> release;
  std::shared_future<void> released = release.get_future().share();
  o.barrier = [released] {  // holds the writer thread mid-save
    released.wait();
    return Status::Ok();
  };
  auto c = Make(o, &clock);
  auto w = Weights(1);
  CheckpointState s;
  s.AddArray("weights", w.data(), "float32", {static_cast<int64_t>(w.size())}, sizeof(float));
  clock.Advance(seconds(61));
  REQUIRE(c->SaveDue());
  REQUIRE(c->SaveAsync(1, s).ok());
  CHECK(c->saving());
  clock.Advance(seconds(61));  // the next wall-clock trigger fires during the save
  c->RequestSave();            // and so does a signal
  CHECK_FALSE(c->SaveDue());
  release.set_value();
  REQUIRE(c->Wait().ok());
  CHECK(c->stats().triggers_absorbed == 1);
  CHECK(c->stats().saves_started == 1);
  CHECK(c->stats().saves_committed == 1);
  // The interval counts from the start of that save: 61 s have passed since.
  CHECK(c->SaveDue());
}

TEST_CASE("keep_last keeps the newest committed checkpoints and removes older ones") {
  TempDir dir;
  auto o = Options(dir.path);
  o.keep_last = 2;
  auto c = Make(o);
  for (int64_t s = 1; s <= 5; ++s) SaveStep(*c, s);
  // A dropped step is renamed away at once and removed in the background: by
  // the time the checkpointer is gone, so is every byte of it.
  c.reset();
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir.path))
    names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  CHECK(names == std::vector<std::string>{"step-4", "step-5"});
}

TEST_CASE("debris of a crashed save is cleaned on start and never restored") {
  TempDir dir;
  auto c = Make(Options(dir.path));
  SaveStep(*c, 4);
  fs::create_directories(dir.path + "/step-9");
  std::ofstream(dir.path + "/step-9/rank-0.shard.tmp") << "half";
  std::ofstream(dir.path + "/step-4/manifest.json.tmp") << "half";
  std::ofstream(dir.path + "/notes.txt") << "the user's own file";
  // A step Prune had renamed away when the process died, half removed.
  fs::create_directories(dir.path + "/.step-2.pruned.tmp");
  std::ofstream(dir.path + "/.step-2.pruned.tmp/rank-0.shard") << "old";
  auto r = Make(Options(dir.path))->Restore();
  REQUIRE(r.ok());
  CheckStep(*r, 4);
  CHECK(r->skipped.empty());
  CHECK_FALSE(fs::exists(dir.path + "/.step-2.pruned.tmp"));
  CHECK_FALSE(fs::exists(dir.path + "/step-9"));
  CHECK_FALSE(fs::exists(dir.path + "/step-4/manifest.json.tmp"));
  CHECK(fs::exists(dir.path + "/notes.txt"));
}

TEST_CASE("saving a step that is already committed is a no-op") {
  TempDir dir;
  auto c = Make(Options(dir.path));
  SaveStep(*c, 6);
  auto before = fs::last_write_time(dir.path + "/step-6/manifest.json");
  SaveStep(*c, 6);
  CHECK(fs::last_write_time(dir.path + "/step-6/manifest.json") == before);
  CHECK(c->stats().saves_started == 1);
}

TEST_CASE("a world-size change is refused unless re-sharding is opted in") {
  TempDir dir;
  {
    auto c = Make(Options(dir.path));
    SaveStep(*c, 8);
  }
  auto r = Make(Options(dir.path, 0, 2))->Restore();
  REQUIRE_FALSE(r.ok());
  CHECK(r.status().code() == StatusCode::kFailedPrecondition);
  CHECK(r.status().message().find("saved by 1 ranks but this run has 2") != std::string::npos);

  auto o = Options(dir.path, 1, 2);
  o.allow_resharding = true;
  auto c = Make(o);
  auto r2 = c->Restore();
  REQUIRE(r2.ok());
  REQUIRE(r2->restored());
  CHECK(r2->world_size == 1);
  CHECK(r2->shard.entries().empty());  // rank 1 has no saved shard of its own
  auto shard0 = c->LoadShard(8, 0);
  REQUIRE(shard0.ok());
  CHECK(shard0->Bytes("weights").size() == 1000 * sizeof(float));
  CHECK_FALSE(c->LoadShard(8, 1).ok());
}

TEST_CASE("several ranks commit one checkpoint only after every shard is durable") {
  TempDir dir;
  constexpr int kWorld = 3;
  for (bool use_barrier : {false, true}) {
    std::string root = dir.path + (use_barrier ? "/with-barrier" : "/file-wait");
    std::barrier<> sync(kWorld);
    std::vector<std::thread> ranks;
    std::vector<Status> results(kWorld);
    for (int r = 0; r < kWorld; ++r) {
      ranks.emplace_back([&, r] {
        auto o = Options(root, r, kWorld);
        if (use_barrier)
          o.barrier = [&sync] {
            sync.arrive_and_wait();
            return Status::Ok();
          };
        auto c = Checkpointer::Create(o);
        if (!c.ok()) {
          results[r] = c.status();
          return;
        }
        std::vector<int32_t> shard(100 + r * 10, r);
        CheckpointState s;
        s.AddArray("part", shard.data(), "int32", {static_cast<int64_t>(shard.size())}, 4);
        if (r == 2) std::this_thread::sleep_for(std::chrono::milliseconds(50));  // a slow rank
        results[r] = (*c)->Save(11, s);
      });
    }
    for (auto& t : ranks) t.join();
    for (const auto& s : results) REQUIRE(s.ok());
    for (int r = 0; r < kWorld; ++r) {
      auto c = Make(Options(root, r, kWorld));
      auto restored = c->Restore();
      REQUIRE(restored.ok());
      REQUIRE(restored->restored());
      CHECK(restored->step == 11);
      auto part = restored->shard.Bytes("part");
      REQUIRE(part.size() == (100 + r * 10) * sizeof(int32_t));
      int32_t first;
      std::memcpy(&first, part.data(), 4);
      CHECK(first == r);
    }
  }
}

TEST_CASE("rank 0 does not commit when another rank's shard never becomes durable") {
  TempDir dir;
  auto o = Options(dir.path, 0, 2);
  o.commit_timeout = std::chrono::milliseconds(200);
  auto c = Make(o);
  auto w = Weights(1);
  CheckpointState s;
  s.AddArray("weights", w.data(), "float32", {static_cast<int64_t>(w.size())}, sizeof(float));
  Status st = c->Save(1, s);
  REQUIRE_FALSE(st.ok());
  CHECK(st.code() == StatusCode::kDeadlineExceeded);
  CHECK(st.message().find("rank 1") != std::string::npos);
  CHECK_FALSE(fs::exists(dir.path + "/step-1/manifest.json"));
}

TEST_CASE("paths stay confined to the agent's directory") {
  TempDir dir;
  auto ok = ConfinedPath(dir.path, "predator-0");
  REQUIRE(ok.ok());
  CHECK(*ok == dir.path + "/predator-0");
  CHECK(ConfinedPath(dir.path, "a/b").ok());
  for (const char* bad : {"../other", "/etc", "a/../../b", "..", ""}) {
    auto r = ConfinedPath(dir.path, bad);
    CHECK_FALSE(r.ok());
  }
  fs::create_directories(dir.path + "/outside");
  fs::create_directories(dir.path + "/root");
  fs::create_directory_symlink(dir.path + "/outside", dir.path + "/root/escape");
  auto sym = ConfinedPath(dir.path + "/root", "escape/x");
  REQUIRE_FALSE(sym.ok());
  CHECK(sym.status().message().find("symlink") != std::string::npos);
}

TEST_CASE("a symlinked step directory or a manifest naming another file is refused") {
  TempDir dir;
  std::string root = dir.path + "/ckpt";
  auto c = Make(Options(root));
  SaveStep(*c, 1);
  SaveStep(*c, 2);
  // A step directory that is a symlink to elsewhere is never followed.
  fs::create_directories(dir.path + "/elsewhere");
  fs::copy(root + "/step-2", dir.path + "/elsewhere/step-3");
  fs::create_directory_symlink(dir.path + "/elsewhere/step-3", root + "/step-3");
  // A manifest whose shard file points outside its directory is corrupt.
  std::string manifest_path = root + "/step-2/manifest.json";
  std::ifstream in(manifest_path);
  nlohmann::json m = nlohmann::json::parse(in);
  in.close();
  m["shards"][0]["file"] = "../../elsewhere/step-3/rank-0.shard";
  std::ofstream(manifest_path) << m.dump();

  auto r = Make(Options(root))->Restore();
  REQUIRE(r.ok());
  CheckStep(*r, 1);
  REQUIRE(r->skipped.size() == 2);
  CHECK(r->skipped[0].step == 3);
  CHECK(r->skipped[0].reason.find("symlink") != std::string::npos);
  CHECK(r->skipped[1].step == 2);
  CHECK(r->skipped[1].reason.find("\"file\" must be \"rank-0.shard\"") != std::string::npos);
  CHECK(fs::exists(dir.path + "/elsewhere/step-3/rank-0.shard"));  // cleanup did not follow it
}

TEST_CASE("global slices restore at any world size: 2->1, 2->4, 4->3, 3->2") {
  // More than a few verification chunks per shard, and blocks that do not
  // fall on chunk boundaries.
  const uint64_t n = 3 * (1u << 20) / sizeof(float) * 2 + 12345;
  for (auto [from, to] : {std::pair{2, 1}, {2, 4}, {4, 3}, {3, 2}, {3, 3}}) {
    INFO(from << " ranks -> " << to);
    TempDir dir;
    testing::SaveGlobal(dir.path, from, 5, n);
    testing::RestoreGlobal(dir.path, to, 5, n);
    testing::RestoreGlobal(dir.path, to, 5, n, /*verify_all=*/false);
  }
}

TEST_CASE("a re-sharded read checks the chunks it reads; Restore falls back past a bad one") {
  TempDir dir;
  const uint64_t n = (3u << 20) / sizeof(float);
  testing::SaveGlobal(dir.path, 2, 1, n);
  testing::SaveGlobal(dir.path, 2, 2, n);
  // One flipped bit in the second chunk of step 2's rank-1 shard.
  FlipByte(dir.path + "/step-2/rank-1.shard", (1u << 20) + 77);

  // Without verifying every shard up front, Restore picks step 2 and the read
  // of the bad range fails, naming the file and its bytes.
  auto o = Options(dir.path, 0, 3);
  o.verify_all_shards = false;
  auto c = Make(o);
  auto r = c->Restore();
  REQUIRE(r.ok());
  REQUIRE(r->restored());
  CHECK(r->step == 2);
  std::vector<float> all(n);
  Status read = r->saved->Read("w", 0, n, all.data());
  CHECK(read.code() == StatusCode::kDataLoss);
  CHECK(read.message().find("step-2/rank-1.shard: bytes 1048576..2097152: checksum mismatch") !=
        std::string::npos);
  // The chunks before the bad one still read.
  const uint64_t first_rank1 = testing::Split(n, 2, 1);
  CHECK(r->saved->Read("w", 0, first_rank1 + 10, all.data()).ok());
  CHECK(all[first_rank1 + 9] == testing::Value(2, first_rank1 + 9));

  // Verifying every shard (the default), Restore finds it and uses step 1.
  testing::RestoreGlobal(dir.path, 3, 1, n);
}

TEST_CASE("a restore that loads nothing checks sizes now, chunks as read, and falls back") {
  TempDir dir;
  const uint64_t n = (3u << 20) / sizeof(float);
  testing::SaveGlobal(dir.path, 2, 1, n);
  testing::SaveGlobal(dir.path, 2, 2, n);
  testing::SaveGlobal(dir.path, 2, 3, n);
  FlipByte(dir.path + "/step-3/rank-0.shard", 4321);        // found by the read
  fs::resize_file(dir.path + "/step-2/rank-1.shard", 999);  // found by the size check
  auto c = Make(Options(dir.path, 0, 1));                   // verify_all_shards as by default
  auto r = c->Restore(RestoreOptions{.load_shard = false});
  REQUIRE(r.ok());
  REQUIRE(r->restored());
  CHECK(r->step == 3);  // a flipped byte is no reason to pass it over before a read
  CHECK(r->shard.entries().empty());
  CHECK(r->skipped.empty());
  std::vector<float> all(n);
  const Status read = r->saved->Read("w", 0, n, all.data());
  REQUIRE(read.code() == StatusCode::kDataLoss);
  CHECK(read.message().find("step-3/rank-0.shard: bytes 0..1048576: checksum mismatch") !=
        std::string::npos);

  // The retry: the caller names what it found; step 2's short shard is passed over.
  RestoreOptions retry{.load_shard = false, .before_step = 3};
  retry.before_step_error = read.message();
  auto older = c->Restore(retry);
  REQUIRE(older.ok());
  REQUIRE(older->restored());
  CHECK(older->step == 1);
  REQUIRE(older->skipped.size() == 2);
  CHECK(older->skipped[0].step == 3);
  CHECK(older->skipped[1].step == 2);
  CHECK(older->skipped[1].reason.find("size is 999 bytes") != std::string::npos);
  CHECK(older->Describe().find("skipped step 3") != std::string::npos);
  REQUIRE(older->saved->Read("w", 0, n, all.data()).ok());
  CHECK(all[n - 1] == testing::Value(1, n - 1));

  // Nothing older: corrupt, not fresh, and the reasons kept.
  RestoreOptions none{.load_shard = false, .before_step = 1};
  none.skipped = older->skipped;
  auto gone = c->Restore(none);
  REQUIRE(gone.ok());
  CHECK(gone->kind == RestoreResult::Kind::kCorrupt);
  CHECK(gone->skipped.size() == 2);
}

TEST_CASE("a large snapshot is copied in parallel pieces, every byte once") {
  // Three entries of odd sizes past the threshold, and a small set copied by
  // the caller alone.
  for (size_t scale : {size_t{1}, size_t{1} << 10}) {
    std::vector<size_t> sizes = {(kParallelSnapshotBytes / 2 + 12345) / scale,
                                 (kParallelSnapshotBytes / 3 + 7) / scale, 4099};
    std::vector<std::vector<std::byte>> src, dst;
    std::vector<CopyJob> jobs;
    for (size_t k = 0; k < sizes.size(); ++k) {
      src.emplace_back(sizes[k]);
      dst.emplace_back(sizes[k], std::byte{0});
      for (size_t i = 0; i < sizes[k]; ++i) src[k][i] = std::byte(static_cast<uint8_t>(i * 7 + k));
    }
    for (size_t k = 0; k < sizes.size(); ++k)
      jobs.push_back({dst[k].data(), src[k].data(), sizes[k]});
    CopyInParallel(jobs);
    for (size_t k = 0; k < sizes.size(); ++k) CHECK(dst[k] == src[k]);
  }
}

// The children of this process (every thread's), from /proc.
std::vector<pid_t> Children() {
  std::vector<pid_t> out;
  for (const auto& task : fs::directory_iterator("/proc/self/task")) {
    const auto text = ReadWholeFile(task.path() / "children", 1 << 20);
    if (!text.ok()) continue;  // a thread that ended meanwhile
    for (const char* p = text->c_str(); *p != '\0';) {
      char* end = nullptr;
      const long pid = std::strtol(p, &end, 10);
      if (end == p) break;
      out.push_back(static_cast<pid_t>(pid));
      p = end;
    }
  }
  return out;
}

CheckpointOptions ForkOptions(const std::string& dir, CheckpointOptions::Snapshot how) {
  CheckpointOptions o = Options(dir);
  o.snapshot = how;
  return o;
}

// Saves Weights(step) from `w` asynchronously, overwrites `w` at once as a
// training loop would, and checks what was committed.
void SaveAsyncThenOverwrite(Checkpointer& c, const std::string& dir, float* w, size_t n,
                            int64_t step) {
  const std::vector<float> want = Weights(step, n);
  std::copy(want.begin(), want.end(), w);
  CheckpointState s;
  s.AddArray("weights", w, "float32", {static_cast<int64_t>(n)}, sizeof(float));
  s.metadata = {{"bus_offsets", {{"sightings", step * 10}}}};
  REQUIRE(c.SaveAsync(step, s).ok());
  std::fill(w, w + n, -1.0f);
  REQUIRE(c.Wait().ok());
  auto r = Make(Options(dir))->Restore();
  REQUIRE(r.ok());
  REQUIRE(r->step == step);
  std::vector<float> got(n);
  REQUIRE(r->shard.CopyTo("weights", got.data(), n * sizeof(float)).ok());
  CHECK(got == want);
}

TEST_CASE("an async save by fork writes the state as it was, while the caller changes it") {
  TempDir dir;
  auto c = Make(ForkOptions(dir.path, CheckpointOptions::Snapshot::kFork));
  std::vector<float> w(1000);
  SaveAsyncThenOverwrite(*c, dir.path, w.data(), w.size(), 3);
  CHECK(c->stats().last_snapshot_forked);
  CHECK(c->stats().saves_committed == 1);
  CHECK(Children().empty());  // the writer process was reaped
}

TEST_CASE("kFork copies state in shared memory or not inherited by a fork") {
  TempDir dir;
  const size_t n = size_t{1} << 20;
  // Memory mapped shared (torch's share_memory_, /dev/shm) would change under a
  // forked writer.
  auto forced = Make(ForkOptions(dir.path, CheckpointOptions::Snapshot::kFork));
  void* shared =
      ::mmap(nullptr, n * sizeof(float), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  REQUIRE(shared != MAP_FAILED);
  SaveAsyncThenOverwrite(*forced, dir.path, static_cast<float*>(shared), n, 4);
  CHECK_FALSE(forced->stats().last_snapshot_forked);
  CHECK_THAT(forced->stats().last_snapshot_fallback, Catch::Contains("not private memory"));
  // And memory a forked process does not inherit (MADV_DONTFORK: RDMA buffers).
  void* kept = ::mmap(nullptr, n * sizeof(float), PROT_READ | PROT_WRITE,
                      MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  REQUIRE(kept != MAP_FAILED);
  REQUIRE(::madvise(kept, n * sizeof(float), MADV_DONTFORK) == 0);
  SaveAsyncThenOverwrite(*forced, dir.path, static_cast<float*>(kept), n, 5);
  CHECK_FALSE(forced->stats().last_snapshot_forked);
  CHECK_THAT(forced->stats().last_snapshot_fallback, Catch::Contains("MADV_DONTFORK"));
  ::munmap(shared, n * sizeof(float));
  ::munmap(kept, n * sizeof(float));
  CHECK(Children().empty());
}

TEST_CASE("a forked writer killed mid-write fails the save, commits nothing, and is reaped") {
  TempDir dir;
  auto c = Make(ForkOptions(dir.path, CheckpointOptions::Snapshot::kFork));
  SaveStep(*c, 4);
  // The writer blocks opening its shard: a FIFO no one reads. However the
  // test ends, a reader's open frees it (else ~Checkpointer would wait on it).
  fs::create_directories(dir.path + "/step-5");
  const std::string fifo = dir.path + "/step-5/rank-0.shard.tmp";
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  struct FreeWriter {
    std::string path;
    ~FreeWriter() {
      const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK);
      if (fd >= 0) ::close(fd);
    }
  } free_writer{fifo};
  std::vector<float> w = Weights(5);
  CheckpointState s;
  s.AddArray("weights", w.data(), "float32", {static_cast<int64_t>(w.size())}, sizeof(float));
  REQUIRE(c->SaveAsync(5, s).ok());
  const std::vector<pid_t> children = Children();
  REQUIRE(children.size() == 1);
  REQUIRE(::kill(children[0], SIGKILL) == 0);
  const Status failed = c->Wait();
  CHECK(failed.code() == StatusCode::kUnavailable);
  CHECK_THAT(failed.message(), Catch::Contains("writer process " + std::to_string(children[0]) +
                                               " was killed by signal 9"));
  CHECK_THAT(failed.message(), Catch::Contains("step 5"));
  CHECK_FALSE(fs::exists(dir.path + "/step-5/manifest.json"));
  CHECK(Children().empty());
  // The next save forks again and commits.
  std::vector<float> w6 = Weights(6);
  CheckpointState s6;
  s6.AddArray("weights", w6.data(), "float32", {static_cast<int64_t>(w6.size())}, sizeof(float));
  s6.metadata = {{"bus_offsets", {{"sightings", 60}}}};
  REQUIRE(c->SaveAsync(6, s6).ok());
  CHECK(c->stats().last_snapshot_forked);
  REQUIRE(c->Wait().ok());
  auto r = Make(Options(dir.path))->Restore();
  REQUIRE(r.ok());
  CheckStep(*r, 6);
}

TEST_CASE("a forked writer's error comes back with its message") {
  TempDir dir;
  auto c = Make(ForkOptions(dir.path, CheckpointOptions::Snapshot::kFork));
  std::ofstream(dir.path + "/step-7") << "not a directory";
  std::vector<float> w = Weights(7);
  CheckpointState s;
  s.AddArray("weights", w.data(), "float32", {static_cast<int64_t>(w.size())}, sizeof(float));
  REQUIRE(c->SaveAsync(7, s).ok());
  REQUIRE(c->stats().last_snapshot_forked);
  const Status failed = c->Wait();
  CHECK_FALSE(failed.ok());
  CHECK_THAT(failed.message(),
             Catch::Equals("checkpoint (agent learner-0 rank 0, " + dir.path + "): open " +
                           dir.path + "/step-7 (a symlink or not a directory?): Not a directory"));
  CHECK(Children().empty());
}

TEST_CASE("a device slice is staged on a side stream: the save does not wait, the stream does") {
  // A fake device runs each stream's work in order when the stream is
  // queried or synchronised; Hang holds a stream (a kernel still running).
  testing::FakeDevice dev;
  constexpr size_t n = 3000;
  auto mem = dev.Malloc(n * sizeof(float));
  REQUIRE(mem.ok());
  auto* w = static_cast<float*>(*mem);
  std::fill(w, w + n, 1.0f);
  auto stream = dev.CreateStream();
  REQUIRE(stream.ok());
  auto fill = [&](float x) { return [w, x] { std::fill(w, w + n, x); }; };
  dev.Hang(*stream);                                                       // still busy, then
  dev.EnqueueHostWork(*stream, fill(7.0f), std::chrono::milliseconds(0));  // writes the 7s
  TempDir dir;
  {
    auto c = Make(Options(dir.path));
    CheckpointState s;
    s.AddDeviceSlice("w", w, "float32", sizeof(float), {static_cast<int64_t>(n)}, 0, n,
                     {&dev, 0, *stream});
    int64_t step = 5;
    s.AddSlice("count", &step, "int64", sizeof step, {1}, 0, 1);  // host memory beside it
    REQUIRE(c->SaveAsync(5, s).ok());  // returned with the stream still held
    CHECK(c->saving());
    CHECK(dev.pinned_blocks() == 1);
    dev.EnqueueHostWork(*stream, fill(9.0f), std::chrono::milliseconds(0));  // the next update
    dev.ReleaseHangs();
    REQUIRE(c->Wait().ok());
    REQUIRE(dev.SynchronizeStream(*stream).ok());
    CHECK(w[0] == 9.0f);  // the stream's later work ran, after the copy
  }
  CHECK(dev.pinned_blocks() == 0);  // freed with the checkpointer
  auto r = Make(Options(dir.path))->Restore();
  REQUIRE(r.ok());
  REQUIRE(r->restored());
  std::vector<float> got(n);
  REQUIRE(r->saved->Read("w", 0, n, got.data()).ok());
  CHECK(std::all_of(got.begin(), got.end(), [](float x) { return x == 7.0f; }));
  int64_t count = 0;
  REQUIRE(r->saved->Read("count", 0, 1, &count).ok());
  CHECK(count == 5);

  // A device entry without its API is refused, and the save is over.
  auto c = Make(Options(dir.path));
  CheckpointState bad;
  bad.AddDeviceSlice("w", w, "float32", sizeof(float), {1}, 0, 1, {});
  const Status refused = c->SaveAsync(6, bad);
  CHECK(refused.code() == StatusCode::kInvalidArgument);
  CHECK_FALSE(c->saving());
}

TEST_CASE("a restore that loads nothing still loads a checkpoint of single ranks' entries") {
  TempDir dir;
  SaveStep(*Make(Options(dir.path)), 4);
  auto r = Make(Options(dir.path))->Restore(RestoreOptions{.load_shard = false});
  REQUIRE(r.ok());
  CheckStep(*r, 4);
}

TEST_CASE("a truncated, missing or torn shard of a re-sharded restore is found and named") {
  TempDir dir;
  const uint64_t n = (3u << 20) / sizeof(float);
  testing::SaveGlobal(dir.path, 2, 1, n);
  testing::SaveGlobal(dir.path, 2, 2, n);
  auto read_all = [&](int world) {
    auto o = Options(dir.path, 0, world);
    o.verify_all_shards = false;  // the read itself must notice
    auto r = Make(o)->Restore();
    REQUIRE(r.ok());
    REQUIRE(r->restored());
    std::vector<float> all(n);
    return std::pair{r->step, r->saved->Read("w", 0, n, all.data())};
  };
  const std::string shard = dir.path + "/step-2/rank-1.shard";
  SECTION("truncated") {
    fs::resize_file(shard, 1000);
    auto [step, read] = read_all(3);
    CHECK(step == 2);
    CHECK(read.code() == StatusCode::kDataLoss);
    CHECK(read.message().find("rank-1.shard ended at byte 1000") != std::string::npos);
  }
  SECTION("missing") {
    fs::remove(shard);
    auto [step, read] = read_all(3);
    CHECK(read.code() == StatusCode::kDataLoss);
    CHECK(read.message().find("rank-1.shard: cannot open") != std::string::npos);
  }
  SECTION("a torn manifest: the older step, re-sharded") {
    fs::resize_file(dir.path + "/step-2/manifest.json", 30);
    auto [step, read] = read_all(4);
    CHECK(step == 1);
    CHECK(read.ok());
  }
  // Verifying every shard first (the default), Restore passes over the damage.
  std::ofstream(shard, std::ios::trunc).close();
  testing::RestoreGlobal(dir.path, 3, 1, n);
}

TEST_CASE("a world-size change restores a checkpoint of global slices without opting in") {
  TempDir dir;
  testing::SaveGlobal(dir.path, 2, 9, 1000);
  auto r = Make(Options(dir.path, 0, 5))->Restore();
  REQUIRE(r.ok());
  REQUIRE(r->restored());
  CHECK(r->world_size == 2);
  const SavedStep::Array* w = r->saved->Find("w");
  REQUIRE(w != nullptr);
  CHECK(w->dtype == "float32");
  CHECK(w->shape == std::vector<int64_t>{1000});
  CHECK(w->pieces.size() == 2);
  CHECK(r->saved->Find("nothing") == nullptr);
  CHECK(r->saved->Read("nothing", 0, 1, nullptr).code() == StatusCode::kNotFound);
  float x;
  CHECK(r->saved->Read("w", 1000, 1, &x).code() == StatusCode::kOutOfRange);
}

TEST_CASE("elements that no shard holds are reported, not invented") {
  TempDir dir;
  {
    auto c = Make(Options(dir.path));
    std::vector<float> half(50, 1.0f);
    CheckpointState s;
    s.AddSlice("w", half.data(), "float32", sizeof(float), {100}, 0, 50);  // [50, 100) missing
    REQUIRE(c->Save(3, s).ok());
  }
  auto r = Make(Options(dir.path, 0, 2))->Restore();
  REQUIRE(r.ok());
  REQUIRE(r->restored());
  std::vector<float> all(100);
  Status read = r->saved->Read("w", 0, 100, all.data());
  CHECK(read.code() == StatusCode::kDataLoss);
  CHECK(read.message().find("element 50 of \"w\" is in no rank's shard") != std::string::npos);
}

TEST_CASE("the manifest's global slices and chunk checksums round-trip through the parser") {
  TempDir dir;
  testing::SaveGlobal(dir.path, 1, 4, (1u << 20) / sizeof(float) + 3);  // two chunks
  std::ifstream in(dir.path + "/step-4/manifest.json");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  checkpoint_files::Manifest m;
  REQUIRE_FALSE(checkpoint_files::ParseManifest(text, 4, &m).has_value());
  REQUIRE(m.shards.size() == 1);
  CHECK(m.shards[0].chunk_bytes == checkpoint_files::kVerifyChunkBytes);
  CHECK(m.shards[0].chunk_crcs.size() == 2);
  REQUIRE(m.shards[0].entries.size() == 2);
  CHECK(m.shards[0].entries[0].global_shape ==
        std::vector<int64_t>{static_cast<int64_t>((1u << 20) / sizeof(float) + 3)});
  CHECK(m.shards[0].entries[1].global_begin == 0);
  CHECK(checkpoint_files::AllGlobal(m));
  // Written back, parsed again: the same.
  auto j = nlohmann::json::parse(text);
  j["shards"][0]["entries"] = checkpoint_files::EntriesToJson(m.shards[0].entries);
  checkpoint_files::Manifest again;
  REQUIRE_FALSE(checkpoint_files::ParseManifest(j.dump(), 4, &again).has_value());
  CHECK(again.shards[0].entries[0].global_shape == m.shards[0].entries[0].global_shape);
  CHECK(again.shards[0].chunk_crcs == m.shards[0].chunk_crcs);
  // Damaged fields are reasons, not crashes.
  auto bad = j;
  bad["shards"][0]["chunk_crc32c"].erase(0);
  CHECK(checkpoint_files::ParseManifest(bad.dump(), 4, &again).value_or("").find("chunks") !=
        std::string::npos);
  bad = j;
  bad["shards"][0]["entries"][0]["global_begin"] = 1u << 30;
  CHECK(checkpoint_files::ParseManifest(bad.dump(), 4, &again).value_or("").find("outside") !=
        std::string::npos);
  // A shard of one rank's own entries is not all global.
  bad = j;
  bad["shards"][0]["entries"][1].erase("global_shape");
  bad["shards"][0]["entries"][1].erase("global_begin");
  checkpoint_files::Manifest local;
  REQUIRE_FALSE(checkpoint_files::ParseManifest(bad.dump(), 4, &local).has_value());
  CHECK_FALSE(checkpoint_files::AllGlobal(local));
}

}  // namespace
}  // namespace agentrt
