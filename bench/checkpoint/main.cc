// bench_checkpoint: checkpoint figures, each against an anchor measured
// in the same run on the same disk.
//
//   save_throughput     4 ranks (threads, one Checkpointer each, a shared barrier)
//                       save a 1 GiB state (4 shards of 256 MiB) synchronously:
//                       bytes / (start .. manifest committed).
//                       anchor: dd if=/dev/zero bs=16M count=64 conv=fsync.
//   o_direct_write      one dd per shard at once, the same bytes, with oflag=direct
//                       (past the page cache). anchor: the same dds without it.
//   async_save_stall    how long SaveAsync blocks the training loop (the snapshot
//                       copy; slowest rank), steady state (snapshot buffers warm).
//                       anchor: the synchronous save of the same state.
//   restore_throughput  Restore() of rank 0 with checksum verification of every
//                       shard (1 GiB read + CRC32C), after dropping the shard files
//                       from the page cache with posix_fadvise(DONTNEED).
//                       anchor: plain read() of the same files after the same drop,
//                       a thread per file (the restore reads up to 4 shards at once).
//   async_save_stall_fork  the same for one rank saving the whole state (a
//                       one-process agent) with `snapshot: fork` (CheckpointOptions::
//                       Snapshot::kFork): SaveAsync blocks for the fork only.
//                       anchor: that rank's synchronous save.
//   fork_rewrite        what the training loop pays instead: a rewrite of every
//                       byte of the state right after that SaveAsync, while the
//                       writer process runs (each page copied once by the kernel).
//                       anchor: the same rewrite with no save in flight.
//   resharded_restore   the same state saved as a global array by 2 ranks, restored
//                       by 4 (threads): each Restore()s (verify_all_shards off) and
//                       reads its quarter with SavedStep::Read, cold cache; wall time.
//                       anchor: the same restore of the state saved by 4 ranks.
//
// Medians over --reps runs. --bytes makes the state smaller (e.g. 268435456).
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <barrier>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "agent_runtime/checkpointer.h"
#include "bench/figure.h"

