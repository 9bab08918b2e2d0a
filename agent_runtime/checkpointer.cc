#include "agent_runtime/checkpointer.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <future>
#include <optional>
#include <utility>

#include "agent_runtime/checkpoint_files.h"
#include "agent_runtime/device_api.h"
#include "common/crc32c.h"
#include "common/file_util.h"
#include "plan/fence.h"

namespace agentrt {

using namespace checkpoint_files;  // NOLINT(google-build-using-namespace): its own files

// ---------------------------------------------------------------- state

void CheckpointState::AddBytes(std::string name, const void* data, size_t bytes) {
  Entry e;
  e.name = std::move(name);
  e.dtype = "bytes";
  e.shape = {static_cast<int64_t>(bytes)};
  e.bytes = bytes;
  e.data = data;
  entries_.push_back(std::move(e));
}

void CheckpointState::AddArray(std::string name, const void* data, std::string dtype,
                               std::vector<int64_t> shape, size_t element_bytes) {
  size_t count = 1;
  for (int64_t d : shape) count *= static_cast<size_t>(d);
  Entry e;
  e.name = std::move(name);
  e.dtype = std::move(dtype);
  e.shape = std::move(shape);
  e.bytes = count * element_bytes;
  e.data = data;
  entries_.push_back(std::move(e));
}

void CheckpointState::AddCustom(std::string name, size_t bytes, std::string dtype,
                                std::vector<int64_t> shape,
                                std::function<Status(void* dst)> copy_to_host) {
  Entry e;
  e.name = std::move(name);
  e.dtype = std::move(dtype);
  e.shape = std::move(shape);
  e.bytes = bytes;
  e.copy_to_host = std::move(copy_to_host);
  entries_.push_back(std::move(e));
}

void CheckpointState::AddDeviceSlice(std::string name, const void* device_data, std::string dtype,
                                     size_t element_bytes, std::vector<int64_t> global_shape,
                                     uint64_t global_begin, uint64_t count, DeviceSource source) {
  AddSlice(std::move(name), nullptr, std::move(dtype), element_bytes, std::move(global_shape),
           global_begin, count);
  entries_.back().device_data = device_data;
  entries_.back().device = source;
}

void CheckpointState::AddSlice(std::string name, const void* data, std::string dtype,
                               size_t element_bytes, std::vector<int64_t> global_shape,
                               uint64_t global_begin, uint64_t count,
                               std::function<Status(void* dst)> copy_to_host) {
  Entry e;
  e.name = std::move(name);
  e.dtype = std::move(dtype);
  e.shape = {static_cast<int64_t>(count)};
  e.bytes = static_cast<size_t>(count) * element_bytes;
  e.data = data;
  e.copy_to_host = std::move(copy_to_host);
  e.global_shape = std::move(global_shape);
  if (e.global_shape.empty()) e.global_shape = {1};  // a scalar: one element
  e.global_begin = global_begin;
  entries_.push_back(std::move(e));
}

void CheckpointState::AddRankRow(std::string name, const void* data, size_t bytes, int rank,
                                 int world_size) {
  AddSlice(std::move(name), data, "bytes", 1, {world_size, static_cast<int64_t>(bytes)},
           static_cast<uint64_t>(rank) * bytes, bytes);
}

size_t CheckpointState::total_bytes() const {
  size_t total = 0;
  for (const auto& e : entries_) total += e.bytes;
  return total;
}

std::byte* ShardData::Allocate(int rank, std::vector<ShardEntry> entries, size_t size) {
  rank_ = rank;
  entries_ = std::move(entries);
  size_ = size;
  data_ = std::shared_ptr<std::byte[]>(new std::byte[std::max<size_t>(size, 1)]);
  return data_.get();
}

std::span<const std::byte> ShardData::Bytes(std::string_view name) const {
  for (const auto& e : entries_) {
    if (e.name == name) return {data_.get() + e.offset, static_cast<size_t>(e.bytes)};
  }
  return {};
}

Status ShardData::CopyTo(std::string_view name, void* dst, size_t bytes) const {
  for (const auto& e : entries_) {
    if (e.name != name) continue;
    if (e.bytes != bytes) {
      return InvalidArgument("checkpoint entry \"" + std::string(name) + "\" of rank " +
                             std::to_string(rank_) + " holds " + std::to_string(e.bytes) +
                             " bytes, the destination " + std::to_string(bytes));
    }
    if (bytes > 0) std::memcpy(dst, data_.get() + e.offset, bytes);
    return Status::Ok();
  }
  return NotFound("checkpoint shard of rank " + std::to_string(rank_) + " has no entry \"" +
                  std::string(name) + "\"");
}

std::string RestoreResult::Describe() const {
  std::string out;
  switch (kind) {
    case Kind::kRestored:
      out = "restored step " + std::to_string(step);
      break;
    case Kind::kFresh:
      out = "no checkpoint: fresh start";
      break;
    case Kind::kCorrupt:
      out = "no usable checkpoint: every committed one is corrupt";
      break;
  }
  for (const auto& c : skipped) {
    out += "; skipped step " + std::to_string(c.step) + ": " + c.file + ": " + c.reason;
  }
  return out;
}

// ---------------------------------------------------------------- checkpointer

Result<std::unique_ptr<Checkpointer>> Checkpointer::Create(CheckpointOptions options,
                                                           const Clock* clock) {
  std::string where =
      "checkpoint (agent " + options.agent + " rank " + std::to_string(options.rank) + "): ";
  if (options.dir.empty()) return InvalidArgument(where + "no checkpoint directory given");
  if (options.world_size < 1 || options.rank < 0 || options.rank >= options.world_size) {
    return InvalidArgument(where + "rank " + std::to_string(options.rank) +
                           " is outside world size " + std::to_string(options.world_size));
  }
  if (options.keep_last < 1) return InvalidArgument(where + "keep_last must be at least 1");
  if (options.io_chunk_bytes < 4096) options.io_chunk_bytes = 4096;
  AGENTRT_RETURN_IF_ERROR(MakeDirs0700(options.dir));
  int fd = ::open(options.dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return ErrnoStatus(errno, where + "open checkpoint directory " + options.dir);
  return std::unique_ptr<Checkpointer>(new Checkpointer(std::move(options), clock, fd));
}

Checkpointer::Checkpointer(CheckpointOptions options, const Clock* clock, int dir_fd)
    : options_(std::move(options)),
      clock_(clock),
      dir_fd_(dir_fd),
      snapshot_how_(options_.snapshot),
      last_start_(clock->Now().time_since_epoch().count()) {}

Checkpointer::~Checkpointer() {
  if (writer_.joinable()) writer_.join();
  JoinReaper();
  FreeStaging();
  ::close(dir_fd_);
}

void Checkpointer::FreeStaging() {
  if (staging_.api == nullptr) return;
  device::DeviceGuard guard(staging_.api, staging_.device);
  if (staging_.side != nullptr) {
    (void)staging_.api->SynchronizeStream(staging_.side);  // no copy may still write the buffer
    staging_.api->DestroyStream(staging_.side);
  }
  if (staging_.ready != nullptr) staging_.api->DestroyEvent(staging_.ready);
  if (staging_.copied != nullptr) staging_.api->DestroyEvent(staging_.copied);
  staging_.api->HostFree(staging_.pinned);
  staging_ = Staging{};
}

Result<std::byte*> Checkpointer::PrepareStaging(const CheckpointState& state, size_t total) {
  const CheckpointState::DeviceSource* source = nullptr;
  for (const auto& e : state.entries()) {
    if (e.device_data == nullptr) continue;
    if (e.device.api == nullptr)
      return InvalidArgument("device entry \"" + e.name + "\" has no device API");
    if (source != nullptr && (e.device.api != source->api || e.device.device != source->device))
      return InvalidArgument("device entries of one save must be on one device (\"" + e.name +
                             "\" is on device " + std::to_string(e.device.device) + ", not " +
                             std::to_string(source->device) + ")");
    source = &e.device;
  }
  if (source == nullptr) return InvalidArgument("no device entry to stage");
  if (staging_.api != source->api || staging_.device != source->device) FreeStaging();
  device::Api* api = source->api;
  device::DeviceGuard guard(api, source->device);
  AGENTRT_RETURN_IF_ERROR(guard.status());
  staging_.api = api;
  staging_.device = source->device;
  if (staging_.side == nullptr) {
    AGENTRT_ASSIGN_OR_RETURN(staging_.side, api->CreateStream());
    AGENTRT_ASSIGN_OR_RETURN(staging_.ready, api->CreateEvent());
    AGENTRT_ASSIGN_OR_RETURN(staging_.copied, api->CreateEvent());
  }
  if (total > staging_.capacity) {
    // The previous save's copies are done: its writer waited for them.
    api->HostFree(staging_.pinned);
    staging_.pinned = nullptr;
    staging_.capacity = 0;
    AGENTRT_ASSIGN_OR_RETURN(staging_.pinned, api->HostAlloc(total));
    staging_.capacity = total;
  }
  return static_cast<std::byte*>(staging_.pinned);
}

void Checkpointer::JoinReaper() {
  if (reaper_.joinable()) reaper_.join();
}

std::string Checkpointer::Where() const {
  return "checkpoint (agent " + options_.agent + " rank " + std::to_string(options_.rank) + ", " +
         options_.dir + "): ";
}

void Checkpointer::RequestSave() {
  if (saving_.load()) {
    absorbed_.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  requested_.store(true);
}

bool Checkpointer::SaveDue() const {
  if (saving_.load()) return false;
  if (requested_.load()) return true;
  if (options_.interval_s <= 0) return false;
  auto last = Clock::TimePoint(Clock::TimePoint::duration(last_start_.load()));
  return Seconds(clock_->Now() - last) >= options_.interval_s;
}

CheckpointStats Checkpointer::stats() const {
  std::lock_guard<std::mutex> lock(stats_mu_);
  CheckpointStats s = stats_;
  s.triggers_absorbed = absorbed_.load();
  return s;
}

Status Checkpointer::Wait() {
  if (writer_.joinable()) writer_.join();
  return std::exchange(writer_status_, Status::Ok());
}

namespace {

// Where each entry of `state` lies in the shard: in order, back to back.
std::vector<ShardEntry> ShardLayout(const CheckpointState& state) {
  std::vector<ShardEntry> entries;
  entries.reserve(state.entries().size());
  uint64_t offset = 0;
  for (const auto& e : state.entries()) {
    entries.push_back(
        ShardEntry{e.name, e.dtype, e.shape, offset, e.bytes, e.global_shape, e.global_begin});
    offset += e.bytes;
  }
  return entries;
}

}  // namespace

Status Checkpointer::BeginSave(int64_t step, bool* go) {
  *go = false;
  AGENTRT_RETURN_IF_ERROR(Wait().WithContext(Where() + "the previous save failed"));
  if (step < 0) return InvalidArgument(Where() + "step must be >= 0, got " + std::to_string(step));
  if (ExistsAt(dir_fd_, StepName(step) + "/" + kManifest)) {
    requested_ = false;
    return Status::Ok();  // already committed (e.g. the step just restored)
  }
  saving_ = true;  // from here on, triggers are absorbed by this save
  requested_ = false;
  last_start_ = clock_->Now().time_since_epoch().count();
  *go = true;
  return Status::Ok();
}

Status Checkpointer::Save(int64_t step, const CheckpointState& state) {
  const bool host_only =
      std::none_of(state.entries().begin(), state.entries().end(),
                   [](const auto& e) { return bool(e.copy_to_host) || e.device_data != nullptr; });
  if (!host_only) {
    AGENTRT_RETURN_IF_ERROR(SaveAsync(step, state));
    return Wait();
  }
  bool go = false;
  AGENTRT_RETURN_IF_ERROR(BeginSave(step, &go));
  if (!go) return Status::Ok();
  struct Done {  // however this ends (an exception included), the save is over
    std::atomic<bool>& saving;
    ~Done() { saving = false; }
  } done{saving_};
  std::vector<std::span<const std::byte>> parts;
  for (const auto& e : state.entries()) {
    if (e.bytes > 0) parts.emplace_back(static_cast<const std::byte*>(e.data), e.bytes);
  }
  {
    std::lock_guard<std::mutex> lock(stats_mu_);
    ++stats_.saves_started;
    stats_.last_snapshot_s = 0;  // nothing copied: the caller waits for the write instead
    stats_.last_snapshot_forked = false;
    stats_.last_snapshot_fallback.clear();
  }
  return Timed([&] {
    return WriteAndCommit(step, state.metadata, ShardLayout(state), state.total_bytes(), parts);
  });
}

Status Checkpointer::Timed(const std::function<Status()>& write) {
  const auto t0 = std::chrono::steady_clock::now();
  Status s = write();
  std::lock_guard<std::mutex> lock(stats_mu_);
  stats_.last_write_s = Seconds(std::chrono::steady_clock::now() - t0);
  if (s.ok()) ++stats_.saves_committed;
  return s;
}

Status Checkpointer::SaveAsync(int64_t step, const CheckpointState& state) {
  bool go = false;
  AGENTRT_RETURN_IF_ERROR(BeginSave(step, &go));
  if (!go) return Status::Ok();
  const auto start = std::chrono::steady_clock::now();
  const size_t total = state.total_bytes();
  std::vector<ShardEntry> entries = ShardLayout(state);
  // Device entries go through the pinned staging buffer, by copies on its
  // side stream; then the whole snapshot does.
  const bool staged = std::any_of(state.entries().begin(), state.entries().end(),
                                  [](const auto& e) { return e.device_data != nullptr; });
  std::string fallback;  // why a fork asked for was not made
  if (SaveForked(step, state, entries, total, &fallback)) return Status::Ok();
  std::byte* snapshot = nullptr;
  Status taken = [&]() -> Status {
    if (staged) {
      AGENTRT_ASSIGN_OR_RETURN(snapshot, PrepareStaging(state, total));
    } else {
      if (total > snapshot_capacity_) {
        snapshot_.reset();
        snapshot_.reset(new std::byte[total]);
        snapshot_capacity_ = total;
      }
      snapshot = snapshot_.get();
    }
    std::optional<device::DeviceGuard> guard;
    if (staged) guard.emplace(staging_.api, staging_.device);
    std::vector<CopyJob> copies;  // the host entries' bytes
    std::vector<void*> sources;   // the streams whose later work must wait for the copies
    for (size_t i = 0; i < entries.size(); ++i) {
      const auto& e = state.entries()[i];
      std::byte* dst = snapshot + entries[i].offset;
      if (e.device_data != nullptr) {
        device::Api* api = staging_.api;
        if (std::find(sources.begin(), sources.end(), e.device.stream) == sources.end()) {
          // The copy starts after the work already enqueued on its stream.
          AGENTRT_RETURN_IF_ERROR(api->RecordEvent(staging_.ready, e.device.stream));
          AGENTRT_RETURN_IF_ERROR(api->StreamWaitEvent(staging_.side, staging_.ready));
          sources.push_back(e.device.stream);
        }
        if (e.bytes > 0) {
          AGENTRT_RETURN_IF_ERROR(api->CopyAsync(dst, e.device_data, e.bytes,
                                                 device::CopyKind::kDeviceToHost, staging_.side));
        }
      } else if (e.copy_to_host) {
        AGENTRT_RETURN_IF_ERROR(e.copy_to_host(dst).WithContext("snapshot of \"" + e.name + "\""));
      } else if (e.bytes > 0) {
        copies.push_back({dst, static_cast<const std::byte*>(e.data), e.bytes});
      }
    }
    CopyInParallel(copies);
    if (staged) {
      // Work enqueued on the sources from now on (the next step's updates of
      // the same memory) waits for the copies, and for nothing else.
      AGENTRT_RETURN_IF_ERROR(staging_.api->RecordEvent(staging_.copied, staging_.side));
      for (void* stream : sources)
        AGENTRT_RETURN_IF_ERROR(staging_.api->StreamWaitEvent(stream, staging_.copied));
    }
    return Status::Ok();
  }();
  if (!taken.ok()) {
    saving_ = false;
    return taken.WithContext(Where() + "step " + std::to_string(step));
  }
  {
    std::lock_guard<std::mutex> lock(stats_mu_);
    ++stats_.saves_started;
    stats_.last_snapshot_s = Seconds(std::chrono::steady_clock::now() - start);
    stats_.last_snapshot_forked = false;
    stats_.last_snapshot_fallback = std::move(fallback);
  }
  writer_ = std::thread([this, step, metadata = state.metadata, entries = std::move(entries), total,
                         snapshot, staged]() mutable {
    Status copied = Status::Ok();
    if (staged) {  // the device's bytes are in the snapshot once its side stream drains
      device::DeviceGuard guard(staging_.api, staging_.device);
      copied = staging_.api->SynchronizeStream(staging_.side)
                   .WithContext(Where() + "copying step " + std::to_string(step) + " to the host");
    }
    writer_status_ = copied.ok() ? Timed([&] {
      return WriteAndCommit(step, metadata, entries, total,
                            {std::span<const std::byte>(snapshot, total)});
    })
                                 : copied;
    saving_ = false;
  });
  return Status::Ok();
}

bool Checkpointer::SaveForked(int64_t step, const CheckpointState& state,
                              const std::vector<ShardEntry>& entries, size_t total,
                              std::string* why_not) {
  if (snapshot_how_.load() != CheckpointOptions::Snapshot::kFork || total == 0) return false;
  const auto start = std::chrono::steady_clock::now();
  std::vector<std::span<const std::byte>> parts;
  for (const auto& e : state.entries()) {
    if (e.copy_to_host || e.device_data != nullptr) {
      *why_not = "entry \"" + e.name + "\" is device memory or copied by the caller's copier";
      return false;
    }
    if (e.bytes > 0) parts.emplace_back(static_cast<const std::byte*>(e.data), e.bytes);
  }
  if (!InPrivateMemory(parts)) {
    *why_not =
        "part of the state is not private memory of this process "
        "(shared memory would change under a forked writer)";
    return false;
  }
  // Forked by the writer thread, which outlives the child (its death kills
  // the child: PR_SET_PDEATHSIG); the caller waits until the child holds
  // its image of the state: "" then, else why not.
  std::promise<std::string> started;
  std::future<std::string> forked = started.get_future();
  writer_ = std::thread([this, step, total, parts, metadata = state.metadata, entries,
                         started = std::move(started)]() mutable {
    std::string why;
    ChunkChecksums chunks(kVerifyChunkBytes);
    auto child = ShardWriterProcess::Start(
        parts, {dir_fd_}, chunks,
        [&](ChunkChecksums& filled) -> Status {
          AGENTRT_ASSIGN_OR_RETURN(Fd step_fd, OpenStepDir(step));
          return WriteShard(step_fd.get(), step, parts, filled);
        },
        &why);
    if (child == nullptr) {
      started.set_value(why.empty() ? "the writer process did not start" : std::move(why));
      return;  // SaveAsync copies instead
    }
    {
      std::lock_guard<std::mutex> lock(stats_mu_);
      ++stats_.saves_started;  // before this thread can count its commit
      stats_.last_snapshot_forked = true;
      stats_.last_snapshot_fallback.clear();
    }
    started.set_value("");
    writer_status_ = Timed([&]() -> Status {
      std::vector<uint32_t> chunk_crcs;
      uint32_t whole = 0;
      AGENTRT_RETURN_IF_ERROR(
          child->Finish(Where() + "writing step " + std::to_string(step), &chunk_crcs, &whole));
      child.reset();
      // Opened again here (the child's descriptor was its own), and the
      // fence checked again before this rank's record.
      AGENTRT_ASSIGN_OR_RETURN(Fd step_fd, OpenStepDir(step));
      return CommitShard(step, step_fd.get(), metadata, entries, total, std::move(chunk_crcs),
                         whole);
    });
    saving_ = false;
  });
  *why_not = forked.get();
  if (!why_not->empty()) {
    writer_.join();
    return false;
  }
  std::lock_guard<std::mutex> lock(stats_mu_);
  stats_.last_snapshot_s = Seconds(std::chrono::steady_clock::now() - start);
  return true;
}

void CopyInParallel(const std::vector<CopyJob>& jobs) {
  size_t total = 0;
  for (const CopyJob& j : jobs) total += j.bytes;
  const size_t threads =
      std::min<size_t>(kSnapshotThreads, std::max(1u, std::thread::hardware_concurrency()));
  if (total < kParallelSnapshotBytes || threads < 2) {
    for (const CopyJob& j : jobs) std::memcpy(j.dst, j.src, j.bytes);
    return;
  }
  // Pieces of 4 MiB handed out in turn: one memcpy stream does not reach the
  // memory's bandwidth (1 GiB: 0.10 s on one core of this VM, 0.055 s on two).
  constexpr size_t kPiece = size_t{4} << 20;
  std::vector<CopyJob> pieces;
  for (const CopyJob& j : jobs) {
    for (size_t at = 0; at < j.bytes; at += kPiece)
      pieces.push_back({j.dst + at, j.src + at, std::min(kPiece, j.bytes - at)});
  }
  std::atomic<size_t> next{0};
  auto work = [&] {
    for (size_t i = next++; i < pieces.size(); i = next++)
      std::memcpy(pieces[i].dst, pieces[i].src, pieces[i].bytes);
  };
  std::vector<std::thread> helpers;
  for (size_t t = 1; t < threads; ++t) helpers.emplace_back(work);
  work();
  for (auto& h : helpers) h.join();
}

namespace {
constexpr off_t kWriteBackBytes = off_t{64} << 20;  // write-back started this often
}  // namespace

Result<Fd> Checkpointer::OpenStepDir(int64_t step) {
  const std::string step_name = StepName(step);
  const std::string step_path = options_.dir + "/" + step_name;
  AGENTRT_RETURN_IF_ERROR(
      CheckCheckpointFence(options_.dir, options_.incarnation).WithContext(Where()));
  // The step directory's name becomes durable with the commit's last fsync
  // (of the checkpoint directory): nothing before it needs it.
  if (::mkdirat(dir_fd_, step_name.c_str(), 0700) != 0 && errno != EEXIST) {
    return ErrnoStatus(errno, Where() + "create " + step_path);
  }
  Fd fd(::openat(dir_fd_, step_name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (!fd.ok()) {
    return ErrnoStatus(errno, Where() + "open " + step_path + " (a symlink or not a directory?)");
  }
  return fd;
}

Status Checkpointer::WriteShard(int step_fd, int64_t step,
                                const std::vector<std::span<const std::byte>>& parts,
                                ChunkChecksums& chunks) {
  const std::string step_path = options_.dir + "/" + StepName(step);
  const std::string shard = ShardName(options_.rank);
  const std::string shard_tmp = shard + ".tmp";
  const std::string shard_tmp_path = step_path + "/" + shard_tmp;
  {
    Fd fd(::openat(step_fd, shard_tmp.c_str(),
                   O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0600));
    if (!fd.ok()) return ErrnoStatus(errno, Where() + "create " + shard_tmp_path);
    off_t written = 0, kicked = 0;  // bytes written; bytes whose write-back was started
    for (const std::span<const std::byte> part : parts) {
      for (size_t done = 0; done < part.size();) {
        const size_t n = std::min(options_.io_chunk_bytes, part.size() - done);
        chunks.Update(part.data() + done, n);
        AGENTRT_RETURN_IF_ERROR(WriteAll(fd.get(), part.data() + done, n, "write ", shard_tmp_path)
                                    .WithContext(Where()));
        // A lone writer starts write-back every 64 MiB, while the next chunks
        // are copied: the fsync below then waits for the tail only (1 GiB of
        // agentrt.torch: 0.82x torch.save + fsync without, 1.6-1.9x with).
        // Ranks of an agent write at once, and then the disk is busy anyway:
        // started so, 4 shards of 256 MiB saved 1.3-1.6 GB/s, not 1.8-2.0.
        written += static_cast<off_t>(n);
        if (options_.world_size == 1 && written - kicked >= kWriteBackBytes) {
          ::sync_file_range(fd.get(), kicked, written - kicked, SYNC_FILE_RANGE_WRITE);
          kicked = written;
        }
        done += n;
      }
    }
    AGENTRT_RETURN_IF_ERROR(Fsync(fd.get(), shard_tmp_path).WithContext(Where()));
  }
  if (::renameat(step_fd, shard_tmp.c_str(), step_fd, shard.c_str()) != 0) {
    return ErrnoStatus(errno, Where() + "rename " + shard_tmp_path);
  }
  return Status::Ok();
}

Status Checkpointer::WriteAndCommit(int64_t step, const nlohmann::json& metadata,
                                    const std::vector<ShardEntry>& entries, size_t bytes,
                                    const std::vector<std::span<const std::byte>>& parts) {
  AGENTRT_ASSIGN_OR_RETURN(Fd step_fd, OpenStepDir(step));
  ChunkChecksums chunks(kVerifyChunkBytes);
  AGENTRT_RETURN_IF_ERROR(WriteShard(step_fd.get(), step, parts, chunks));
  std::vector<uint32_t> chunk_crcs = chunks.Finish();  // then chunks.Whole() is the shard's
  return CommitShard(step, step_fd.get(), metadata, entries, bytes, std::move(chunk_crcs),
                     chunks.Whole());
}

Status Checkpointer::CommitShard(int64_t step, int step_fd, const nlohmann::json& metadata,
                                 const std::vector<ShardEntry>& entries, size_t bytes,
                                 std::vector<uint32_t> chunk_crcs, uint32_t whole_crc) {
  const std::string step_path = options_.dir + "/" + StepName(step);
  // 2. This rank's durability record.
  nlohmann::json record = {{"rank", options_.rank},
                           {"world_size", options_.world_size},
                           {"step", step},
                           {"file", ShardName(options_.rank)},
                           {"chunk_bytes", kVerifyChunkBytes},
                           {"chunk_crc32c", std::move(chunk_crcs)},
                           {"bytes", bytes},
                           {"crc32c", whole_crc},
                           {"entries", EntriesToJson(entries)}};
  // Another rank's record tells rank 0 that its shard is durable, so its
  // bytes are made durable too. Rank 0's own is read back by its commit
  // alone: no fsync of its bytes. The step directory is fsynced either way,
  // so that the shard's name is durable before a manifest can name it (on
  // file systems that do not order their metadata writes too).
  AGENTRT_RETURN_IF_ERROR(WriteFileAtomicAt(step_fd, step_path, RecordName(options_.rank),
                                            record.dump(),
                                            {.mode = 0600, .sync_file = options_.rank != 0})
                              .WithContext(Where()));
  AGENTRT_RETURN_IF_ERROR(Fsync(step_fd, step_path).WithContext(Where()));

  // 3. Barrier, then rank 0 commits.
  if (options_.barrier) {
    AGENTRT_RETURN_IF_ERROR(options_.barrier().WithContext(
        Where() + "barrier before commit of step " + std::to_string(step)));
  }
  if (options_.rank == 0) {
    AGENTRT_RETURN_IF_ERROR(CommitAsRankZero(step, step_fd, metadata));
  }
  last_saved_step_ = step;
  return Status::Ok();
}

Status Checkpointer::CommitAsRankZero(int64_t step, int step_fd, const nlohmann::json& metadata) {
  const std::string step_path = options_.dir + "/" + StepName(step);
  auto deadline = std::chrono::steady_clock::now() + options_.commit_timeout;
  nlohmann::json shards = nlohmann::json::array();
  for (int r = 0; r < options_.world_size; ++r) {
    const std::string name = RecordName(r);
    const std::string path = step_path + "/" + name;
    for (;;) {
      auto text = ReadSmallFile(step_fd, name, path);
      if (text.ok()) {
        nlohmann::json rec = nlohmann::json::parse(*text, nullptr, false);
        if (rec.is_discarded() || !rec.is_object() || rec.value("step", int64_t{-1}) != step ||
            rec.value("rank", -1) != r || rec.value("world_size", -1) != options_.world_size) {
          return DataLoss(Where() + path + " does not describe rank " + std::to_string(r) +
                          " of step " + std::to_string(step) + " with world size " +
                          std::to_string(options_.world_size));
        }
        nlohmann::json shard = {{"rank", r},
                                {"file", ShardName(r)},
                                {"bytes", rec["bytes"]},
                                {"crc32c", rec["crc32c"]},
                                {"entries", rec["entries"]}};
        for (const char* key : {"chunk_bytes", "chunk_crc32c"}) {
          if (rec.contains(key)) shard[key] = rec[key];
        }
        shards.push_back(std::move(shard));
        break;
      }
      if (text.status().code() != StatusCode::kNotFound) {
        return text.status().WithContext(Where());
      }
      if (std::chrono::steady_clock::now() > deadline) {
        return DeadlineExceeded(Where() + "rank " + std::to_string(r) +
                                " did not make its shard of step " + std::to_string(step) +
                                " durable within " +
                                std::to_string(options_.commit_timeout.count() / 1000) + " s (" +
                                path + " missing); the checkpoint is not committed");
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  }
  AGENTRT_RETURN_IF_ERROR(
      CheckCheckpointFence(options_.dir, options_.incarnation).WithContext(Where()));
  nlohmann::json manifest = {{"format", kFormat},       {"step", step},
                             {"time", UnixNow()},       {"world_size", options_.world_size},
                             {"agent", options_.agent}, {"shards", std::move(shards)},
                             {"metadata", metadata}};
  if (!options_.incarnation.empty()) manifest["incarnation"] = options_.incarnation;
  std::string text = manifest.dump(1, ' ', false, nlohmann::json::error_handler_t::replace);
  AGENTRT_RETURN_IF_ERROR(
      WriteFileAtomic(step_fd, step_path, kManifest, text).WithContext(Where()));
  AGENTRT_RETURN_IF_ERROR(Fsync(step_fd, step_path).WithContext(Where()));
  AGENTRT_RETURN_IF_ERROR(Fsync(dir_fd_, options_.dir).WithContext(Where()));
  if (options_.on_commit) options_.on_commit(step);
  Prune(step);
  return Status::Ok();
}

void Checkpointer::Prune(int64_t committed_step) {
  auto steps = ListSteps(dir_fd_, options_.dir);
  if (!steps.ok()) return;
  int kept = 0;
  std::vector<std::string> pruned;
  auto drop = [&](const std::string& name) {
    std::string away = "." + name + ".pruned.tmp";  // hidden from globs of step-*
    if (::renameat(dir_fd_, name.c_str(), dir_fd_, away.c_str()) == 0) {
      pruned.push_back(std::move(away));
    } else {
      RemoveTreeAt(dir_fd_, name);  // e.g. a stale one of that name: remove it here
    }
  };
  for (int64_t s : *steps) {  // newest first
    std::string name = StepName(s);
    bool committed = ExistsAt(dir_fd_, name + "/" + kManifest);
    if (committed) {
      if (s > committed_step) continue;  // cannot happen with one writer; never drop newer ones
      if (++kept <= options_.keep_last) continue;
      drop(name);
    } else if (s < committed_step) {
      // Abandoned by a crashed save: every rank has moved past it.
      drop(name);
    }
  }
  if (pruned.empty()) return;
  // No fsync for pruning: a crash that undoes the renames leaves older
  // committed steps, still valid, which the next prune drops again; one that
  // undoes a removal leaves a hidden .tmp, which CleanDebris removes. Two
  // fsyncs fewer per save count when thousands of agents checkpoint.
  JoinReaper();
  reaper_ = std::thread([this, pruned = std::move(pruned)] {
    for (const std::string& name : pruned) RemoveTreeAt(dir_fd_, name);
  });
}

Status Checkpointer::CleanDebris() {
  AGENTRT_ASSIGN_OR_RETURN(auto names, ListDir(dir_fd_, options_.dir));
  for (const auto& n : names) {
    if (EndsWith(n, ".tmp")) {
      RemoveTreeAt(dir_fd_, n);
      continue;
    }
    if (!ParseStepName(n)) continue;  // not ours: leave it
    struct stat st {};
    if (::fstatat(dir_fd_, n.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISDIR(st.st_mode))
      continue;
    if (!ExistsAt(dir_fd_, n + "/" + kManifest)) {
      RemoveTreeAt(dir_fd_, n);  // never committed
      continue;
    }
    Fd step_fd(::openat(dir_fd_, n.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
    if (!step_fd.ok()) continue;
    auto inner = ListDir(step_fd.get(), options_.dir + "/" + n);
    if (!inner.ok()) continue;
    for (const auto& f : *inner) {
      if (EndsWith(f, ".tmp")) ::unlinkat(step_fd.get(), f.c_str(), 0);
    }
  }
  ::fsync(dir_fd_);
  return Status::Ok();
}

namespace {

// A step a caller's read found corrupt, as Restore lists it: the file its
// error names inside the step's folder (SavedStep::Read's errors say
// "FILE: reason"), else the folder and the whole message.
CorruptCheckpoint ReadCorruption(int64_t step, const std::string& step_path,
                                 const std::string& message) {
  const size_t at = message.find(step_path + "/");
  const size_t end = at == std::string::npos ? at : message.find(": ", at);
  if (end == std::string::npos) return {step, step_path, message};
  return {step, message.substr(at, end - at), message.substr(end + 2)};
}

}  // namespace

Result<RestoreResult> Checkpointer::Restore() { return Restore(RestoreOptions{}); }

Result<RestoreResult> Checkpointer::Restore(const RestoreOptions& restore) {
  AGENTRT_RETURN_IF_ERROR(Wait());
  JoinReaper();
  const bool retry = restore.before_step >= 0;
  if (options_.rank == 0 && !retry)
    AGENTRT_RETURN_IF_ERROR(CleanDebris().WithContext(Where() + "cleanup"));
  if (options_.barrier && !retry) {
    AGENTRT_RETURN_IF_ERROR(options_.barrier().WithContext(Where() + "barrier after cleanup"));
  }
  AGENTRT_ASSIGN_OR_RETURN(auto steps, ListSteps(dir_fd_, options_.dir));
  if (retry) last_saved_step_ = -1;  // the step it gave before was corrupt
  RestoreResult result;
  result.skipped = restore.skipped;
  if (retry && !restore.before_step_error.empty()) {
    result.skipped.push_back(ReadCorruption(restore.before_step,
                                            options_.dir + "/" + StepName(restore.before_step),
                                            restore.before_step_error));
  }
  std::vector<std::byte> scratch;
  bool any_committed = !restore.skipped.empty();
  for (int64_t step : steps) {
    if (retry && step >= restore.before_step) continue;
    if (!ExistsAt(dir_fd_, StepName(step) + "/" + kManifest)) continue;  // not committed
    any_committed = true;
    Manifest manifest;
    ShardData shard;
    VerifyOutcome v = VerifyStep(dir_fd_, options_, step, options_.rank, options_.verify_all_shards,
                                 /*check_world=*/true, &manifest, &shard, scratch,
                                 /*lazy=*/!restore.load_shard);
    if (!v.fatal.ok()) return v.fatal;
    if (v.corrupt) {
      result.skipped.push_back(std::move(*v.corrupt));
      continue;
    }
    auto saved = SavedStepAccess::Open(dir_fd_, options_.dir, manifest, &shard);
    if (!saved.ok()) {
      result.skipped.push_back(
          {step, options_.dir + "/" + StepName(step) + "/" + kManifest, saved.status().message()});
      continue;
    }
    result.saved = std::move(saved).value();
    result.kind = RestoreResult::Kind::kRestored;
    result.step = step;
    result.time = manifest.time;
    result.world_size = manifest.world_size;
    result.metadata = std::move(manifest.metadata);
    result.shard = std::move(shard);
    last_saved_step_ = step;
    break;
  }
  if (!result.restored()) {
    result.kind = any_committed ? RestoreResult::Kind::kCorrupt : RestoreResult::Kind::kFresh;
  }
  // The wall-clock cadence counts from the restore, not from the previous run.
  last_start_ = clock_->Now().time_since_epoch().count();
  if (options_.on_restore && options_.rank == 0) options_.on_restore(result);
  return result;
}

Result<ShardData> Checkpointer::LoadShard(int64_t step, int rank) {
  Manifest manifest;
  ShardData shard;
  std::vector<std::byte> scratch;
  VerifyOutcome v = VerifyStep(dir_fd_, options_, step, rank, /*verify_all=*/false,
                               /*check_world=*/false, &manifest, &shard, scratch);
  if (v.corrupt) {
    return DataLoss(Where() + v.corrupt->file + ": " + v.corrupt->reason);
  }
  if (rank < 0 || rank >= manifest.world_size) {
    return Status(StatusCode::kOutOfRange,
                  Where() + "step " + std::to_string(step) + " has ranks 0.." +
                      std::to_string(manifest.world_size - 1) + ", not " + std::to_string(rank));
  }
  return shard;
}

}  // namespace agentrt
