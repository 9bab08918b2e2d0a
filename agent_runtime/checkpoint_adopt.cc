// AdoptCheckpoint and ConfinedPath (agent_runtime/checkpointer.h): one agent's
// verified checkpoint committed as another's, for PBT exploits.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include "agent_runtime/checkpoint_files.h"
#include "agent_runtime/checkpointer.h"
#include "common/crc32c.h"
#include "common/file_util.h"

namespace agentrt {

using namespace checkpoint_files;  // NOLINT(google-build-using-namespace): its own files

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

// `dir`'s newest committed checkpoint with a readable manifest (step -1 and
// null metadata if none).
NewestCheckpointInfo Newest(int dir_fd, const CheckpointOptions& options) {
  auto steps = ListSteps(dir_fd, options.dir);
  if (!steps.ok()) return {};
  std::vector<std::byte> scratch;
  for (int64_t step : *steps) {
    if (!ExistsAt(dir_fd, StepName(step) + "/" + kManifest)) continue;
    Manifest manifest;
    ShardData unused;
    VerifyOutcome v = VerifyStep(dir_fd, options, step, /*load_rank=*/-1, /*verify_all=*/false,
                                 /*check_world=*/false, &manifest, &unused, scratch);
    if (v.fatal.ok() && !v.corrupt) return {step, std::move(manifest.metadata)};
  }
  return {};
}

}  // namespace

namespace {

// One adoption under way: the donor's and the recipient's folders, open.
class Adoption {
 public:
  explicit Adoption(const AdoptOptions& o)
      : o_(o), where_("adopting " + o.from_agent + "'s checkpoint for " + o.to_agent + ": ") {}

