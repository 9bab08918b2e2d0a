// agentrt::Checkpointer — wall-clock, sharded, atomic, asynchronous checkpoints
// with verified resume.
//
// Layout under the agent's checkpoint directory (AGENTRT_CKPT_DIR), all 0700/0600:
//
//   step-<N>/rank-<r>.shard     rank r's bytes: its entries back to back
//   step-<N>/rank-<r>.json      rank r's "shard is durable" record: size, crc32c, entries
//   step-<N>/manifest.json      the commit point, written last by rank 0:
//     {"format": 1, "step": N, "time": <unix s>, "world_size": W, "agent": "...",
//      "shards": [{"rank", "file", "bytes", "crc32c", "chunk_bytes", "chunk_crc32c": [...],
//                  "entries": [{"name", "dtype", "shape", "offset", "bytes",
//                               "global_shape", "global_begin"}]}],
//      "metadata": {...user JSON, e.g. bus offsets...}}
//   "chunk_crc32c" holds the CRC32C of each chunk_bytes-long piece of the shard
//   file, so that a byte range can be read and verified without reading the
//   rest. An entry with "global_shape" is a slice of a global array: its
//   elements are [global_begin, global_begin + shape[0]) of that array
//   flattened in row-major order. Entries without it belong to their rank.
//   (Checkpoints written before chunk and global fields existed still restore.)
//
// Any world size: a checkpoint whose entries are all slices of global arrays
// (CheckpointState::AddSlice) restores at any world size. Restore() then
// returns the step's SavedStep, from which each rank reads the elements it owns
// now, whichever shards hold them (reading only the chunks that cover them).
//
// Save protocol (every rank, on a background writer thread):
//   1. write rank-<r>.shard.tmp, fsync, rename to rank-<r>.shard;
//   2. write rank-<r>.json.tmp, fsync (not rank 0's: only its own commit reads
//      it), rename, fsync the step directory (the shard's name is durable
//      before any manifest names it);
//   3. barrier (optional hook), then rank 0 waits until every rank's record exists
//      (all shards are durable), writes manifest.json.tmp, fsyncs it, renames it into
//      place and fsyncs the step directory and the checkpoint directory (which
//      makes the step directory's own name durable: no fsync when it is made);
//   4. rank 0 renames committed checkpoints beyond keep_last (only after a newer
//      commit) and abandoned uncommitted ones older than this commit out of the
//      way and removes them on a background thread, without fsyncs (a crash that
//      undoes that leaves valid old steps or debris). A one-rank save: 5 fsyncs.
// A crash at any moment leaves either a committed checkpoint (manifest present and
// every checksum right) or debris that Restore() ignores and removes.
//
// Ranks must share the checkpoint directory (one node, or a shared file system);
// that is how rank 0 learns that the other shards are durable without a collective
// on the writer thread.
//
// Triggers: the wall clock (interval_s since the last save started, through an
// injected Clock), RequestSave() (called on SIGUSR2/SIGTERM by Runtime, or by
// anything else), and explicit Save/SaveAsync calls. The training loop asks
// SaveDue() at a convenient point and then saves its state; a trigger that fires
// while a save is in progress is absorbed by that save (not doubled).
//
// Several ranks must save the same step: SaveDue() is local to a rank (its clock,
// its signals), so a multi-rank agent agrees through its group, e.g. rank 0's
// SaveDue() broadcast every iteration (or an all-reduce max of the flag).
//
// Thread-safety: SaveAsync/Save/Wait/Restore are called from one thread (the
// training loop). RequestSave(), SaveDue() and the counters may be called from
// any thread. RequestSave() only touches atomics.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "common/clock.h"
#include "common/status.h"

