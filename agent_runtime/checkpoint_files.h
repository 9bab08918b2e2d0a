// The checkpoint directory's files as the checkpoint library reads and writes
// them: names (step-<N>/, rank-<r>.shard, rank-<r>.json, manifest.json), the
// manifest's parser, verification of a committed step, and the
// no-symlink-following file operations under an open directory. Internal to
// agent_runtime/checkpointer.cc and checkpoint_adopt.cc; the format itself is
// described in agent_runtime/checkpointer.h.
#pragma once

#include <sys/types.h>
#include <unistd.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "agent_runtime/checkpointer.h"
#include "common/crc32c.h"
#include "common/status.h"

namespace agentrt::checkpoint_files {

inline constexpr int kFormat = 1;
inline constexpr char kManifest[] = "manifest.json";
inline constexpr size_t kMaxJsonBytes = 64u << 20;
// The verification granularity of a shard file ("chunk_bytes"): a re-sharded
// restore reads and checks whole chunks of this size around what it needs.
inline constexpr uint64_t kVerifyChunkBytes = 1u << 20;
// Shards a restore reads and checks at once (VerifyStep with every shard verified).
inline constexpr size_t kVerifyThreads = 4;

double Seconds(std::chrono::steady_clock::duration d);
double UnixNow();

std::string StepName(int64_t step);
std::string ShardName(int rank);
std::string RecordName(int rank);
// The step of a "step-<N>" name (one spelling per step: no leading zeros).
std::optional<int64_t> ParseStepName(std::string_view name);
bool EndsWith(std::string_view s, std::string_view suffix);
std::string Hex(uint32_t v);

// A file descriptor closed on scope exit.
class Fd {
 public:
  explicit Fd(int fd = -1) : fd_(fd) {}
  ~Fd() { Reset(); }
  Fd(Fd&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  Fd& operator=(Fd&& o) noexcept {
    Reset();
    fd_ = std::exchange(o.fd_, -1);
    return *this;
  }
  int get() const { return fd_; }
  bool ok() const { return fd_ >= 0; }
  void Reset() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

 private:
  int fd_;
};

Status Fsync(int fd, const std::string& path);
// Writes `content` to dir/name via a temporary + fsync + rename (not the directory fsync).
Status WriteFileAtomic(int dir_fd, const std::string& dir_path, const std::string& name,
                       std::string_view content);
// Reads a small file (manifest, record) without following symlinks.
Result<std::string> ReadSmallFile(int dir_fd, const std::string& name, const std::string& path);
bool ExistsAt(int dir_fd, const std::string& name);
// Removes dir_fd/name, recursively for directories, never following symlinks.
void RemoveTreeAt(int dir_fd, const std::string& name, int depth = 0);
Result<std::vector<std::string>> ListDir(int dir_fd, const std::string& path);
// Step numbers of the step-<N> directories (real directories, not symlinks), newest first.
Result<std::vector<int64_t>> ListSteps(int dir_fd, const std::string& path);
Status MakeDirs0700(const std::string& dir);
nlohmann::json EntriesToJson(const std::vector<ShardEntry>& entries);

// Reads `bytes` bytes of fd into dst (or into `scratch` when dst is null) and
// returns their CRC32C. The checksum of chunk i runs on a helper thread while
// chunk i+1 is read, so restore costs about max(read, checksum), not the sum.
Result<uint32_t> ReadAndChecksum(int fd, std::byte* dst, size_t bytes,
                                 std::vector<std::byte>& scratch, size_t chunk,
                                 const std::string& path);

// The CRC32C of each chunk_bytes-long piece of a stream of bytes written in
// pieces of any size ("chunk_crc32c" of a shard), and of the whole stream,
// folded from those (one pass over the bytes, not two).
class ChunkChecksums {
 public:
  explicit ChunkChecksums(uint64_t chunk_bytes) : chunk_(chunk_bytes), combiner_(chunk_bytes) {}
  void Update(const std::byte* data, size_t bytes);
  // The checksums of every chunk, the last one possibly short; Whole() is
  // then the stream's ("crc32c"), until the next Update.
  std::vector<uint32_t> Finish();
  uint32_t Whole() const { return finished_whole_; }