  Result<AdoptResult> Run() {
    from_ = Fd(::open(o_.from_dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    if (!from_.ok()) return ErrnoStatus(errno, where_ + "open " + o_.from_dir);
    AGENTRT_RETURN_IF_ERROR(MakeDirs0700(o_.to_dir).WithContext(Context()));
    to_ = Fd(::open(o_.to_dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    if (!to_.ok()) return ErrnoStatus(errno, where_ + "open " + o_.to_dir);
    CheckpointOptions from_options;
    from_options.dir = o_.from_dir;
    from_options.agent = o_.from_agent;
    from_options.world_size = o_.world_size;
    CheckpointOptions to_options = from_options;
    to_options.dir = o_.to_dir;
    to_options.agent = o_.to_agent;
    own_ = Newest(to_.get(), to_options).metadata;

    AGENTRT_ASSIGN_OR_RETURN(auto steps, ListSteps(from_.get(), o_.from_dir));
    std::vector<std::byte> scratch;
    for (int64_t step : steps) {
      if (!ExistsAt(from_.get(), StepName(step) + "/" + kManifest)) continue;
      Manifest manifest;
      ShardData unused;
      VerifyOutcome v =
          VerifyStep(from_.get(), from_options, step, /*load_rank=*/-1,
                     /*verify_all=*/false, /*check_world=*/true, &manifest, &unused, scratch);
      if (!v.fatal.ok()) return v.fatal.WithContext(Context());
      if (v.corrupt) {
        result_.skipped.push_back(std::move(*v.corrupt));
        continue;
      }
      AGENTRT_ASSIGN_OR_RETURN(const bool adopted, TryStep(step, manifest));
      if (adopted) return result_;
    }
    std::string why = o_.from_agent + " has no committed checkpoint in " + o_.from_dir;
    if (!result_.skipped.empty()) {
      why = o_.from_agent + "'s checkpoints in " + o_.from_dir + " do not verify (step " +
            std::to_string(result_.skipped.front().step) + ": " + result_.skipped.front().reason +
            ")";
    }
    return NotFound(where_ + why);
  }

 private:
  // where_ without its ": ", for WithContext (which adds one).
  std::string Context() const { return where_.substr(0, where_.size() - 2); }

  // Copies the donor's step into the recipient's step-<N>.tmp and commits it;
  // false (the step recorded as skipped) when a shard does not verify.
  Result<bool> TryStep(int64_t step, const Manifest& manifest) {
    const std::string step_name = StepName(step);
    const std::string tmp_name = step_name + ".tmp";
    const std::string tmp_path = o_.to_dir + "/" + tmp_name;
    RemoveTreeAt(to_.get(), tmp_name);
    if (::mkdirat(to_.get(), tmp_name.c_str(), 0700) != 0)
      return ErrnoStatus(errno, where_ + "mkdir " + tmp_path);
    Fd tmp(::openat(to_.get(), tmp_name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
    if (!tmp.ok()) return ErrnoStatus(errno, where_ + "open " + tmp_path);
    Fd src_step(
        ::openat(from_.get(), step_name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
    if (!src_step.ok()) return ErrnoStatus(errno, where_ + "open " + o_.from_dir + "/" + step_name);
    std::optional<std::string> bad;
    for (const ShardInfo& shard : manifest.shards) {
      const std::string src_path = o_.from_dir + "/" + step_name + "/" + shard.file;
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
      RemoveTreeAt(to_.get(), tmp_name);
      result_.skipped.push_back({step, o_.from_dir + "/" + step_name, *bad});
      return false;
    }
    AGENTRT_RETURN_IF_ERROR(WriteManifest(src_step.get(), step, tmp_path));
    AGENTRT_RETURN_IF_ERROR(Commit(step, tmp_name, tmp_path));
    return true;
  }

  // The donor's manifest, re-addressed: this agent, and its own stream positions.
  Status WriteManifest(int src_step, int64_t step, const std::string& tmp_path) {
    const std::string src_path = o_.from_dir + "/" + StepName(step) + "/" + kManifest;
    AGENTRT_ASSIGN_OR_RETURN(std::string text, ReadSmallFile(src_step, kManifest, src_path));
    nlohmann::json m = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (!m.is_object()) return DataLoss(where_ + src_path + " changed while it was read");
    m["agent"] = o_.to_agent;
    nlohmann::json& metadata = m["metadata"];
    if (!metadata.is_object()) metadata = nlohmann::json::object();
    for (const std::string& key : o_.keep_own) {
      if (own_.is_object() && own_.contains(key)) {
        metadata[key] = own_[key];
      } else {
        metadata.erase(key);
      }
    }
    metadata["adopted_from"] = {{"agent", o_.from_agent}, {"step", step}};
    if (!o_.note.is_null()) metadata["adopted_from"]["note"] = o_.note;
    return WriteFileAtomic(tmp_path + "/" + kManifest, m.dump(1) + "\n",
                           {.mode = 0600, .sync_dir = true});
  }

  // step-<N> appears whole. A step of the recipient's own with the same number
  // moves aside first, its other steps after.
  Status Commit(int64_t step, const std::string& tmp_name, const std::string& tmp_path) {
    const std::string step_name = StepName(step);
    const auto now_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                            std::chrono::system_clock::now().time_since_epoch())
                            .count();
    archive_ = "replaced/" + std::to_string(now_ns);
    if (ExistsAt(to_.get(), step_name)) AGENTRT_RETURN_IF_ERROR(ArchiveStep(step_name));
    if (::renameat(to_.get(), tmp_name.c_str(), to_.get(), step_name.c_str()) != 0)
      return ErrnoStatus(errno, where_ + "rename " + tmp_path);
    // Committed: from here on the recipient has the donor's weights.
    result_.step = step;
    auto own_steps = ListSteps(to_.get(), o_.to_dir);
    if (!own_steps.ok()) result_.warnings.push_back(own_steps.status().message());
    for (int64_t s : own_steps.ok() ? *own_steps : std::vector<int64_t>{}) {
      if (s == step) continue;
      if (Status moved = ArchiveStep(StepName(s)); !moved.ok())
        result_.warnings.push_back(moved.message() +
                                   " (a newer step of its own may be restored "
                                   "instead after a crash)");
    }
    if (Status synced = Fsync(to_.get(), o_.to_dir); !synced.ok())
      result_.warnings.push_back(synced.message());
    return Status::Ok();
  }

  Status ArchiveStep(const std::string& name) {
    const std::string archive_path = o_.to_dir + "/" + archive_;
    if (result_.archived.empty()) {
      AGENTRT_RETURN_IF_ERROR(MakeDirs0700(archive_path));
      result_.archived = archive_path;
    }
    if (::renameat(to_.get(), name.c_str(), to_.get(), (archive_ + "/" + name).c_str()) != 0)
      return ErrnoStatus(errno, where_ + "move " + o_.to_dir + "/" + name + " to " + archive_path);
    return Status::Ok();
  }

  const AdoptOptions& o_;
  const std::string where_;
  Fd from_;
  Fd to_;
  nlohmann::json own_;   // the recipient's newest metadata
  std::string archive_;  // replaced/<ns>, where the recipient's own steps go
  AdoptResult result_;
};

}  // namespace

Result<AdoptResult> AdoptCheckpoint(const AdoptOptions& o) { return Adoption(o).Run(); }

Result<NewestCheckpointInfo> NewestCheckpoint(const std::string& dir, const std::string& agent) {
  Fd fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!fd.ok()) {
    if (errno == ENOENT) return NewestCheckpointInfo{};
    return ErrnoStatus(errno, "open " + dir);
  }
  CheckpointOptions options;
  options.dir = dir;
  options.agent = agent;
  return Newest(fd.get(), options);
}

}  // namespace agentrt