namespace agentrt {

namespace device {
class Api;
}  // namespace device

struct RestoreResult;
namespace checkpoint_files {
struct SavedStepAccess;
class ChunkChecksums;
class Fd;
}  // namespace checkpoint_files

struct CheckpointOptions {
  std::string dir;    // the agent's checkpoint directory; created 0700 if missing
  std::string agent;  // for messages ("agent predator-0 rank 1: ...")
  int rank = 0;
  int world_size = 1;
  double interval_s = 1800;  // wall-clock cadence; <= 0 disables the timer trigger
  int keep_last = 3;         // committed checkpoints kept (>= 1)
  // Restore() of a checkpoint written by a different world size that holds
  // entries of single ranks (AddBytes, AddArray, AddCustom) fails unless set;
  // then the caller re-shards using LoadShard() for any saved rank. Checkpoints
  // of global slices only (AddSlice) restore at any world size regardless.
  bool allow_resharding = false;
  // Restore() checks every rank's shard checksum (so all ranks agree on the step),
  // not only this rank's. Moot for a restore that loads nothing
  // (RestoreOptions::load_shard false), which checks every shard's size only.
  bool verify_all_shards = true;
  // Optional collective barrier, called by every rank after its shard is durable
  // and before rank 0 commits, and by Restore() after rank 0's cleanup. It runs
  // on the writer thread: it must be safe to call concurrently with the training
  // loop's collectives (e.g. a dedicated communicator), or be left empty.
  std::function<Status()> barrier = {};
  // How long rank 0 waits for the other ranks' shards before the save fails.
  std::chrono::milliseconds commit_timeout = std::chrono::minutes(10);
  size_t io_chunk_bytes = 16u << 20;
  // Called on rank 0's writer thread after each commit (e.g. telemetry to the
  // controller, which records last_checkpoint_step).
  std::function<void(int64_t step)> on_commit = {};
  // Called by Restore() with its outcome, on rank 0 (telemetry: the
  // controller says when an agent started fresh past corrupt checkpoints).
  // A restore that loads nothing (RestoreOptions::load_shard false) and is
  // retried calls it once per attempt: the last call is the outcome.
  std::function<void(const RestoreResult& result)> on_restore = {};
  // This process's launch (the fence's id when it started, plan/fence.h;
  // Runtime sets it). When set, every save checks
  // the directory's fence (plan/fence.h) before it writes and rank 0 again
  // before it commits: a superseded incarnation's save fails
  // (FailedPrecondition "fenced: ...") and writes no manifest.
  std::string incarnation = {};
  // How SaveAsync takes its snapshot of host memory (a state with device
  // entries is staged through pinned memory, one with AddCustom entries
  // copied, whole):
  //   kCopy: a copy of the state (the caller waits for the copy);
  //   kFork: a fork (copy-on-write, checkpoint_files.h ShardWriterProcess):
  //     the caller waits for the fork only, and a page it writes while the
  //     writer process runs is copied then, by the kernel. It pays when the
  //     loop reads the state for a while after the save (an RL rollout)
  //     before it writes it; a loop that rewrites the whole state at once
  //     pays far more than the copy (README: the benchmark table). Falls
  //     back to the copy for state in shared memory (a forked writer would
  //     see it change) or not inherited (MADV_DONTFORK), or when fork fails.
  // agents.yaml: `checkpoint: {snapshot: fork}` (Runtime).
  enum class Snapshot { kCopy, kFork };
  Snapshot snapshot = Snapshot::kCopy;
};

// What one rank saves: views of the caller's memory, copied when the save starts.
// Entry names are labels inside the manifest, never paths.
class CheckpointState {
 public:
  // Copies `bytes` from host memory at `data` at snapshot time.
  void AddBytes(std::string name, const void* data, size_t bytes);
  // A named array: `shape` of elements of `element_bytes` each, tagged `dtype`
  // ("float32", "int64", ...). Host memory.
  void AddArray(std::string name, const void* data, std::string dtype, std::vector<int64_t> shape,
                size_t element_bytes);
  // Memory the checkpointer cannot read directly (GPU tensors): `copy_to_host(dst)`
  // fills `bytes` bytes of host memory at dst (e.g. cudaMemcpy) at snapshot time.
  void AddCustom(std::string name, size_t bytes, std::string dtype, std::vector<int64_t> shape,
                 std::function<Status(void* dst)> copy_to_host);

  // `count` elements of a global array `name` of `global_shape` (row-major):
  // those at flat indices [global_begin, global_begin + count), held at `data`
  // (host memory) or filled by `copy_to_host` (device memory) when non-null.
  // The ranks together should cover the array; an element saved by several
  // ranks (replicated state) is read from one of them. Restore at any world size
  // reads any range of it with SavedStep::Read. A scalar (empty global_shape)
  // is recorded as shape {1}.
  void AddSlice(std::string name, const void* data, std::string dtype, size_t element_bytes,
                std::vector<int64_t> global_shape, uint64_t global_begin, uint64_t count,
                std::function<Status(void* dst)> copy_to_host = {});