namespace {

using agentrt::bench::Median;

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

double Since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// CPU seconds (user + system) of this process so far, all threads.
double CpuSeconds() {
  rusage u{};
  ::getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         1e-6 * static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}

[[noreturn]] void Die(const std::string& what) {
  std::cerr << "bench_checkpoint: " << what << "\n";
  std::exit(1);
}

void Check(const agentrt::Status& s) {
  if (!s.ok()) Die(s.ToString());
}

// Drops a file's clean pages from the page cache.
void DropFromCache(const fs::path& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return;
  ::fdatasync(fd);
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
}

// Tolerates files that vanish meanwhile (a checkpointer's background pruning).
void DropTree(const fs::path& dir) {
  std::error_code ec;
  for (fs::recursive_directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    if (it->is_regular_file(ec)) DropFromCache(it->path());
  }
}

// Seconds for `dd if=/dev/zero of=FILE bs=16M count=N conv=fsync` (plus `flags`).
double RunDd(const fs::path& file, size_t count, const std::string& flags = "") {
  std::string cmd = "dd if=/dev/zero of='" + file.string() +
                    "' bs=16M count=" + std::to_string(count) + " conv=fsync " + flags +
                    " status=none";
  auto t = Clock::now();
  if (std::system(cmd.c_str()) != 0) Die("dd failed: " + cmd);
  double s = Since(t);
  fs::remove(file);
  return s;
}

// Seconds to read every regular file under `dir` with plain read() into `buf`.
// The files are read at once, a thread each, as the restore reads its
// shards (up to 4 at a time), so that both sides have as many reads in flight.
double ReadAll(const std::vector<fs::path>& files, std::vector<std::vector<char>>& bufs) {
  auto t = Clock::now();
  std::vector<std::thread> readers;
  for (size_t i = 0; i < files.size(); ++i) {
    readers.emplace_back([&files, &bufs, i] {
      const fs::path& f = files[i];
      int fd = ::open(f.c_str(), O_RDONLY | O_CLOEXEC);
      if (fd < 0) Die("open " + f.string());
      ::posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
      std::vector<char>& buf = bufs[i % bufs.size()];
      while (::read(fd, buf.data(), buf.size()) > 0) {
      }
      ::close(fd);
    });
  }
  for (auto& r : readers) r.join();
  return Since(t);
}

// Seconds for `streams` dd processes at once, each writing `count` 16 MiB
// blocks to its own file with conv=fsync (plus `flags`).
double RunDdStreams(const fs::path& dir, int streams, size_t count, const std::string& flags) {
  std::string cmd;
  for (int i = 0; i < streams; ++i) {
    cmd += "dd if=/dev/zero of='" + (dir / ("dd." + std::to_string(i))).string() +
           "' bs=16M count=" + std::to_string(count) + " conv=fsync " + flags + " status=none & ";
  }
  cmd += "wait";
  auto t = Clock::now();
  if (std::system(cmd.c_str()) != 0) Die("dd failed: " + cmd);
  double s = Since(t);
  for (int i = 0; i < streams; ++i) fs::remove(dir / ("dd." + std::to_string(i)));
  return s;
}

struct World {
  std::vector<std::unique_ptr<agentrt::Checkpointer>> ranks;
  std::unique_ptr<std::barrier<>> sync;
};

World MakeWorld(const std::string& dir, int shards) {
  World w;
  w.sync = std::make_unique<std::barrier<>>(shards);
  for (int r = 0; r < shards; ++r) {
    agentrt::CheckpointOptions o{.dir = dir,
                                 .agent = "bench",
                                 .rank = r,
                                 .world_size = shards,
                                 .interval_s = 0,
                                 .keep_last = 1};
    std::barrier<>* b = w.sync.get();
    o.barrier = [b] {
      b->arrive_and_wait();
      return agentrt::Status::Ok();
    };
    auto c = agentrt::Checkpointer::Create(o);
    if (!c.ok()) Die(c.status().ToString());
    w.ranks.push_back(std::move(c).value());
  }
  return w;
}

// Runs fn(rank) on one thread per rank and waits.
template <typename Fn>
void OnEveryRank(int shards, Fn fn) {
  std::vector<std::thread> threads;
  for (int r = 0; r < shards; ++r) threads.emplace_back([&fn, r] { fn(r); });
  for (auto& t : threads) t.join();
}

void PrintFigure(const char* metric, double value, const char* unit, const std::string& anchor,
                 double anchor_value) {
  agentrt::bench::PrintFigure("checkpoint", metric, value, unit, anchor, anchor_value);
}

// Rank r of `world` saves its block of the global array "params" (the
// concatenated per-rank buffers of `state`) as global slices, into `dir`.
void SaveGlobal(const std::string& dir, int world, int64_t step,
                const std::vector<std::unique_ptr<uint64_t[]>>& state, size_t words_per_buffer) {
  World w = MakeWorld(dir, world);
  const uint64_t n = words_per_buffer * state.size();
  OnEveryRank(world, [&](int r) {
    const uint64_t lo = n * static_cast<uint64_t>(r) / static_cast<uint64_t>(world);
    const uint64_t hi = n * static_cast<uint64_t>(r + 1) / static_cast<uint64_t>(world);
    agentrt::CheckpointState s;
    for (uint64_t at = lo; at < hi;) {  // one slice per buffer the block touches
      const size_t b = static_cast<size_t>(at / words_per_buffer);
      const uint64_t stop = std::min<uint64_t>(hi, (b + 1) * words_per_buffer);
      s.AddSlice("params", state[b].get() + (at - b * words_per_buffer), "uint64", 8,
                 {static_cast<int64_t>(n)}, at, stop - at);
      at = stop;
    }
    Check(w.ranks[static_cast<size_t>(r)]->Save(step, s));
  });
}

// Seconds for `world` ranks to restore `dir` and read their blocks of
// "params" into `dest` (one buffer per rank), cold cache.
double RestoreBlocks(const std::string& dir, int world, int64_t step,
                     std::vector<std::unique_ptr<uint64_t[]>>& dest, size_t words_per_buffer) {
  DropTree(dir);
  const uint64_t n = words_per_buffer * dest.size();
  auto t = Clock::now();
  OnEveryRank(world, [&](int r) {
    agentrt::CheckpointOptions o{.dir = dir,
                                 .agent = "bench",
                                 .rank = r,
                                 .world_size = world,
                                 .interval_s = 0,
                                 .verify_all_shards = false};
    auto c = agentrt::Checkpointer::Create(o);
    if (!c.ok()) Die(c.status().ToString());
    auto restored = (*c)->Restore();
    if (!restored.ok()) Die(restored.status().ToString());
    if (!restored->restored() || restored->step != step) Die("restore: " + restored->Describe());
    const uint64_t lo = n * static_cast<uint64_t>(r) / static_cast<uint64_t>(world);
    const uint64_t hi = n * static_cast<uint64_t>(r + 1) / static_cast<uint64_t>(world);
    Check(restored->saved->Read("params", lo, hi - lo, dest[static_cast<size_t>(r)].get()));
  });
  return Since(t);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"bench_checkpoint: checkpoint save/stall/restore against dd and read()"};
  size_t total_bytes = size_t{1} << 30;
  int shards = 4;
  int reps = 3;
  std::string dir = "runs/.bench-checkpoint";
  app.add_option("--bytes", total_bytes, "state size in bytes (multiple of 16 MiB)");
  app.add_option("--shards", shards, "ranks / shards");
  app.add_option("--reps", reps, "repetitions (median)");
  app.add_option("--dir", dir, "scratch directory on the disk to measure (removed afterwards)");
  CLI11_PARSE(app, argc, argv);
  const size_t chunk = size_t{16} << 20;
  if (total_bytes < chunk || total_bytes % chunk != 0) Die("--bytes must be a multiple of 16 MiB");
  if (shards < 1 || total_bytes % static_cast<size_t>(shards) != 0)
    Die("--bytes must divide into --shards");
  const size_t shard_bytes = total_bytes / static_cast<size_t>(shards);
  const double mb = static_cast<double>(total_bytes) / 1e6;

