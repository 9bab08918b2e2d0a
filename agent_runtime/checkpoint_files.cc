#include "agent_runtime/checkpoint_files.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <charconv>
#include <climits>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <future>
#include <thread>

#include "common/crc32c.h"
#include "common/file_util.h"

namespace agentrt::checkpoint_files {

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
void RemoveTreeAt(int dir_fd, const std::string& name, int depth) {
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
    nlohmann::json entry = {{"name", e.name},
                            {"dtype", e.dtype},
                            {"shape", e.shape},
                            {"offset", e.offset},
                            {"bytes", e.bytes}};
    if (!e.global_shape.empty()) {
      entry["global_shape"] = e.global_shape;
      entry["global_begin"] = e.global_begin;
    }
    out.push_back(std::move(entry));
  }
  return out;
}

void ChunkChecksums::Update(const std::byte* data, size_t bytes) {
  while (bytes > 0) {
    const size_t take = static_cast<size_t>(std::min<uint64_t>(bytes, chunk_ - filled_));
    crc_ = Crc32c(data, take, crc_);
    filled_ += take;
    data += take;
    bytes -= take;
    if (filled_ == chunk_) {
      whole_ = combiner_.Combine(whole_, crc_);
      done_.push_back(crc_);
      crc_ = 0;
      filled_ = 0;
    }
  }
}

std::vector<uint32_t> ChunkChecksums::Finish() {
  if (filled_ > 0) {
    whole_ = Crc32cCombine(whole_, crc_, filled_);
    done_.push_back(crc_);
  }
  finished_whole_ = std::exchange(whole_, 0);
  crc_ = 0;
  filled_ = 0;
  return std::exchange(done_, {});
}

bool AllGlobal(const Manifest& manifest) {
  for (const auto& shard : manifest.shards) {
    for (const auto& e : shard.entries) {
      if (e.global_shape.empty() && e.bytes > 0) return false;
    }
  }
  return true;
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

namespace {

// An entry's "global_shape"/"global_begin": a 1-D slice of whole elements
// inside the global array.
std::optional<std::string> ParseGlobalSlice(const nlohmann::json& e, ShardEntry* entry) {
  auto shape_it = e.find("global_shape");
  if (shape_it == e.end()) return std::nullopt;
  auto begin_it = e.find("global_begin");
  if (!shape_it->is_array() || begin_it == e.end() || !begin_it->is_number_unsigned()) {
    return std::string("\"global_shape\" needs an array and \"global_begin\" a count");
  }
  uint64_t elements = 1;
  for (const auto& d : *shape_it) {
    if (!d.is_number_unsigned()) return std::string("bad \"global_shape\"");
    const uint64_t dim = d.get<uint64_t>();
    if (dim != 0 && elements > UINT64_MAX / dim) return std::string("\"global_shape\" overflows");
    elements *= dim;
    entry->global_shape.push_back(static_cast<int64_t>(dim));
  }
  entry->global_begin = begin_it->get<uint64_t>();
  if (entry->shape.size() != 1 || entry->shape[0] < 0) {
    return std::string("a global slice must have a 1-D \"shape\" (its element count)");
  }
  const uint64_t count = static_cast<uint64_t>(entry->shape[0]);
  if (count == 0 ? entry->bytes != 0 : entry->bytes % count != 0) {
    return "its " + std::to_string(entry->bytes) + " bytes are not " + std::to_string(count) +
           " whole elements";
  }
  if (entry->global_begin > elements || count > elements - entry->global_begin) {
    return "elements [" + std::to_string(entry->global_begin) + ", " +
           std::to_string(entry->global_begin + count) + ") lie outside the global array of " +
           std::to_string(elements);
  }
  return std::nullopt;
}

// A shard's "chunk_bytes"/"chunk_crc32c" (optional: older checkpoints have
// none, and then hold no global slices).
std::optional<std::string> ParseChunks(const nlohmann::json& s, ShardInfo* info) {
  auto size_it = s.find("chunk_bytes");
  auto crcs_it = s.find("chunk_crc32c");
  if (size_it == s.end() && crcs_it == s.end()) {
    for (const auto& e : info->entries) {
      if (!e.global_shape.empty()) return std::string("global slices without \"chunk_crc32c\"");
    }
    return std::nullopt;
  }
  if (size_it == s.end() || !size_it->is_number_unsigned() || size_it->get<uint64_t>() == 0 ||
      crcs_it == s.end() || !crcs_it->is_array()) {
    return std::string("\"chunk_bytes\" or \"chunk_crc32c\" missing or invalid");
  }
  info->chunk_bytes = size_it->get<uint64_t>();
  const uint64_t chunks = (info->bytes + info->chunk_bytes - 1) / info->chunk_bytes;
  if (crcs_it->size() != chunks) {
    return "\"chunk_crc32c\" has " + std::to_string(crcs_it->size()) + " checksums; " +
           std::to_string(info->bytes) + " bytes make " + std::to_string(chunks) + " chunks";
  }
  for (const auto& c : *crcs_it) {
    if (!c.is_number_unsigned() || c.get<uint64_t>() > UINT32_MAX) {
      return std::string("a \"chunk_crc32c\" value is not a CRC32C");
    }
    info->chunk_crcs.push_back(static_cast<uint32_t>(c.get<uint64_t>()));
  }
  return std::nullopt;
}

}  // namespace

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
      if (auto why = ParseGlobalSlice(e, &entry))
        return where + "entry " + entry.name + ": " + *why;
      info.entries.push_back(std::move(entry));
    }
    if (auto why = ParseChunks(s, &info)) return where + *why;
    out->shards.push_back(std::move(info));
  }
  return std::nullopt;
}