  // Where the memory of AddDeviceSlice lives: the device API, the device and
  // the stream whose work writes it (the training stream).
  struct DeviceSource {
    device::Api* api = nullptr;
    int device = 0;
    void* stream = nullptr;  // device::Stream; nullptr: the legacy stream
  };
  // AddSlice of device memory (GPU tensors, ShardedAdam's moments on a GPU),
  // staged without stopping the caller: SaveAsync enqueues a device-to-host
  // copy into the checkpointer's pinned staging buffer on a side stream of its
  // own, after the work already on `source.stream`, and makes that stream's
  // later work wait for the copy (not for the disk); it returns without
  // waiting for either. The writer thread waits for the copy, then writes.
  void AddDeviceSlice(std::string name, const void* device_data, std::string dtype,
                      size_t element_bytes, std::vector<int64_t> global_shape,
                      uint64_t global_begin, uint64_t count, DeviceSource source);

  // This rank's own `bytes` (RNG state, its episode window) as row `rank` of
  // a global {world_size, bytes} array, so that a restore at another world
  // size finds each surviving rank's row (SavedStep::ReadRankRow).
  void AddRankRow(std::string name, const void* data, size_t bytes, int rank, int world_size);

  // User metadata stored in the manifest (e.g. bus offsets, RNG seeds).
  nlohmann::json metadata = nlohmann::json::object();

  struct Entry {
    std::string name;
    std::string dtype;
    std::vector<int64_t> shape;
    size_t bytes = 0;
    const void* data = nullptr;                     // host memory, or
    std::function<Status(void* dst)> copy_to_host;  // a copier, or
    const void* device_data = nullptr;              // device memory (AddDeviceSlice)
    DeviceSource device;
    std::vector<int64_t> global_shape;  // empty: this rank's own entry
    uint64_t global_begin = 0;
  };
  const std::vector<Entry>& entries() const { return entries_; }
  size_t total_bytes() const;

 private:
  std::vector<Entry> entries_;
};

struct ShardEntry {
  std::string name;
  std::string dtype;
  std::vector<int64_t> shape;
  uint64_t offset = 0;
  uint64_t bytes = 0;
  std::vector<int64_t> global_shape;  // empty: the rank's own entry, not a global slice
  uint64_t global_begin = 0;
};

// One committed, verified step seen as global arrays: what a rank of any world
// size reads its part from. Keeps the step directory open.
class SavedStep {
 public:
  struct Piece {  // one shard's slice of an array
    int rank = 0;
    uint64_t begin = 0;   // first element (global flat index)
    uint64_t count = 0;   // elements
    uint64_t offset = 0;  // where in the shard file
  };
  struct Array {
    std::string name;
    std::string dtype;
    std::vector<int64_t> shape;  // global
    uint64_t elements = 0;
    size_t element_bytes = 0;
    std::vector<Piece> pieces;  // sorted by begin
  };

  int64_t step() const { return step_; }
  int world_size() const { return world_size_; }
  const std::string& path() const { return path_; }
  // The global array `name`; null when the step has no slice of that name.
  const Array* Find(std::string_view name) const;
  const std::vector<Array>& arrays() const { return arrays_; }
  // Copies elements [begin, begin + count) of array `name` into dst (count *
  // element_bytes bytes) from whichever shards hold them. Reads only the
  // chunks that cover them, each checked against its CRC32C; a mismatch, a
  // short file or elements no shard holds are DataLoss naming the file.
  Status Read(std::string_view name, uint64_t begin, uint64_t count, void* dst) const;
  // Row `rank` of an array saved with AddRankRow into *row; false (and *row
  // empty) when the saving run had no such rank.
  Result<bool> ReadRankRow(std::string_view name, int rank, std::vector<std::byte>* row) const;

  ~SavedStep();
  SavedStep(const SavedStep&) = delete;
  SavedStep& operator=(const SavedStep&) = delete;

 private:
  friend struct checkpoint_files::SavedStepAccess;  // builds it from a verified manifest
  SavedStep() = default;
  // Bytes [lo, hi) of rank's shard into dst, whole chunks read and verified.
  Status ReadRange(int rank, uint64_t lo, uint64_t hi, std::byte* dst,
                   std::vector<std::byte>& scratch) const;
  int64_t step_ = -1;
  int world_size_ = 0;
  std::string path_;
  int step_fd_ = -1;
  std::vector<Array> arrays_;          // sorted by name
  std::vector<uint64_t> chunk_bytes_;  // per rank
  std::vector<uint64_t> shard_bytes_;  // per rank
  // One rank's shard already read and verified whole (Restore's own): its
  // pieces are copied from memory rather than read again.
  int loaded_rank_ = -1;
  std::shared_ptr<const std::byte[]> loaded_;
  std::vector<std::vector<uint32_t>> chunk_crcs_;  // per rank
};

// One rank's restored bytes. Owns its memory.
class ShardData {
 public:
  int rank() const { return rank_; }
  const std::vector<ShardEntry>& entries() const { return entries_; }
  // The bytes of entry `name`; empty when there is no such entry.
  std::span<const std::byte> Bytes(std::string_view name) const;
  // Copies entry `name` into dst, which holds exactly `bytes` bytes; the error
  // names the entry and both sizes when they differ.
  Status CopyTo(std::string_view name, void* dst, size_t bytes) const;
  size_t size() const { return size_; }

