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

#include "common/crc32c.h"
#include "common/file_util.h"
#include "plan/fence.h"

namespace agentrt {
namespace {

constexpr int kFormat = 1;
constexpr char kManifest[] = "manifest.json";
constexpr size_t kMaxJsonBytes = 64u << 20;

double Seconds(std::chrono::steady_clock::duration d) {
  return std::chrono::duration<double>(d).count();
}

double UnixNow() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string StepName(int64_t step) { return "step-" + std::to_string(step); }
std::string ShardName(int rank) { return "rank-" + std::to_string(rank) + ".shard"; }
std::string RecordName(int rank) { return "rank-" + std::to_string(rank) + ".json"; }

std::optional<int64_t> ParseStepName(std::string_view name) {
  if (name.size() <= 5 || name.substr(0, 5) != "step-") return std::nullopt;
  std::string_view digits = name.substr(5);
  if (digits.size() > 1 && digits[0] == '0') return std::nullopt;  // one spelling per step
  int64_t step = 0;
  auto [ptr, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), step);
  if (ec != std::errc() || ptr != digits.data() + digits.size() || step < 0) return std::nullopt;
  return step;
}

bool EndsWith(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

std::string Hex(uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%08x", v);
  return buf;
}

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

Status Fsync(int fd, const std::string& path) {
  if (::fsync(fd) != 0) return ErrnoStatus(errno, "fsync " + path);
  return Status::Ok();
}

// Writes `content` to dir/name via a temporary + fsync + rename (not the directory fsync).
Status WriteFileAtomic(int dir_fd, const std::string& dir_path, const std::string& name,
                       std::string_view content) {
  return WriteFileAtomicAt(dir_fd, dir_path, name, content, {.mode = 0600});
}

// Reads a small file (manifest, record) without following symlinks.
Result<std::string> ReadSmallFile(int dir_fd, const std::string& name, const std::string& path) {
  return ReadWholeFileAt(dir_fd, name, path, kMaxJsonBytes);
}

bool ExistsAt(int dir_fd, const std::string& name) {
  struct stat st {};
  return ::fstatat(dir_fd, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0;
}

// Removes dir_fd/name, recursively for directories, never following symlinks.
void RemoveTreeAt(int dir_fd, const std::string& name, int depth = 0) {
  struct stat st {};
  if (::fstatat(dir_fd, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) return;
  if (!S_ISDIR(st.st_mode)) {
    ::unlinkat(dir_fd, name.c_str(), 0);
    return;
  }
  if (depth < 8) {
    int sub = ::openat(dir_fd, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (sub >= 0) {
      DIR* d = ::fdopendir(sub);
      if (d == nullptr) {
        ::close(sub);
      } else {
        std::vector<std::string> names;
        while (dirent* e = ::readdir(d)) {
          std::string n = e->d_name;
          if (n != "." && n != "..") names.push_back(std::move(n));
        }
        for (const auto& n : names) RemoveTreeAt(::dirfd(d), n, depth + 1);
        ::closedir(d);
      }
    }
  }
  ::unlinkat(dir_fd, name.c_str(), AT_REMOVEDIR);
}

Result<std::vector<std::string>> ListDir(int dir_fd, const std::string& path) {
  int dup = ::openat(dir_fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dup < 0) return ErrnoStatus(errno, "open " + path);
  DIR* d = ::fdopendir(dup);
  if (d == nullptr) {
    int err = errno;
    ::close(dup);
    return ErrnoStatus(err, "opendir " + path);
  }
  std::vector<std::string> names;
  while (dirent* e = ::readdir(d)) {
    std::string n = e->d_name;
    if (n != "." && n != "..") names.push_back(std::move(n));
  }
  ::closedir(d);
  return names;
}

// Step numbers of the step-<N> directories (real directories, not symlinks), newest first.
Result<std::vector<int64_t>> ListSteps(int dir_fd, const std::string& path) {
  AGENTRT_ASSIGN_OR_RETURN(auto names, ListDir(dir_fd, path));
  std::vector<int64_t> steps;
  for (const auto& n : names) {
    if (auto step = ParseStepName(n)) steps.push_back(*step);
  }
  std::sort(steps.rbegin(), steps.rend());
  return steps;
}

Status MakeDirs0700(const std::string& dir) {
  std::error_code ec;
  std::filesystem::path p(dir);
  std::filesystem::path partial;
  for (const auto& part : p) {
    partial /= part;
    if (partial.string().empty()) continue;
    if (::mkdir(partial.c_str(), 0700) != 0 && errno != EEXIST) {
      return ErrnoStatus(errno, "create checkpoint directory " + partial.string());
    }
  }
  return Status::Ok();
}

nlohmann::json EntriesToJson(const std::vector<ShardEntry>& entries) {
  nlohmann::json out = nlohmann::json::array();
  for (const auto& e : entries) {
    out.push_back({{"name", e.name},
                   {"dtype", e.dtype},
                   {"shape", e.shape},
                   {"offset", e.offset},
                   {"bytes", e.bytes}});
  }
  return out;
}

// Reads `bytes` bytes of fd into dst (or into `scratch` when dst is null) and
// returns their CRC32C. The checksum of chunk i runs on a helper thread while
// chunk i+1 is read, so restore costs about max(read, checksum), not the sum.
Result<uint32_t> ReadAndChecksum(int fd, std::byte* dst, size_t bytes,
                                 std::vector<std::byte>& scratch, size_t chunk,
                                 const std::string& path) {
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
  if (dst == nullptr && scratch.size() < 2 * chunk) scratch.resize(2 * chunk);
  uint32_t crc = 0;
  std::future<uint32_t> pending;  // checksum of the previous chunk
  size_t done = 0;
  for (size_t index = 0; done < bytes; ++index) {
    size_t want = std::min(chunk, bytes - done);
    std::byte* target = dst != nullptr ? dst + done : scratch.data() + (index % 2) * chunk;
    size_t got = 0;
    Status error;
    while (got < want) {
      ssize_t n = ::read(fd, target + got, want - got);
      if (n < 0) {
        if (errno == EINTR) continue;
        error = ErrnoStatus(errno, "read " + path);
        break;
      }
      if (n == 0) {
        error = DataLoss(path + " ended after " + std::to_string(done + got) + " of " +
                         std::to_string(bytes) + " bytes");
        break;
      }
      got += static_cast<size_t>(n);
    }
    if (pending.valid()) crc = pending.get();
    if (!error.ok()) return error;
    pending =
        std::async(std::launch::async, [crc, target, want] { return Crc32c(target, want, crc); });
    done += want;
  }
  if (pending.valid()) crc = pending.get();
  return crc;
}

// One shard as described by the manifest.
struct ShardInfo {
  int rank = 0;
  std::string file;
  uint64_t bytes = 0;
  uint32_t crc = 0;
  std::vector<ShardEntry> entries;
};

struct Manifest {
  int64_t step = -1;
  double time = 0;
  int world_size = 0;
  nlohmann::json metadata;
  std::vector<ShardInfo> shards;
};

// Parses and checks a manifest; any problem is a reason string (the checkpoint is corrupt).
std::optional<std::string> ParseManifest(const std::string& text, int64_t step, Manifest* out) {
  nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return "not valid JSON (truncated or overwritten?)";
  if (!j.is_object()) return "not a JSON object";
  auto int_field = [&j](const char* key) -> std::optional<int64_t> {
    auto it = j.find(key);
    if (it == j.end() || !it->is_number_integer()) return std::nullopt;
    return it->get<int64_t>();
  };
  auto format = int_field("format");
  if (!format || *format != kFormat) return "unknown or missing \"format\" (expected 1)";
  auto saved_step = int_field("step");
  if (!saved_step || *saved_step != step) {
    return "\"step\" does not match its directory step-" + std::to_string(step);
  }
  auto world = int_field("world_size");
  if (!world || *world < 1 || *world > 1 << 20) return "missing or invalid \"world_size\"";
  out->step = step;
  out->world_size = static_cast<int>(*world);
  auto time_it = j.find("time");
  out->time = (time_it != j.end() && time_it->is_number()) ? time_it->get<double>() : 0;
  auto meta_it = j.find("metadata");
  out->metadata = meta_it != j.end() ? *meta_it : nlohmann::json::object();
  auto shards_it = j.find("shards");
  if (shards_it == j.end() || !shards_it->is_array() ||
      shards_it->size() != static_cast<size_t>(out->world_size)) {
    return "\"shards\" is not an array of world_size (" + std::to_string(out->world_size) +
           ") entries";
  }
  for (size_t i = 0; i < shards_it->size(); ++i) {
    const auto& s = (*shards_it)[i];
    std::string where = "shard " + std::to_string(i) + ": ";
    if (!s.is_object()) return where + "not an object";
    ShardInfo info;
    info.rank = static_cast<int>(i);
    auto rank_it = s.find("rank");
    if (rank_it == s.end() || !rank_it->is_number_integer() ||
        rank_it->get<int64_t>() != info.rank) {
      return where + "\"rank\" missing or out of order";
    }
    auto file_it = s.find("file");
    // The file name is fixed by the rank: a manifest cannot point outside its directory.
    if (file_it == s.end() || !file_it->is_string() ||
        file_it->get<std::string>() != ShardName(info.rank)) {
      return where + "\"file\" must be \"" + ShardName(info.rank) + "\"";
    }
    info.file = ShardName(info.rank);
    auto bytes_it = s.find("bytes");
    auto crc_it = s.find("crc32c");
    if (bytes_it == s.end() || !bytes_it->is_number_unsigned() || crc_it == s.end() ||
        !crc_it->is_number_unsigned() || crc_it->get<uint64_t>() > UINT32_MAX) {
      return where + "\"bytes\" or \"crc32c\" missing or invalid";
    }
    info.bytes = bytes_it->get<uint64_t>();
    info.crc = static_cast<uint32_t>(crc_it->get<uint64_t>());
    auto entries_it = s.find("entries");
    if (entries_it == s.end() || !entries_it->is_array()) return where + "\"entries\" missing";
    for (const auto& e : *entries_it) {
      ShardEntry entry;
      if (!e.is_object() || !e.contains("name") || !e["name"].is_string() ||
          !e.contains("offset") || !e["offset"].is_number_unsigned() || !e.contains("bytes") ||
          !e["bytes"].is_number_unsigned()) {
        return where + "an entry lacks name/offset/bytes";
      }
      entry.name = e["name"].get<std::string>();
      entry.offset = e["offset"].get<uint64_t>();
      entry.bytes = e["bytes"].get<uint64_t>();
      if (e.contains("dtype") && e["dtype"].is_string())
        entry.dtype = e["dtype"].get<std::string>();
      if (e.contains("shape") && e["shape"].is_array()) {
        for (const auto& d : e["shape"]) {
          if (!d.is_number_integer()) return where + "entry " + entry.name + ": bad shape";
          entry.shape.push_back(d.get<int64_t>());
        }
      }
      if (entry.offset > info.bytes || entry.bytes > info.bytes - entry.offset) {
        return where + "entry " + entry.name + " lies outside the shard";
      }
      info.entries.push_back(std::move(entry));
    }
    out->shards.push_back(std::move(info));
  }
  return std::nullopt;
}

}  // namespace

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

size_t CheckpointState::total_bytes() const {
  size_t total = 0;
  for (const auto& e : entries_) total += e.bytes;
  return total;
}

std::byte* ShardData::Allocate(int rank, std::vector<ShardEntry> entries, size_t size) {
  rank_ = rank;
  entries_ = std::move(entries);
  size_ = size;
  data_.reset(new std::byte[std::max<size_t>(size, 1)]);
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
      last_start_(clock->Now().time_since_epoch().count()) {}

Checkpointer::~Checkpointer() {
  if (writer_.joinable()) writer_.join();
  ::close(dir_fd_);
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
    entries.push_back(ShardEntry{e.name, e.dtype, e.shape, offset, e.bytes});
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
  const bool host_only = std::none_of(state.entries().begin(), state.entries().end(),
                                      [](const auto& e) { return bool(e.copy_to_host); });
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
  }
  return TimedWriteAndCommit(step, state.metadata, ShardLayout(state), state.total_bytes(), parts);
}

Status Checkpointer::TimedWriteAndCommit(int64_t step, const nlohmann::json& metadata,
                                         const std::vector<ShardEntry>& entries, size_t bytes,
                                         const std::vector<std::span<const std::byte>>& parts) {
  const auto t0 = std::chrono::steady_clock::now();
  Status s = WriteAndCommit(step, metadata, entries, bytes, parts);
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

  size_t total = state.total_bytes();
  if (total > snapshot_capacity_) {
    snapshot_.reset();
    snapshot_.reset(new std::byte[total]);
    snapshot_capacity_ = total;
  }
  std::vector<ShardEntry> entries = ShardLayout(state);
  for (size_t i = 0; i < entries.size(); ++i) {
    const auto& e = state.entries()[i];
    std::byte* dst = snapshot_.get() + entries[i].offset;
    if (e.copy_to_host) {
      Status s = e.copy_to_host(dst);
      if (!s.ok()) {
        saving_ = false;
        return s.WithContext(Where() + "snapshot of \"" + e.name + "\" for step " +
                             std::to_string(step));
      }
    } else if (e.bytes > 0) {
      std::memcpy(dst, e.data, e.bytes);
    }
  }
  {
    std::lock_guard<std::mutex> lock(stats_mu_);
    ++stats_.saves_started;
    stats_.last_snapshot_s = Seconds(std::chrono::steady_clock::now() - start);
  }
  writer_ = std::thread(
      [this, step, metadata = state.metadata, entries = std::move(entries), total]() mutable {
        writer_status_ = TimedWriteAndCommit(step, metadata, entries, total,
                                             {std::span<const std::byte>(snapshot_.get(), total)});
        saving_ = false;
      });
  return Status::Ok();
}

Status Checkpointer::WriteAndCommit(int64_t step, const nlohmann::json& metadata,
                                    const std::vector<ShardEntry>& entries, size_t bytes,
                                    const std::vector<std::span<const std::byte>>& parts) {
  const std::string step_name = StepName(step);
  const std::string step_path = options_.dir + "/" + step_name;
  AGENTRT_RETURN_IF_ERROR(
      CheckCheckpointFence(options_.dir, options_.incarnation).WithContext(Where()));
  if (::mkdirat(dir_fd_, step_name.c_str(), 0700) == 0) {
    AGENTRT_RETURN_IF_ERROR(Fsync(dir_fd_, options_.dir).WithContext(Where()));
  } else if (errno != EEXIST) {
    return ErrnoStatus(errno, Where() + "create " + step_path);
  }
  Fd step_fd(::openat(dir_fd_, step_name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (!step_fd.ok()) {
    return ErrnoStatus(errno, Where() + "open " + step_path + " (a symlink or not a directory?)");
  }

  // 1. The shard.
  const std::string shard = ShardName(options_.rank);
  const std::string shard_tmp = shard + ".tmp";
  const std::string shard_tmp_path = step_path + "/" + shard_tmp;
  uint32_t crc = 0;
  {
    Fd fd(::openat(step_fd.get(), shard_tmp.c_str(),
                   O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0600));
    if (!fd.ok()) return ErrnoStatus(errno, Where() + "create " + shard_tmp_path);
    for (const std::span<const std::byte> part : parts) {
      for (size_t done = 0; done < part.size();) {
        const size_t n = std::min(options_.io_chunk_bytes, part.size() - done);
        crc = Crc32c(part.data() + done, n, crc);
        AGENTRT_RETURN_IF_ERROR(WriteAll(fd.get(), part.data() + done, n, "write ", shard_tmp_path)
                                    .WithContext(Where()));
        done += n;
      }
    }
    AGENTRT_RETURN_IF_ERROR(Fsync(fd.get(), shard_tmp_path).WithContext(Where()));
  }
  if (::renameat(step_fd.get(), shard_tmp.c_str(), step_fd.get(), shard.c_str()) != 0) {
    return ErrnoStatus(errno, Where() + "rename " + shard_tmp_path);
  }

  // 2. This rank's durability record.
  nlohmann::json record = {{"rank", options_.rank},
                           {"world_size", options_.world_size},
                           {"step", step},
                           {"file", shard},
                           {"bytes", bytes},
                           {"crc32c", crc},
                           {"entries", EntriesToJson(entries)}};
  AGENTRT_RETURN_IF_ERROR(
      WriteFileAtomic(step_fd.get(), step_path, RecordName(options_.rank), record.dump())
          .WithContext(Where()));
  AGENTRT_RETURN_IF_ERROR(Fsync(step_fd.get(), step_path).WithContext(Where()));

  // 3. Barrier, then rank 0 commits.
  if (options_.barrier) {
    AGENTRT_RETURN_IF_ERROR(options_.barrier().WithContext(
        Where() + "barrier before commit of step " + std::to_string(step)));
  }
  if (options_.rank == 0) {
    AGENTRT_RETURN_IF_ERROR(CommitAsRankZero(step, step_fd.get(), metadata));
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
        shards.push_back({{"rank", r},
                          {"file", ShardName(r)},
                          {"bytes", rec["bytes"]},
                          {"crc32c", rec["crc32c"]},
                          {"entries", rec["entries"]}});
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
  bool removed = false;
  for (int64_t s : *steps) {  // newest first
    std::string name = StepName(s);
    bool committed = ExistsAt(dir_fd_, name + "/" + kManifest);
    if (committed) {
      if (s > committed_step) continue;  // cannot happen with one writer; never drop newer ones
      if (++kept <= options_.keep_last) continue;
      RemoveTreeAt(dir_fd_, name);
      removed = true;
    } else if (s < committed_step) {
      // Abandoned by a crashed save: every rank has moved past it.
      RemoveTreeAt(dir_fd_, name);
      removed = true;
    }
  }
  if (removed) ::fsync(dir_fd_);
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

// Verifies one committed checkpoint; loads the shard of `load_rank` into `out`
// when it is in range. Returns nullopt on success or the corruption found.
// `fatal` is set for a world-size mismatch the caller did not opt in to.
struct VerifyOutcome {
  std::optional<CorruptCheckpoint> corrupt;
  Status fatal;
};

VerifyOutcome VerifyStep(int dir_fd, const CheckpointOptions& options, int64_t step, int load_rank,
                         bool verify_all, bool check_world, Manifest* manifest, ShardData* out,
                         std::vector<std::byte>& scratch) {
  VerifyOutcome result;
  const std::string step_name = StepName(step);
  const std::string step_path = options.dir + "/" + step_name;
  auto corrupt = [&](std::string file, std::string reason) {
    result.corrupt = CorruptCheckpoint{step, std::move(file), std::move(reason)};
    return result;
  };
  Fd step_fd(::openat(dir_fd, step_name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (!step_fd.ok()) {
    return corrupt(step_path, errno == ELOOP || errno == ENOTDIR
                                  ? "is a symlink or not a directory (refused)"
                                  : std::string("cannot open: ") + std::strerror(errno));
  }
  const std::string manifest_path = step_path + "/" + kManifest;
  auto text = ReadSmallFile(step_fd.get(), kManifest, manifest_path);
  if (!text.ok()) return corrupt(manifest_path, text.status().message());
  if (auto why = ParseManifest(*text, step, manifest)) return corrupt(manifest_path, *why);
  if (check_world && manifest->world_size != options.world_size && !options.allow_resharding) {
    result.fatal = FailedPrecondition(
        "checkpoint (agent " + options.agent + " rank " + std::to_string(options.rank) +
        "): " + manifest_path + " was saved by " + std::to_string(manifest->world_size) +
        " ranks but this run has " + std::to_string(options.world_size) +
        "; refusing to restore. Restart with the same number of ranks, or opt in to re-sharding "
        "(allow_resharding) and load every saved shard with LoadShard()");
    return result;
  }
  for (const auto& shard : manifest->shards) {
    bool load = shard.rank == load_rank;
    if (!load && !verify_all) continue;
    const std::string path = step_path + "/" + shard.file;
    Fd fd(::openat(step_fd.get(), shard.file.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC));
    if (!fd.ok()) return corrupt(path, std::string("cannot open: ") + std::strerror(errno));
    struct stat st {};
    if (::fstat(fd.get(), &st) != 0 || !S_ISREG(st.st_mode))
      return corrupt(path, "not a regular file");
    if (static_cast<uint64_t>(st.st_size) != shard.bytes) {
      return corrupt(path, "size is " + std::to_string(st.st_size) + " bytes, manifest says " +
                               std::to_string(shard.bytes));
    }
    std::byte* dst = nullptr;
    if (load) {
      dst = out->Allocate(shard.rank, shard.entries, shard.bytes);
    }
    auto crc = ReadAndChecksum(fd.get(), dst, shard.bytes, scratch, options.io_chunk_bytes, path);
    if (!crc.ok()) return corrupt(path, crc.status().message());
    if (*crc != shard.crc) {
      return corrupt(path, "checksum mismatch: manifest says crc32c " + Hex(shard.crc) +
                               ", the file has " + Hex(*crc));
    }
  }
  return result;
}

}  // namespace

Result<RestoreResult> Checkpointer::Restore() {
  AGENTRT_RETURN_IF_ERROR(Wait());
  if (options_.rank == 0) AGENTRT_RETURN_IF_ERROR(CleanDebris().WithContext(Where() + "cleanup"));
  if (options_.barrier) {
    AGENTRT_RETURN_IF_ERROR(options_.barrier().WithContext(Where() + "barrier after cleanup"));
  }
  AGENTRT_ASSIGN_OR_RETURN(auto steps, ListSteps(dir_fd_, options_.dir));
  RestoreResult result;
  std::vector<std::byte> scratch;
  bool any_committed = false;
  for (int64_t step : steps) {
    if (!ExistsAt(dir_fd_, StepName(step) + "/" + kManifest)) continue;  // not committed
    any_committed = true;
    Manifest manifest;
    ShardData shard;
    VerifyOutcome v = VerifyStep(dir_fd_, options_, step, options_.rank, options_.verify_all_shards,
                                 /*check_world=*/true, &manifest, &shard, scratch);
    if (!v.fatal.ok()) return v.fatal;
    if (v.corrupt) {
      result.skipped.push_back(std::move(*v.corrupt));
      continue;
    }
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

// ---------------------------------------------------------------- confinement

Result<std::string> ConfinedPath(const std::string& root, std::string_view relative) {
  if (relative.empty()) return InvalidArgument("path under " + root + " is empty");
  if (relative.front() == '/') {
    return PermissionDenied("\"" + std::string(relative) + "\" is absolute; it must stay under " +
                            root);
  }
  std::filesystem::path rel(relative);
  for (const auto& part : rel) {
    if (part == "..") {
      return PermissionDenied("\"" + std::string(relative) +
                              "\" contains \"..\"; it must stay under " + root);
    }
  }
  std::error_code ec;
  std::filesystem::path real_root = std::filesystem::weakly_canonical(root, ec);
  if (ec) return InvalidArgument("cannot resolve " + root + ": " + ec.message());
  std::filesystem::path joined = std::filesystem::path(root) / rel;
  // Resolve what exists of the path (symlinks included) and check it is still inside.
  std::filesystem::path real = std::filesystem::weakly_canonical(joined, ec);
  if (ec) return InvalidArgument("cannot resolve " + joined.string() + ": " + ec.message());
  auto [root_end, real_it] =
      std::mismatch(real_root.begin(), real_root.end(), real.begin(), real.end());
  if (root_end != real_root.end()) {
    return PermissionDenied("\"" + std::string(relative) + "\" resolves to " + real.string() +
                            " (through a symlink), outside " + root);
  }
  return joined.lexically_normal().string();
}

namespace {

// Copies `bytes` of `src` into a new file `name` in `dst_dir_fd`, checking the
// crc32c on the way; fsyncs it. A mismatch or short file is a reason string.
Result<std::optional<std::string>> CopyVerified(int src_fd, int dst_dir_fd, const std::string& name,
                                                uint64_t bytes, uint32_t crc_expected,
                                                const std::string& src_path,
                                                const std::string& dst_path) {
  Fd out(::openat(dst_dir_fd, name.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC,
                  0600));
  if (!out.ok()) return ErrnoStatus(errno, "create " + dst_path);
  std::vector<std::byte> buf(std::min<uint64_t>(bytes, 4u << 20) + 1);
  uint32_t crc = 0;
  uint64_t done = 0;
  while (done < bytes) {
    const size_t want = static_cast<size_t>(std::min<uint64_t>(buf.size(), bytes - done));
    const ssize_t n = ::read(src_fd, buf.data(), want);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return ErrnoStatus(errno, "read " + src_path);
    if (n == 0)
      return std::optional<std::string>(src_path + " ended after " + std::to_string(done) + " of " +
                                        std::to_string(bytes) + " bytes");
    crc = Crc32c(buf.data(), static_cast<size_t>(n), crc);
    AGENTRT_RETURN_IF_ERROR(
        WriteAll(out.get(), buf.data(), static_cast<size_t>(n), "write ", dst_path));
    done += static_cast<uint64_t>(n);
  }
  if (crc != crc_expected) {
    return std::optional<std::string>(src_path + ": checksum mismatch: manifest says crc32c " +
                                      Hex(crc_expected) + ", the file has " + Hex(crc));
  }
  AGENTRT_RETURN_IF_ERROR(Fsync(out.get(), dst_path));
  return std::optional<std::string>();
}

// The metadata of `dir`'s newest committed checkpoint with a readable manifest (null if none).
nlohmann::json NewestMetadata(int dir_fd, const CheckpointOptions& options) {
  auto steps = ListSteps(dir_fd, options.dir);
  if (!steps.ok()) return nullptr;
  std::vector<std::byte> scratch;
  for (int64_t step : *steps) {
    if (!ExistsAt(dir_fd, StepName(step) + "/" + kManifest)) continue;
    Manifest manifest;
    ShardData unused;
    VerifyOutcome v = VerifyStep(dir_fd, options, step, /*load_rank=*/-1, /*verify_all=*/false,
                                 /*check_world=*/false, &manifest, &unused, scratch);
    if (v.fatal.ok() && !v.corrupt) return manifest.metadata;
  }
  return nullptr;
}

}  // namespace

Result<AdoptResult> AdoptCheckpoint(const AdoptOptions& o) {
  const std::string where = "adopting " + o.from_agent + "'s checkpoint for " + o.to_agent + ": ";
  Fd from(::open(o.from_dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!from.ok()) return ErrnoStatus(errno, where + "open " + o.from_dir);
  AGENTRT_RETURN_IF_ERROR(MakeDirs0700(o.to_dir).WithContext(where));
  Fd to(::open(o.to_dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!to.ok()) return ErrnoStatus(errno, where + "open " + o.to_dir);
  CheckpointOptions from_options;
  from_options.dir = o.from_dir;
  from_options.agent = o.from_agent;
  from_options.world_size = o.world_size;
  CheckpointOptions to_options = from_options;
  to_options.dir = o.to_dir;
  to_options.agent = o.to_agent;
  const nlohmann::json own = NewestMetadata(to.get(), to_options);

  AdoptResult result;
  AGENTRT_ASSIGN_OR_RETURN(auto steps, ListSteps(from.get(), o.from_dir));
  std::vector<std::byte> scratch;
  for (int64_t step : steps) {
    const std::string step_name = StepName(step);
    if (!ExistsAt(from.get(), step_name + "/" + kManifest)) continue;
    Manifest manifest;
    ShardData unused;
    VerifyOutcome v =
        VerifyStep(from.get(), from_options, step, /*load_rank=*/-1,
                   /*verify_all=*/false, /*check_world=*/true, &manifest, &unused, scratch);
    if (!v.fatal.ok()) return v.fatal.WithContext(where);
    if (v.corrupt) {
      result.skipped.push_back(std::move(*v.corrupt));
      continue;
    }
    const std::string tmp_name = step_name + ".tmp";
    const std::string tmp_path = o.to_dir + "/" + tmp_name;
    RemoveTreeAt(to.get(), tmp_name);
    if (::mkdirat(to.get(), tmp_name.c_str(), 0700) != 0)
      return ErrnoStatus(errno, where + "mkdir " + tmp_path);
    Fd tmp(::openat(to.get(), tmp_name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
    if (!tmp.ok()) return ErrnoStatus(errno, where + "open " + tmp_path);
    Fd src_step(
        ::openat(from.get(), step_name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
    if (!src_step.ok()) return ErrnoStatus(errno, where + "open " + o.from_dir + "/" + step_name);
    std::optional<std::string> bad;
    for (const ShardInfo& shard : manifest.shards) {
      const std::string src_path = o.from_dir + "/" + step_name + "/" + shard.file;
      Fd src(::openat(src_step.get(), shard.file.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC));
      if (!src.ok()) {
        bad = src_path + ": cannot open: " + std::strerror(errno);
        break;
      }
      AGENTRT_ASSIGN_OR_RETURN(bad, CopyVerified(src.get(), tmp.get(), shard.file, shard.bytes,
                                                 shard.crc, src_path, tmp_path + "/" + shard.file));
      if (bad) break;
    }
    if (bad) {
      RemoveTreeAt(to.get(), tmp_name);
      result.skipped.push_back({step, o.from_dir + "/" + step_name, *bad});
      continue;
    }
    // The donor's manifest, re-addressed: this agent, and its own stream positions.
    AGENTRT_ASSIGN_OR_RETURN(
        std::string text,
        ReadSmallFile(src_step.get(), kManifest, o.from_dir + "/" + step_name + "/" + kManifest));
    nlohmann::json m = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (!m.is_object())
      return DataLoss(where + o.from_dir + "/" + step_name + "/" + kManifest +
                      " changed while it was read");
    m["agent"] = o.to_agent;
    nlohmann::json& metadata = m["metadata"];
    if (!metadata.is_object()) metadata = nlohmann::json::object();
    for (const std::string& key : o.keep_own) {
      if (own.is_object() && own.contains(key)) {
        metadata[key] = own[key];
      } else {
        metadata.erase(key);
      }
    }
    metadata["adopted_from"] = {{"agent", o.from_agent}, {"step", step}};
    AGENTRT_RETURN_IF_ERROR(WriteFileAtomic(tmp_path + "/" + kManifest, m.dump(1) + "\n",
                                            {.mode = 0600, .sync_dir = true}));
    // Commit: step-<N> appears whole. A step of the recipient's own with the
    // same number moves aside first.
    const auto now_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                            std::chrono::system_clock::now().time_since_epoch())
                            .count();
    const std::string archive = "replaced/" + std::to_string(now_ns);
    const std::string archive_path = o.to_dir + "/" + archive;
    auto archive_step = [&](const std::string& name) -> Status {
      if (result.archived.empty()) {
        AGENTRT_RETURN_IF_ERROR(MakeDirs0700(archive_path));
        result.archived = archive_path;
      }
      if (::renameat(to.get(), name.c_str(), to.get(), (archive + "/" + name).c_str()) != 0)
        return ErrnoStatus(errno, where + "move " + o.to_dir + "/" + name + " to " + archive_path);
      return Status::Ok();
    };
    if (ExistsAt(to.get(), step_name)) AGENTRT_RETURN_IF_ERROR(archive_step(step_name));
    if (::renameat(to.get(), tmp_name.c_str(), to.get(), step_name.c_str()) != 0)
      return ErrnoStatus(errno, where + "rename " + tmp_path);
    // Committed: from here on the recipient has the donor's weights.
    result.step = step;
    auto own_steps = ListSteps(to.get(), o.to_dir);
    if (!own_steps.ok()) result.warnings.push_back(own_steps.status().message());
    for (int64_t s : own_steps.ok() ? *own_steps : std::vector<int64_t>{}) {
      if (s == step) continue;
      if (Status moved = archive_step(StepName(s)); !moved.ok())
        result.warnings.push_back(moved.message() +
                                  " (a newer step of its own may be restored "
                                  "instead after a crash)");
    }
    if (Status synced = Fsync(to.get(), o.to_dir); !synced.ok())
      result.warnings.push_back(synced.message());
    return result;
  }
  std::string why = o.from_agent + " has no committed checkpoint in " + o.from_dir;
  if (!result.skipped.empty()) {
    why = o.from_agent + "'s checkpoints in " + o.from_dir + " do not verify (step " +
          std::to_string(result.skipped.front().step) + ": " + result.skipped.front().reason + ")";
  }
  return NotFound(where + why);
}

}  // namespace agentrt