VerifyOutcome VerifyStep(int dir_fd, const CheckpointOptions& options, int64_t step, int load_rank,
                         bool verify_all, bool check_world, Manifest* manifest, ShardData* out,
                         std::vector<std::byte>& scratch, bool lazy) {
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
  if (check_world && manifest->world_size != options.world_size && !options.allow_resharding &&
      !AllGlobal(*manifest)) {
    result.fatal = FailedPrecondition(
        "checkpoint (agent " + options.agent + " rank " + std::to_string(options.rank) +
        "): " + manifest_path + " was saved by " + std::to_string(manifest->world_size) +
        " ranks but this run has " + std::to_string(options.world_size) +
        ", and it holds entries of single ranks (not slices of global arrays), which cannot be "
        "re-sharded automatically; refusing to restore. Restart with the same number of ranks, "
        "or opt in to re-sharding (allow_resharding) and load every saved shard with "
        "LoadShard()");
    return result;
  }
  const bool sizes_only = lazy && AllGlobal(*manifest);
  // Every shard to check is opened and sized first (cheap: a problem there,
  // the lowest rank's, is reported before any byte is read), then read and
  // checksummed in parallel, a shard per thread: several reads in flight fill
  // a disk that one sequential reader does not. No more than kVerifyThreads
  // files are open at once.
  struct Check {
    const ShardInfo* shard;
    std::string path;
    std::optional<std::string> why;  // what is wrong with it
  };
  auto open_shard = [&](const ShardInfo& shard, std::optional<std::string>* why) {
    Fd fd(::openat(step_fd.get(), shard.file.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC));
    struct stat st {};
    if (!fd.ok()) {
      *why = std::string("cannot open: ") + std::strerror(errno);
    } else if (::fstat(fd.get(), &st) != 0 || !S_ISREG(st.st_mode)) {
      *why = "not a regular file";
    } else if (static_cast<uint64_t>(st.st_size) != shard.bytes) {
      *why = "size is " + std::to_string(st.st_size) + " bytes, manifest says " +
             std::to_string(shard.bytes);
    }
    if (why->has_value()) fd.Reset();
    return fd;
  };
  std::vector<Check> checks;
  for (const auto& shard : manifest->shards) {
    const bool load = !sizes_only && shard.rank == load_rank;
    if (!load && !verify_all && !sizes_only) continue;
    const std::string path = step_path + "/" + shard.file;
    std::optional<std::string> why;
    open_shard(shard, &why);
    if (why) return corrupt(path, *why);
    if (sizes_only) continue;  // its chunks are verified as they are read
    checks.push_back({&shard, path, std::nullopt});
  }
  auto run = [&](Check& c, std::vector<std::byte>& buffer) {
    Fd fd = open_shard(*c.shard, &c.why);  // again: it may have changed meanwhile
    if (c.why) return;
    std::byte* dst = nullptr;
    if (c.shard->rank == load_rank)
      dst = out->Allocate(c.shard->rank, c.shard->entries, c.shard->bytes);
    auto crc =
        ReadAndChecksum(fd.get(), dst, c.shard->bytes, buffer, options.io_chunk_bytes, c.path);
    if (!crc.ok()) {
      c.why = crc.status().message();
    } else if (*crc != c.shard->crc) {
      c.why = "checksum mismatch: manifest says crc32c " + Hex(c.shard->crc) + ", the file has " +
              Hex(*crc);
    }
  };
  if (checks.size() == 1) {
    run(checks[0], scratch);
  } else if (!checks.empty()) {
    std::atomic<size_t> next{0};
    std::vector<std::thread> readers;
    for (size_t t = 0; t < std::min(checks.size(), kVerifyThreads); ++t) {
      readers.emplace_back([&] {
        std::vector<std::byte> buffer;
        for (size_t i = next++; i < checks.size(); i = next++) run(checks[i], buffer);
      });
    }
    for (auto& r : readers) r.join();
  }
  for (const Check& c : checks) {  // the lowest rank's problem
    if (c.why) return corrupt(c.path, *c.why);
  }
  return result;
}

}  // namespace agentrt::checkpoint_files