  fs::path root = fs::absolute(dir) / std::to_string(::getpid());
  fs::create_directories(root);
  std::cerr << "bench_checkpoint: " << total_bytes / (1 << 20) << " MiB in " << shards
            << " shards under " << root << ", " << reps << " reps\n";

  // The training state: distinct, non-zero bytes per rank.
  std::vector<std::unique_ptr<uint64_t[]>> state;
  for (int r = 0; r < shards; ++r) {
    state.emplace_back(new uint64_t[shard_bytes / 8]);
    uint64_t x = 0x9E3779B97F4A7C15ull * static_cast<uint64_t>(r + 1);
    for (size_t i = 0; i < shard_bytes / 8; ++i)
      state[static_cast<size_t>(r)][i] = (x += 0x9E3779B97F4A7C15ull);
  }
  auto make_state = [&](int r) {
    agentrt::CheckpointState s;
    s.AddArray("params", state[static_cast<size_t>(r)].get(), "uint64",
               {static_cast<int64_t>(shard_bytes / 8)}, 8);
    s.metadata = {{"bench", true}};
    return s;
  };

  const std::string ckpt_dir = (root / "ckpt").string();
  World world = MakeWorld(ckpt_dir, shards);
  int64_t step = 0;

  // Warm-up: allocate the snapshot buffers once, as a training run would.
  ++step;
  OnEveryRank(shards, [&](int r) {
    Check(world.ranks[static_cast<size_t>(r)]->Save(step, make_state(r)));
  });