  // Replaces the contents with `size` uninitialised bytes described by `entries`
  // and returns where to put them (for the Checkpointer and storage code).
  std::byte* Allocate(int rank, std::vector<ShardEntry> entries, size_t size);
  // The bytes, owned jointly (null when nothing was loaded).
  std::shared_ptr<const std::byte[]> shared_data() const { return data_; }

 private:
  int rank_ = 0;
  std::vector<ShardEntry> entries_;
  std::shared_ptr<std::byte[]> data_;  // shared with the step's SavedStep
  size_t size_ = 0;
};

// A checkpoint that Restore() passed over, and why.
struct CorruptCheckpoint {
  int64_t step = -1;
  std::string file;    // path of the offending file
  std::string reason;  // "checksum mismatch: manifest says 0x..., file has 0x..."
};

// The outcome of Restore():
//   kRestored  `step` verified and loaded (possibly after skipping newer corrupt ones,
//              or, RestoreOptions::load_shard false, checked for its sizes only,
//              listed in `skipped`: the fallback case);
//   kFresh     no committed checkpoint exists: start from scratch;
//   kCorrupt   committed checkpoints exist but none verifies (see `skipped`).
struct RestoreResult {
  enum class Kind { kRestored, kFresh, kCorrupt };
  Kind kind = Kind::kFresh;
  int64_t step = -1;
  double time = 0;          // when it was saved, Unix seconds
  int world_size = 0;       // the saving run's world size
  nlohmann::json metadata;  // user metadata of the restored checkpoint
  ShardData shard;          // this rank's shard (kRestored, rank < world_size, loaded)
  // kRestored: the step as global arrays, to read slices at this world size.
  std::shared_ptr<const SavedStep> saved;
  std::vector<CorruptCheckpoint> skipped;

  bool restored() const { return kind == Kind::kRestored; }
  // One line for logs: "restored step 40 from DIR (skipped step 50: FILE: reason)".
  std::string Describe() const;
};

// How Restore() goes about it.
struct RestoreOptions {
  // false: a checkpoint of global slices only (CheckpointState::AddSlice) is
  // checked for its manifest and every shard's presence and size, and nothing
  // is read now: the caller reads what it needs through RestoreResult::saved,
  // every chunk verified as it is read, straight into its own memory (one
  // pass over the bytes). A DataLoss from such a read means the step is
  // corrupt: restore again with before_step set to it. Every rank must then
  // read the same arrays (and the RNG rows of all ranks, say) for the ranks
  // to agree on the step. Other checkpoints load as with true.
  bool load_shard = true;
  // >= 0: only steps older than this one: the retry after a read found
  // `before_step` corrupt. It removes no debris and calls no barrier (the
  // first Restore did both).
  int64_t before_step = -1;
  // The retry's: what that read said (its DataLoss message). When given,
  // Restore lists `before_step` in RestoreResult::skipped with it, naming the
  // shard file the message names (else the step's folder).
  std::string before_step_error = {};
  // Reported first in RestoreResult::skipped: the previous attempt's.
  std::vector<CorruptCheckpoint> skipped = {};
};

struct CheckpointStats {
  uint64_t saves_started = 0;
  uint64_t saves_committed = 0;        // rank 0: manifests written; others: shards durable
  uint64_t triggers_absorbed = 0;      // triggers that fired during a save in progress
  double last_snapshot_s = 0;          // how long the training loop was blocked
  bool last_snapshot_forked = false;   // that snapshot was a fork (CheckpointOptions::snapshot)
  std::string last_snapshot_fallback;  // why a fork asked for was not made (then: a copy)
  double last_write_s = 0;             // background write + commit time
};

// One copy of a snapshot: `bytes` from `src` to `dst`.
struct CopyJob {
  std::byte* dst;
  const std::byte* src;
  size_t bytes;
};
// Runs the copies, on up to kSnapshotThreads threads (the caller's among them)
// when they add up to kParallelSnapshotBytes or more: SaveAsync's snapshot.
inline constexpr size_t kSnapshotThreads = 4;
inline constexpr size_t kParallelSnapshotBytes = size_t{64} << 20;
void CopyInParallel(const std::vector<CopyJob>& jobs);

class Checkpointer {
 public:
  // Creates the directory (0700) if needed. `clock` must outlive the Checkpointer.
  static Result<std::unique_ptr<Checkpointer>> Create(CheckpointOptions options,
                                                      const Clock* clock = SteadyClock());
  // Waits for a save in progress.
  ~Checkpointer();
  Checkpointer(const Checkpointer&) = delete;
  Checkpointer& operator=(const Checkpointer&) = delete;

