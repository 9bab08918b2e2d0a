// SavedStep: a committed step as global arrays, read by ranks of any world
// size (the format is in agent_runtime/checkpointer.h).
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "agent_runtime/checkpoint_files.h"
#include "agent_runtime/checkpointer.h"
#include "common/crc32c.h"
#include "common/file_util.h"

namespace agentrt {

using namespace checkpoint_files;  // NOLINT(google-build-using-namespace): its own files

namespace checkpoint_files {

Result<std::shared_ptr<const SavedStep>> SavedStepAccess::Open(int dir_fd,
                                                               const std::string& dir_path,
                                                               const Manifest& manifest,
                                                               const ShardData* loaded) {
  std::shared_ptr<SavedStep> saved(new SavedStep());
  if (loaded != nullptr && loaded->shared_data() != nullptr) {
    saved->loaded_rank_ = loaded->rank();
    saved->loaded_ = loaded->shared_data();
  }
  saved->step_ = manifest.step;
  saved->world_size_ = manifest.world_size;
  saved->path_ = dir_path + "/" + StepName(manifest.step);
  saved->step_fd_ = ::openat(dir_fd, StepName(manifest.step).c_str(),
                             O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (saved->step_fd_ < 0) return ErrnoStatus(errno, "open " + saved->path_);
  std::vector<SavedStep::Array>& arrays = saved->arrays_;
  for (const ShardInfo& shard : manifest.shards) {
    saved->chunk_bytes_.push_back(shard.chunk_bytes);
    saved->chunk_crcs_.push_back(shard.chunk_crcs);
    saved->shard_bytes_.push_back(shard.bytes);
    for (const ShardEntry& e : shard.entries) {
      if (e.global_shape.empty() || e.bytes == 0) continue;
      const uint64_t count = static_cast<uint64_t>(e.shape[0]);
      const size_t element_bytes = static_cast<size_t>(e.bytes / count);
      auto it = std::find_if(arrays.begin(), arrays.end(),
                             [&e](const SavedStep::Array& a) { return a.name == e.name; });
      if (it == arrays.end()) {
        SavedStep::Array a;
        a.name = e.name;
        a.dtype = e.dtype;
        a.shape = e.global_shape;
        a.elements = 1;
        for (int64_t d : e.global_shape) a.elements *= static_cast<uint64_t>(d);
        a.element_bytes = element_bytes;
        arrays.push_back(std::move(a));
        it = arrays.end() - 1;
      } else if (it->dtype != e.dtype || it->shape != e.global_shape ||
                 it->element_bytes != element_bytes) {
        return DataLoss(saved->path_ + ": rank " + std::to_string(shard.rank) + "'s slice of \"" +
                        e.name +
                        "\" disagrees with another rank's about its dtype, global shape "
                        "or element size");
      }
      it->pieces.push_back({shard.rank, e.global_begin, count, e.offset});
    }
  }
  for (auto& a : arrays) {
    std::sort(a.pieces.begin(), a.pieces.end(),
              [](const auto& x, const auto& y) { return x.begin < y.begin; });
  }
  std::sort(arrays.begin(), arrays.end(),
            [](const auto& x, const auto& y) { return x.name < y.name; });
  return std::shared_ptr<const SavedStep>(std::move(saved));
}

}  // namespace checkpoint_files

SavedStep::~SavedStep() {
  if (step_fd_ >= 0) ::close(step_fd_);
}

const SavedStep::Array* SavedStep::Find(std::string_view name) const {
  auto it = std::lower_bound(arrays_.begin(), arrays_.end(), name,
                             [](const Array& a, std::string_view n) { return a.name < n; });
  return it != arrays_.end() && it->name == name ? &*it : nullptr;
}

namespace {

// Reads exactly `bytes` at `offset`; a short file is DataLoss.
Status PreadAll(int fd, std::byte* dst, size_t bytes, uint64_t offset, const std::string& path) {
  const ssize_t got = ReadAllAt(fd, dst, bytes, static_cast<off_t>(offset));
  // Unreadable is lost, as a bad checksum: the restore goes back a step.
  if (got < 0) return DataLoss(path + ": cannot read: " + std::strerror(errno));
  if (static_cast<size_t>(got) < bytes) {
    return DataLoss(path + " ended at byte " + std::to_string(offset + static_cast<uint64_t>(got)) +
                    ", before " + std::to_string(offset + bytes));
  }
  return Status::Ok();
}

}  // namespace

Status SavedStep::ReadRange(int rank, uint64_t lo, uint64_t hi, std::byte* dst,
                            std::vector<std::byte>& scratch) const {
  if (rank == loaded_rank_) {  // read and verified whole by Restore
    std::memcpy(dst, loaded_.get() + lo, static_cast<size_t>(hi - lo));
    return Status::Ok();
  }
  const std::string path = path_ + "/" + ShardName(rank);
  Fd fd(::openat(step_fd_, ShardName(rank).c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC));
  if (!fd.ok()) return DataLoss(path + ": cannot open: " + std::strerror(errno));
  const uint64_t chunk = chunk_bytes_[static_cast<size_t>(rank)];
  const std::vector<uint32_t>& crcs = chunk_crcs_[static_cast<size_t>(rank)];
  const uint64_t file_bytes = shard_bytes_[static_cast<size_t>(rank)];
  for (uint64_t c = lo / chunk; c * chunk < hi; ++c) {
    const uint64_t start = c * chunk;
    const uint64_t stop = std::min(start + chunk, file_bytes);
    const bool whole = start >= lo && stop <= hi;  // straight into the caller's memory
    std::byte* target = dst + (start - lo);
    if (!whole) {
      scratch.resize(static_cast<size_t>(chunk));
      target = scratch.data();
    }
    const size_t n = static_cast<size_t>(stop - start);
    AGENTRT_RETURN_IF_ERROR(PreadAll(fd.get(), target, n, start, path));
    const uint32_t crc = Crc32c(target, n);
    if (crc != crcs[static_cast<size_t>(c)]) {
      return DataLoss(path + ": bytes " + std::to_string(start) + ".." + std::to_string(stop) +
                      ": checksum mismatch: manifest says crc32c " +
                      Hex(crcs[static_cast<size_t>(c)]) + ", the file has " + Hex(crc));
    }
    if (!whole) {
      const uint64_t from = std::max(start, lo);
      const uint64_t to = std::min(stop, hi);
      std::memcpy(dst + (from - lo), target + (from - start), static_cast<size_t>(to - from));
    }
  }
  return Status::Ok();
}

Status SavedStep::Read(std::string_view name, uint64_t begin, uint64_t count, void* dst) const {
  const Array* a = Find(name);
  if (a == nullptr) {
    return NotFound(path_ + ": holds no global array \"" + std::string(name) + "\"");
  }
  if (begin > a->elements || count > a->elements - begin) {
    return Status(StatusCode::kOutOfRange, path_ + ": \"" + a->name + "\" has " +
                                               std::to_string(a->elements) + " elements, not [" +
                                               std::to_string(begin) + ", " +
                                               std::to_string(begin + count) + ")");
  }
  auto* out = static_cast<std::byte*>(dst);
  std::vector<std::byte> scratch;
  const uint64_t end = begin + count;
  for (uint64_t at = begin; at < end;) {
    const Piece* from = nullptr;
    for (const Piece& p : a->pieces) {
      if (p.begin <= at && at < p.begin + p.count) {
        from = &p;
        break;
      }
    }
    if (from == nullptr) {
      return DataLoss(path_ + ": element " + std::to_string(at) + " of \"" + a->name +
                      "\" is in no rank's shard");
    }
    const uint64_t stop = std::min(end, from->begin + from->count);
    const uint64_t lo = from->offset + (at - from->begin) * a->element_bytes;
    const uint64_t hi = from->offset + (stop - from->begin) * a->element_bytes;
    AGENTRT_RETURN_IF_ERROR(
        ReadRange(from->rank, lo, hi, out + (at - begin) * a->element_bytes, scratch));
    at = stop;
  }
  return Status::Ok();
}

Result<bool> SavedStep::ReadRankRow(std::string_view name, int rank,
                                    std::vector<std::byte>* row) const {
  row->clear();
  const Array* a = Find(name);
  if (a == nullptr) {
    return NotFound(path_ + ": holds no global array \"" + std::string(name) + "\"");
  }
  if (a->shape.size() != 2 || a->element_bytes != 1) {
    return DataLoss(path_ + ": \"" + a->name + "\" is not an array of rank rows");
  }
  if (rank < 0 || rank >= a->shape[0]) return false;
  const auto bytes = static_cast<uint64_t>(a->shape[1]);
  row->resize(static_cast<size_t>(bytes));
  AGENTRT_RETURN_IF_ERROR(Read(name, static_cast<uint64_t>(rank) * bytes, bytes, row->data()));
  return true;
}

}  // namespace agentrt