  std::vector<double> dd_s, dd_direct_s, dd_streams_s, save_s, stall_s, restore_s, read_s,
      reshard_s, same_s, one_save_s, fork_stall_s, rewrite_s, rewrite_alone_s;
  // One rank holding the whole state (the `state` arrays as its entries).
  const std::string one_dir = (root / "one-rank").string();
  auto one = agentrt::Checkpointer::Create(
      {.dir = one_dir, .agent = "bench", .snapshot = agentrt::CheckpointOptions::Snapshot::kFork});
  if (!one.ok()) Die(one.status().ToString());
  auto whole_state = [&] {
    agentrt::CheckpointState s;
    for (int r = 0; r < shards; ++r) {
      s.AddArray("params-" + std::to_string(r), state[static_cast<size_t>(r)].get(), "uint64",
                 {static_cast<int64_t>(shard_bytes / 8)}, 8);
    }
    return s;
  };
  // An optimizer step's writes: every word of the state moved by `by` (the
  // second rewrite undoes the first: the re-sharded checkpoints saved above
  // must still match the state).
  auto rewrite = [&](uint64_t by) {
    const auto t0 = Clock::now();
    for (auto& words : state) {
      for (size_t i = 0; i < shard_bytes / 8; ++i) words[i] += by;
    }
    return Since(t0);
  };
  // Re-sharding 2 -> 4: the same bytes as global slices, saved by 2 ranks and by 4.
  const std::string ckpt2 = (root / "global-2").string(), ckpt4 = (root / "global-4").string();
  SaveGlobal(ckpt2, 2, 1, state, shard_bytes / 8);
  SaveGlobal(ckpt4, 4, 1, state, shard_bytes / 8);
  std::vector<std::unique_ptr<uint64_t[]>> blocks;
  for (int r = 0; r < 4; ++r) blocks.emplace_back(new uint64_t[(total_bytes / 8 + 3) / 4 + 1]);
  std::vector<std::vector<char>> read_bufs(static_cast<size_t>(shards), std::vector<char>(chunk));
  for (int rep = 0; rep < reps; ++rep) {
    dd_s.push_back(RunDd(root / "dd.tmp", total_bytes / chunk));
    // Past the page cache or through it, as many writers as the save has ranks.
    const size_t per = total_bytes / chunk / static_cast<size_t>(shards);
    dd_direct_s.push_back(RunDdStreams(root, shards, per, "oflag=direct"));
    dd_streams_s.push_back(RunDdStreams(root, shards, per, ""));

    // Synchronous save.
    ++step;
    auto t = Clock::now();
    OnEveryRank(shards, [&](int r) {
      Check(world.ranks[static_cast<size_t>(r)]->Save(step, make_state(r)));
    });
    save_s.push_back(Since(t));

    // Async save: the training loop is blocked only inside SaveAsync.
    ++step;
    std::vector<double> blocked(static_cast<size_t>(shards));
    OnEveryRank(shards, [&](int r) {
      auto t0 = Clock::now();
      Check(world.ranks[static_cast<size_t>(r)]->SaveAsync(step, make_state(r)));
      blocked[static_cast<size_t>(r)] = Since(t0);
      Check(world.ranks[static_cast<size_t>(r)]->Wait());
    });
    stall_s.push_back(*std::max_element(blocked.begin(), blocked.end()));

    double restore_cpu_s = 0;
    // Restore with verification, cold cache; then plain read() of the same files, cold cache.
    fs::path step_dir = fs::path(ckpt_dir) / ("step-" + std::to_string(step));
    std::vector<fs::path> files;
    for (int r = 0; r < shards; ++r)
      files.push_back(step_dir / ("rank-" + std::to_string(r) + ".shard"));
    DropTree(ckpt_dir);
    {
      agentrt::CheckpointOptions o{
          .dir = ckpt_dir, .agent = "bench", .rank = 0, .world_size = shards};
      auto c = agentrt::Checkpointer::Create(o);
      if (!c.ok()) Die(c.status().ToString());
      double cpu0 = CpuSeconds();
      auto t1 = Clock::now();
      auto restored = (*c)->Restore();
      double s = Since(t1);
      restore_cpu_s = CpuSeconds() - cpu0;
      if (!restored.ok()) Die(restored.status().ToString());
      if (!restored->restored() || restored->step != step) Die("restore: " + restored->Describe());
      if (std::memcmp(restored->shard.Bytes("params").data(), state[0].get(), shard_bytes) != 0) {
        Die("restore: rank 0's bytes differ from the saved state");
      }
      restore_s.push_back(s);
    }
    for (const auto& f : files) DropFromCache(f);
    double cpu1 = CpuSeconds();
    read_s.push_back(ReadAll(files, read_bufs));
    double read_cpu_s = CpuSeconds() - cpu1;
    reshard_s.push_back(RestoreBlocks(ckpt2, 4, 1, blocks, shard_bytes / 8));
    if (shards == 4 && std::memcmp(blocks[3].get(), state[3].get(), shard_bytes) != 0) {
      Die("re-sharded restore: rank 3's block differs from the saved state");
    }
    same_s.push_back(RestoreBlocks(ckpt4, 4, 1, blocks, shard_bytes / 8));
    // One rank: synchronous save, then SaveAsync and at once a rewrite of the
    // state while its writer runs, then the same rewrite alone.
    ++step;
    auto t2 = Clock::now();
    Check((*one)->Save(step, whole_state()));
    one_save_s.push_back(Since(t2));
    ++step;
    t2 = Clock::now();
    Check((*one)->SaveAsync(step, whole_state()));
    fork_stall_s.push_back(Since(t2));
    if (!(*one)->stats().last_snapshot_forked) Die("the one-rank SaveAsync did not fork");
    rewrite_s.push_back(rewrite(1));
    Check((*one)->Wait());
    rewrite_alone_s.push_back(rewrite(~uint64_t{0}));
    std::cerr << "rep " << rep << ": one rank: save " << one_save_s.back() << " s, fork stall "
              << fork_stall_s.back() << " s, rewrite while writing " << rewrite_s.back()
              << " s, alone " << rewrite_alone_s.back() << " s\n";
    std::cerr << "rep " << rep << ": resharded 2->4 " << reshard_s.back() << " s, 4->4 "
              << same_s.back() << " s\n";
    std::cerr << "rep " << rep << ": dd " << dd_s.back() << " s, save " << save_s.back()
              << " s, stall " << stall_s.back() << " s, restore " << restore_s.back() << " s (cpu "
              << restore_cpu_s << " s), read " << read_s.back() << " s (cpu " << read_cpu_s
              << " s)\n";
  }
  world.ranks.clear();
  one->reset();
  fs::remove_all(root);
  std::error_code ec;
  fs::remove(fs::absolute(dir), ec);  // only if empty