  // Finds the newest checkpoint whose manifest and checksums verify and loads this
  // rank's shard (or, with `options.load_shard` false, see RestoreOptions). Rank 0 first removes
  // debris of crashed saves (tmp files, uncommitted step directories). Collective when a barrier is
  // set. Fails (rather than returning kCorrupt) only when the world size changed without
  // allow_resharding, or on an I/O error of the directory itself.
  Result<RestoreResult> Restore();
  Result<RestoreResult> Restore(const RestoreOptions& options);

  // Loads and verifies the shard of any `rank` of a committed step (re-sharding).
  Result<ShardData> LoadShard(int64_t step, int rank);

  // Asks for a save at the training loop's next SaveDue() check. Async-signal-safe.
  void RequestSave();
  // True when a save was requested or interval_s passed since the last save
  // started (or since Create), and no save is in progress.
  bool SaveDue() const;

  // Snapshots `state` into host memory now (blocking only for the copy), then
  // writes and commits it on a background thread. Waits first for a previous
  // save still in progress. Saving a step that is already committed is a no-op.
  Status SaveAsync(int64_t step, const CheckpointState& state);
  // Saves and commits `state` before returning. Host-memory entries are written
  // straight from the caller's memory (no snapshot copy, no extra memory); a
  // state with copier entries (GPU) goes through SaveAsync + Wait.
  Status Save(int64_t step, const CheckpointState& state);
  // Waits for the save in progress (if any) and returns how it ended.
  Status Wait();

  bool saving() const { return saving_.load(); }
  // The newest step this rank knows committed (rank 0) / durable (others); -1 if none.
  int64_t last_saved_step() const { return last_saved_step_.load(); }
  CheckpointStats stats() const;
  const CheckpointOptions& options() const { return options_; }
  // How the next SaveAsync snapshots (options().snapshot at first).
  void set_snapshot(CheckpointOptions::Snapshot how) { snapshot_how_ = how; }
  CheckpointOptions::Snapshot snapshot() const { return snapshot_how_.load(); }

 private:
  Checkpointer(CheckpointOptions options, const Clock* clock, int dir_fd);
  // The common start of a save; false in *go when `step` is already committed.
  Status BeginSave(int64_t step, bool* go);
  // The step's directory (created), after the fence check.
  Result<checkpoint_files::Fd> OpenStepDir(int64_t step);
  // Writes `parts` into this rank's shard of the step (a temporary, fsynced,
  // then renamed), checksummed into `chunks`.
  Status WriteShard(int step_fd, int64_t step, const std::vector<std::span<const std::byte>>& parts,
                    checkpoint_files::ChunkChecksums& chunks);
  // This rank's record of the written shard, then the barrier and rank 0's commit.
  Status CommitShard(int64_t step, int step_fd, const nlohmann::json& metadata,
                     const std::vector<ShardEntry>& entries, size_t bytes,
                     std::vector<uint32_t> chunk_crcs, uint32_t whole_crc);
  // SaveAsync's snapshot by fork: true when a writer process holds it and
  // writer_ commits what it writes; false (nothing started) to copy instead,
  // with *why_not set when a fork was asked for (snapshot kFork).
  bool SaveForked(int64_t step, const CheckpointState& state,
                  const std::vector<ShardEntry>& entries, size_t total, std::string* why_not);
  // Writes `parts` (the shard's bytes, in order: `bytes` in all) and commits.
  Status WriteAndCommit(int64_t step, const nlohmann::json& metadata,
                        const std::vector<ShardEntry>& entries, size_t bytes,
                        const std::vector<std::span<const std::byte>>& parts);
  // Runs a write (and commit), with its time and outcome in the stats.
  Status Timed(const std::function<Status()>& write);
  Status CommitAsRankZero(int64_t step, int step_fd, const nlohmann::json& metadata);
  // Drops the steps past keep_last (and abandoned ones): each is renamed to
  // `.<step>.pruned.tmp` at once (the commit's caller does not wait for the
  // unlinking of gigabytes) and removed by reaper_; one left by a crash is
  // debris (CleanDebris).
  void Prune(int64_t committed_step);
  void JoinReaper();
  Status CleanDebris();
  std::string Where() const;  // "agent X rank R: "