 private:
  uint64_t chunk_;
  Crc32cCombiner combiner_;  // folds a full chunk's checksum into whole_
  uint64_t filled_ = 0;
  uint32_t crc_ = 0;
  uint32_t whole_ = 0;           // of the chunks so far
  uint32_t finished_whole_ = 0;  // of the stream the last Finish() ended
  std::vector<uint32_t> done_;
};

// One shard as described by the manifest.
struct ShardInfo {
  int rank = 0;
  std::string file;
  uint64_t bytes = 0;
  uint32_t crc = 0;
  uint64_t chunk_bytes = 0;  // 0: written before chunk checksums existed
  std::vector<uint32_t> chunk_crcs;
  std::vector<ShardEntry> entries;
};

struct Manifest {
  int64_t step = -1;
  double time = 0;
  int world_size = 0;
  nlohmann::json metadata;
  std::vector<ShardInfo> shards;
};

// True when every entry of every shard is a slice of a global array (or empty):
// such a checkpoint restores at any world size.
bool AllGlobal(const Manifest& manifest);

// Builds a step's global index (SavedStep) from its verified manifest (an
// error when the shards disagree about an array); `loaded`, when non-null and
// holding bytes, is a shard already read and verified whole, which reads of
// its pieces copy from.
struct SavedStepAccess {
  static Result<std::shared_ptr<const SavedStep>> Open(int dir_fd, const std::string& dir_path,
                                                       const Manifest& manifest,
                                                       const ShardData* loaded = nullptr);
};

// Parses and checks a manifest; any problem is a reason string (the checkpoint is corrupt).
std::optional<std::string> ParseManifest(const std::string& text, int64_t step, Manifest* out);

// Verifies one committed checkpoint; loads the shard of `load_rank` into `out`
// when it is in range. `corrupt` is the corruption found, if any; `fatal` is
// set for a world-size mismatch the caller did not opt in to. With `lazy`, a
// checkpoint of global slices only is checked for every shard's presence and
// size and nothing is read or loaded (RestoreOptions::load_shard).
struct VerifyOutcome {
  std::optional<CorruptCheckpoint> corrupt;
  Status fatal;
};
VerifyOutcome VerifyStep(int dir_fd, const CheckpointOptions& options, int64_t step, int load_rank,
                         bool verify_all, bool check_world, Manifest* manifest, ShardData* out,
                         std::vector<std::byte>& scratch, bool lazy = false);

}  // namespace agentrt::checkpoint_files

namespace agentrt::checkpoint_files {

// SaveAsync's snapshot of a large host state by fork: the child process sees
// the state as it was at the fork (copy-on-write), writes the shard from it
// and hands the checksums back, while the parent's caller goes on training.
// The caller is blocked for the fork only (page tables: about 15-25 ms per
// GiB resident here), not for a copy of the state; a page the parent writes
// while the child still runs is copied then, by the kernel, once.
//
// The child blocks every signal, dies with the thread that forked it
// (PR_SET_PDEATHSIG: run Start on a thread that outlives the write, as
// SaveAsync's writer does), keeps only the standard descriptors, its pipe
// and those it is given, never returns into the caller's code and ends with
// _exit. It runs `write` only after it found every part's pages in its image
// (memory a library marked MADV_DONTFORK, e.g. RDMA buffers, is not
// inherited): else nothing is written and Start says why. Memory marked
// MADV_WIPEONFORK (a library's RNG state, never a tensor) would read as
// zeros in the child; nothing cheap tells it apart (only /proc/self/smaps,
// about 20 ms for a PyTorch process), so it is not looked for.
class ShardWriterProcess {
 public:
  // nullptr and *why_not when no child writes (fork failed, or a part is not
  // private memory of this process or not inherited); nothing was written.
  // `chunks` is made by the caller, before the fork (see RunChild), and
  // filled by `write` in the child; the parent gets the checksums back from
  // Finish.
  static std::unique_ptr<ShardWriterProcess> Start(
      const std::vector<std::span<const std::byte>>& parts, std::vector<int> keep_fds,
      ChunkChecksums& chunks, const std::function<Status(ChunkChecksums& chunks)>& write,
      std::string* why_not);
  // Kills and reaps a child not finished.
  ~ShardWriterProcess();
  ShardWriterProcess(const ShardWriterProcess&) = delete;
  ShardWriterProcess& operator=(const ShardWriterProcess&) = delete;

  pid_t pid() const { return pid_; }
  // Waits for the child: `write`'s status, and the chunk checksums and whole
  // checksum it computed; an error naming the signal when it was killed
  // (with `context`, which `write`'s own errors do not get).
  Status Finish(std::string_view context, std::vector<uint32_t>* chunk_crcs, uint32_t* whole);

 private:
  ShardWriterProcess(pid_t pid, int from_child) : pid_(pid), from_child_(from_child) {}
  Status Reap();

  pid_t pid_;
  int from_child_;
};

// Whether every byte of `parts` lies in private (copy-on-write) mappings of
// this process (/proc/self/maps): memory mapped shared (a file, /dev/shm,
// torch's share_memory_) would change under a forked writer.
bool InPrivateMemory(const std::vector<std::span<const std::byte>>& parts);

}  // namespace agentrt::checkpoint_files