  double load[3] = {0, 0, 0};
  if (::getloadavg(load, 3) > 0) {
    std::cerr << "load average during the run: " << load[0] << " ("
              << std::thread::hardware_concurrency() << " cores)\n";
  }
  const std::string dd_anchor =
      "dd if=/dev/zero bs=16M count=" + std::to_string(total_bytes / chunk) +
      " conv=fsync (same disk, same run)";
  PrintFigure("save_throughput", mb / Median(save_s), "MB/s", dd_anchor, mb / Median(dd_s));
  // Whether writing past the page cache would pay on this disk: the saves
  // write through it (and fsync), so this says what O_DIRECT could gain.
  PrintFigure(
      "o_direct_write", mb / Median(dd_direct_s), "MB/s",
      std::to_string(shards) + " dd conv=fsync at once, the same bytes without oflag=direct",
      mb / Median(dd_streams_s));
  PrintFigure("async_save_stall", Median(stall_s), "s", "synchronous save of the same state",
              Median(save_s));
  PrintFigure("async_save_stall_fork", Median(fork_stall_s), "s",
              "synchronous save of the same state by one rank", Median(one_save_s));
  PrintFigure("fork_rewrite", Median(rewrite_s), "s",
              "the same rewrite of every byte of the state, no save in flight",
              Median(rewrite_alone_s));
  PrintFigure("restore_throughput", mb / Median(restore_s), "MB/s",
              "read() of the same shard files, a thread each, after posix_fadvise(DONTNEED)",
              mb / Median(read_s));
  PrintFigure("resharded_restore_2to4", Median(reshard_s), "s",
              "restore of the same state saved by 4 ranks (4 -> 4, cold cache)", Median(same_s));
  return 0;
}