  CheckpointOptions options_;
  const Clock* clock_;
  int dir_fd_;
  std::atomic<CheckpointOptions::Snapshot> snapshot_how_;

  std::unique_ptr<std::byte[]> snapshot_;
  size_t snapshot_capacity_ = 0;
  // Device entries' staging (AddDeviceSlice): pinned host memory, reused
  // from save to save, and the side stream and events of its copies.
  struct Staging {
    device::Api* api = nullptr;
    int device = 0;
    void* pinned = nullptr;
    size_t capacity = 0;
    void* side = nullptr;    // device::Stream
    void* ready = nullptr;   // device::Event: a source stream's work so far
    void* copied = nullptr;  // device::Event: the staging copies
  } staging_;
  // Makes staging_ ready for a snapshot of `total` bytes of `state` (whose
  // device entries must share one device): its pinned buffer, returned.
  Result<std::byte*> PrepareStaging(const CheckpointState& state, size_t total);
  void FreeStaging();

  std::thread writer_;
  std::thread reaper_;  // removes what Prune renamed away (at most one at a time)
  std::atomic<bool> saving_{false};
  std::atomic<bool> requested_{false};
  std::atomic<Clock::TimePoint::rep> last_start_;
  std::atomic<int64_t> last_saved_step_{-1};
  Status writer_status_;

  mutable std::mutex stats_mu_;
  CheckpointStats stats_;
  std::atomic<uint64_t> absorbed_{0};
};

// Population-based training's exploit (scheduler/pbt.h): the newest committed
// checkpoint of another agent whose every shard verifies becomes this agent's.
//   1. the donor's shards are copied into `to_dir`/step-<N>.tmp/ while their
//      crc32c is checked against the donor's manifest (a mismatch: the next
//      older step is tried), each fsynced;
//   2. the manifest follows, naming `to_agent`, with the donor's metadata but
//      the `keep_own` keys from the recipient's own newest checkpoint (e.g. its
//      bus offsets: its message streams go on where they were), and
//      "adopted_from": {"agent", "step"}; fsynced;
//   3. the directory is renamed to step-<N> (the commit point, as a save's
//      manifest is), and the recipient's other step directories are moved under
//      `to_dir`/replaced/<unix ns>/ (kept, never restored from), so Restore()
//      finds the adopted one.
// Call it only while no rank of the recipient runs. The donor may run: nothing
// of its directory is written.
struct AdoptOptions {
  std::string from_dir;
  std::string from_agent;
  std::string to_dir;
  std::string to_agent;
  int world_size = 1;  // both agents' ranks
  std::vector<std::string> keep_own = {"bus_offsets", "bus_incarnation"};
  // Kept in the adopted checkpoint's metadata as adopted_from.note (null:
  // none). PBT keeps its lineage record there, so that a controller that dies
  // between the adoption and its lineage line finds the exploit on resume.
  nlohmann::json note;
};
struct AdoptResult {
  int64_t step = -1;     // the adopted step (its number is the donor's)
  std::string archived;  // where the recipient's own checkpoints went ("" when it had none)
  std::vector<CorruptCheckpoint> skipped;  // donor steps that did not verify
  // After the commit nothing fails the adoption (the weights are in place):
  // what could not be moved aside or synced is said here.
  std::vector<std::string> warnings;
};
Result<AdoptResult> AdoptCheckpoint(const AdoptOptions& options);

// The step and metadata of `agent`'s newest checkpoint in `dir` that
// verifies (its manifest and shard records; no payload is read): step -1 and
// null metadata when there is none (or no such directory).
struct NewestCheckpointInfo {
  int64_t step = -1;
  nlohmann::json metadata;
};
Result<NewestCheckpointInfo> NewestCheckpoint(const std::string& dir, const std::string& agent);

// Joins `relative` under `root`, refusing anything that could leave it: an empty
// or absolute path, a ".." component, or an existing symlink along the way that
// resolves outside `root`. Used for agent names and any user-chosen sub-path.
Result<std::string> ConfinedPath(const std::string& root, std::string_view relative);

}  // namespace agentrt
