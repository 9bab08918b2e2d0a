#include "comms/bus_log.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "common/crc32c.h"
#include "common/enum_names.h"
#include "common/file_util.h"

namespace agentrt {

namespace v1 = bus::v1;

namespace {

constexpr char kMagic[8] = {'A', 'R', 'T', 'B', 'U', 'S', '1', '\n'};
constexpr size_t kHeader = 8;  // u32 length + u32 crc
// No record is larger: a 1 GiB payload (bus.max_message_bytes' ceiling) and its fields.
constexpr uint32_t kMaxRecord = (uint32_t{1} << 30) + (uint32_t{1} << 20);

void PutU32(char* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<char>((v >> (8 * i)) & 0xff);
}
uint32_t GetU32(const char* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= uint32_t{static_cast<unsigned char>(p[i])} << (8 * i);
  return v;
}

std::string SegmentName(int64_t base) {
  char name[32];
  std::snprintf(name, sizeof(name), "%020lld.seg", static_cast<long long>(base));
  return name;
}

constexpr EnumName<BusDurability> kDurabilityNames[] = {{BusDurability::kMemory, "memory"},
                                                        {BusDurability::kBatch, "batch"},
                                                        {BusDurability::kAlways, "always"}};

}  // namespace

Result<BusDurability> ParseBusDurability(std::string_view text) {
  if (auto durability = ValueIn(kDurabilityNames, text)) return *durability;
  return InvalidArgument("expected memory, batch or always, got \"" + std::string(text) + "\"");
}

std::string_view BusDurabilityName(BusDurability d) { return NameIn(kDurabilityNames, d); }

std::string EscapeLogName(std::string_view name) {
  static const char* hex = "0123456789ABCDEF";
  std::string out;
  for (unsigned char c : name) {
    if (std::isalnum(c) || c == '_' || c == '-') {
      out.push_back(static_cast<char>(c));
    } else {
      out.push_back('%');
      out.push_back(hex[c >> 4]);
      out.push_back(hex[c & 15]);
    }
  }
  return out;
}

Result<std::string> UnescapeLogName(std::string_view escaped) {
  std::string out;
  for (size_t i = 0; i < escaped.size(); ++i) {
    if (escaped[i] != '%') {
      out.push_back(escaped[i]);
      continue;
    }
    if (i + 2 >= escaped.size())
      return InvalidArgument("bad log folder name " + std::string(escaped));
    const std::string h(escaped.substr(i + 1, 2));
    char* end = nullptr;
    const long v = std::strtol(h.c_str(), &end, 16);
    if (h.size() != 2 || end != h.c_str() + 2)
      return InvalidArgument("bad log folder name " + std::string(escaped));
    out.push_back(static_cast<char>(v));
    i += 2;
  }
  return out;
}

struct SegmentLog::Segment {
  Segment(std::string p, int64_t b, int f, int64_t s)
      : path(std::move(p)), base(b), fd(f), size(s) {}
  ~Segment() {
    if (fd >= 0) ::close(fd);
  }
  const std::string path;
  const int64_t base;
  int fd;        // -1 once sealed and closed
  int64_t size;  // bytes in the file
};

SegmentLog::SegmentLog(std::string dir, int64_t segment_bytes)
    : dir_(std::move(dir)), segment_bytes_(std::max<int64_t>(segment_bytes, 4096)) {}

SegmentLog::~SegmentLog() = default;

namespace {

// The segment files of `dir` (<20-digit base offset>.seg), by base offset.
Result<std::vector<std::pair<int64_t, std::string>>> ListSegmentFiles(const std::string& dir) {
  std::error_code ec;
  std::vector<std::pair<int64_t, std::string>> files;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.size() != 24 || name.substr(20) != ".seg") continue;  // e.g. a .tmp of ours: none
    char* end = nullptr;
    const long long base = std::strtoll(name.c_str(), &end, 10);
    if (end != name.c_str() + 20 || base < 0)
      return DataLoss("bus log: unexpected file " + entry.path().string());
    files.emplace_back(base, entry.path().string());
  }
  if (ec) return Internal("bus log: cannot list " + dir + ": " + ec.message());
  std::sort(files.begin(), files.end());
  return files;
}

// What is wrong with the record at `pos` of `bytes` ("" when nothing; then
// `m` holds it), and whether that looks like an interrupted append.
struct RecordCheck {
  std::string bad;
  // A torn tail is what an interrupted append leaves: a prefix of the last
  // record (its header whole, as it is written in one write with its body),
  // or zeros where the file system had not written the data yet.
  bool torn_shape = true;
  uint32_t len = 0;
};

RecordCheck CheckRecord(const std::string& bytes, size_t pos, v1::Message* m) {
  RecordCheck c;
  const size_t left = bytes.size() - pos;
  if (left < kHeader) {
    c.bad = "a record header cut short";
    return c;
  }
  c.len = GetU32(bytes.data() + pos);
  const uint32_t crc = GetU32(bytes.data() + pos + 4);
  if (c.len == 0 || c.len > kMaxRecord) {
    const bool zeros = std::all_of(bytes.begin() + static_cast<std::ptrdiff_t>(pos), bytes.end(),
                                   [](char ch) { return ch == 0; });
    c.bad = zeros ? "zeros where a record belongs"
                  : "a record length of " + std::to_string(c.len) + " (no record is that size)";
    c.torn_shape = zeros;
  } else if (left - kHeader < c.len) {
    c.bad = "a record of " + std::to_string(c.len) + " bytes cut short at " +
            std::to_string(left - kHeader);
  } else if (Crc32c(bytes.data() + pos + kHeader, c.len) != crc) {
    c.bad = "a record failing its CRC32C";
  } else if (!m->ParseFromArray(bytes.data() + pos + kHeader, static_cast<int>(c.len))) {
    c.bad = "a record that does not parse";
  }
  return c;
}

// Reads the records of one segment file, whose first offset is `*next`, into
// `recovered`; the torn tail of the newest segment is cut off, anything else
// wrong is DataLoss. The bytes it keeps (0: not even its magic, so it is to be
// written afresh).
Result<size_t> ReadSegment(const std::string& path, bool newest, int64_t* next,
                           SegmentLog::Recovered* recovered) {
  const Result<std::string> read = ReadWholeFile(path, size_t{1} << 40);
  if (!read.ok()) return read.status();
  const std::string& bytes = read.value();
  if (bytes.size() < sizeof(kMagic) || std::memcmp(bytes.data(), kMagic, sizeof(kMagic)) != 0) {
    if (!(newest && bytes.size() < sizeof(kMagic) &&
          std::memcmp(bytes.data(), kMagic, bytes.size()) == 0)) {
      return DataLoss("bus log: " + path + " is not a bus log segment (bad magic)");
    }
    return size_t{0};  // a segment whose creation was cut short: rewritten
  }
  const int64_t base = *next;
  size_t pos = sizeof(kMagic);
  while (pos < bytes.size()) {
    const size_t left = bytes.size() - pos;
    v1::Message m;
    const RecordCheck c = CheckRecord(bytes, pos, &m);
    if (c.bad.empty() && m.offset() != *next) {
      // (A parsed record of another offset, including an empty message: corrupt.)
      return DataLoss("bus log: " + path + " byte " + std::to_string(pos) + ": record of offset " +
                      std::to_string(m.offset()) + " where offset " + std::to_string(*next) +
                      " belongs");
    }
    if (!c.bad.empty()) {
      const bool at_end = left < kHeader || (c.torn_shape && left - kHeader <= c.len) ||
                          (c.torn_shape && c.len == 0);
      if (!(newest && at_end)) {
        return DataLoss("bus log: " + path + " byte " + std::to_string(pos) + " (offset " +
                        std::to_string(*next) + "): " + c.bad + ", with " +
                        (newest ? "more data after it" : "newer segments after it") +
                        ": the log is corrupt (not a torn tail). Moving this file and every "
                        "newer segment of the topic away drops offsets " +
                        std::to_string(base) + " onward (" + std::to_string(*next - base) +
                        " readable records of this file with them): the topic starts again at "
                        "offset " +
                        std::to_string(base));
      }
      recovered->torn = path + " byte " + std::to_string(pos) + " (offset " +
                        std::to_string(*next) + "): " + c.bad + "; cut off " +
                        std::to_string(left) + " bytes";
      if (::truncate(path.c_str(), static_cast<off_t>(pos)) != 0)
        return ErrnoStatus(errno, "bus log: cannot cut the torn tail of " + path);
      return pos;
    }
    recovered->messages.push_back(std::move(m));
    ++*next;
    pos += kHeader + c.len;
  }
  return bytes.size();
}

}  // namespace

Result<std::unique_ptr<SegmentLog>> SegmentLog::Open(std::string dir, int64_t segment_bytes,
                                                     Recovered* recovered) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return Internal("bus log: cannot create " + dir + ": " + ec.message());
  AGENTRT_ASSIGN_OR_RETURN(const auto files, ListSegmentFiles(dir));
  std::unique_ptr<SegmentLog> log(new SegmentLog(dir, segment_bytes));
  *recovered = Recovered{};
  int64_t next = files.empty() ? 0 : files.front().first;
  recovered->base = next;
  for (size_t f = 0; f < files.size(); ++f) {
    const auto& [base, path] = files[f];
    if (base != next) {
      return DataLoss("bus log: " + path + " starts at offset " + std::to_string(base) +
                      " but the segment before it ends at " + std::to_string(next) +
                      " (a segment is missing)");
    }
    AGENTRT_ASSIGN_OR_RETURN(const size_t kept,
                             ReadSegment(path, f + 1 == files.size(), &next, recovered));
    if (kept == 0) {
      // No magic: write the segment afresh (Roll creates it).
      std::filesystem::remove(path, ec);
      continue;
    }
    log->segments_.push_back(std::make_shared<Segment>(path, base, -1, static_cast<int64_t>(kept)));
  }
  log->end_ = next;
  log->staged_end_ = next;
  if (recovered->messages.empty()) recovered->base = next;
  if (!log->segments_.empty()) {
    auto& last = log->segments_.back();
    last->fd = ::open(last->path.c_str(), O_WRONLY | O_APPEND | O_CLOEXEC);
    if (last->fd < 0) return ErrnoStatus(errno, "bus log: cannot open " + last->path);
  }
  return log;
}

Status SegmentLog::Roll(int64_t base) {
  // Under mu_. The new segment is made first (a failure leaves the old one
  // the newest and writable); then the old one is synced and sealed, so that
  // only the newest can ever have a torn tail.
  const std::string path = dir_ + "/" + SegmentName(base);
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoStatus(errno, "bus log: cannot create " + path);
  if (::write(fd, kMagic, sizeof(kMagic)) != static_cast<ssize_t>(sizeof(kMagic))) {
    const Status s = ErrnoStatus(errno, "bus log: cannot write " + path);
    ::close(fd);
    ::unlink(path.c_str());
    return s;
  }
  if (!segments_.empty() && segments_.back()->fd >= 0) {
    auto& old = segments_.back();
    if (::fdatasync(old->fd) != 0) {
      // What the old segment holds may not be on disk: nothing more is written.
      broken_ = ErrnoStatus(errno, "bus log: cannot fsync " + old->path);
      ::close(fd);
      ::unlink(path.c_str());
      return broken_;
    }
    ::close(old->fd);
    old->fd = -1;
  }
  segments_.push_back(std::make_shared<Segment>(path, base, fd, sizeof(kMagic)));
  // Until the folder is synced the new segment's name may vanish in a crash,
  // with every record written to it: nothing more is written.
  if (Status synced = FsyncDir(dir_); !synced.ok()) {
    broken_ = synced.WithContext("bus log: the new segment " + path + " is not durable");
    return broken_;
  }
  return Status::Ok();
}

Status SegmentLog::Stage(const v1::Message& m) {
  std::unique_lock<std::mutex> lock(mu_);
  if (!broken_.ok()) return broken_;
  if (m.offset() != staged_end_) {
    return Internal("bus log " + dir_ + ": append of offset " + std::to_string(m.offset()) +
                    " where " + std::to_string(staged_end_) + " is next");
  }
  const size_t len = m.ByteSizeLong();
  const auto magic = static_cast<int64_t>(sizeof(kMagic));
  const int64_t used =
      segments_.empty() ? 0 : segments_.back()->size + static_cast<int64_t>(pending_.size());
  if (segments_.empty() ||
      (used + static_cast<int64_t>(kHeader + len) > segment_bytes_ && used > magic)) {
    lock.unlock();
    AGENTRT_RETURN_IF_ERROR(Commit());
    lock.lock();
    AGENTRT_RETURN_IF_ERROR(Roll(staged_end_));
  }
  const size_t at = pending_.size();
  pending_.resize(at + kHeader + len);
  char* rec = pending_.data() + at;
  m.SerializeWithCachedSizesToArray(reinterpret_cast<uint8_t*>(rec + kHeader));
  PutU32(rec, static_cast<uint32_t>(len));
  PutU32(rec + 4, Crc32c(rec + kHeader, len));
  ++staged_end_;
  return Status::Ok();
}

Status SegmentLog::Commit() {
  std::lock_guard<std::mutex> lock(mu_);
  if (!broken_.ok()) {
    pending_.clear();
    staged_end_ = end_;
    return broken_;
  }
  if (pending_.empty()) return Status::Ok();
  Segment& seg = *segments_.back();
  if (Status s =
          WriteAll(seg.fd, pending_.data(), pending_.size(), "bus log: cannot write ", seg.path);
      !s.ok()) {
    // Nothing staged stays. If even that fails, later appends would land
    // after half a record: nothing more is written to this log.
    if (::ftruncate(seg.fd, static_cast<off_t>(seg.size)) != 0)
      broken_ = ErrnoStatus(errno, "bus log: cannot cut a failed write from " + seg.path);
    pending_.clear();
    staged_end_ = end_;
    return s;
  }
  seg.size += static_cast<int64_t>(pending_.size());
  written_ += static_cast<uint64_t>(staged_end_ - end_);
  end_ = staged_end_;
  pending_.clear();
  if (pending_.capacity() > (size_t{8} << 20)) std::string().swap(pending_);  // large ones passed
  return Status::Ok();
}

int64_t SegmentLog::committed_end() const {
  std::lock_guard<std::mutex> lock(mu_);
  return end_;
}

Status SegmentLog::Sync() {
  std::lock_guard<std::mutex> sync_lock(sync_mu_);
  std::string path;
  uint64_t ticket = 0;
  int fd = -1;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!broken_.ok()) return broken_;
    ticket = written_;
    if (ticket == synced_.load() || segments_.empty()) return Status::Ok();
    // Older segments were synced when they were sealed; this one may be
    // sealed (and closed) by a roll while we sync it, hence our own fd.
    path = segments_.back()->path;
    fd = ::dup(segments_.back()->fd);
  }
  if (fd < 0) return ErrnoStatus(errno, "bus log: cannot fsync " + path);
  const int rc = ::fdatasync(fd);
  ::close(fd);
  if (rc != 0) {
    // After a failed fsync a later one proves nothing (the kernel may have
    // dropped the pages): nothing more is written to this log.
    const Status s = ErrnoStatus(errno, "bus log: cannot fsync " + path);
    std::lock_guard<std::mutex> lock(mu_);
    broken_ = s;
    return s;
  }
  synced_.store(ticket);
  return Status::Ok();
}

bool SegmentLog::Dirty() const {
  std::lock_guard<std::mutex> lock(mu_);
  return broken_.ok() && written_ != synced_.load();
}

void SegmentLog::DropBefore(int64_t earliest) {
  std::lock_guard<std::mutex> lock(mu_);
  size_t drop = 0;
  while (drop + 1 < segments_.size() && segments_[drop + 1]->base <= earliest) ++drop;
  if (drop == 0) return;
  for (size_t i = 0; i < drop; ++i) ::unlink(segments_[i]->path.c_str());
  segments_.erase(segments_.begin(), segments_.begin() + static_cast<std::ptrdiff_t>(drop));
  // A folder that cannot be synced is a failing disk: the log stops taking
  // writes (a dropped segment that came back after a crash would only be old
  // messages, but later records could not be trusted either).
  if (Status synced = FsyncDir(dir_); !synced.ok() && broken_.ok()) {
    broken_ =
        synced.WithContext("bus log: dropping segments before offset " + std::to_string(earliest));
  }
}

int64_t SegmentLog::segments() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int64_t>(segments_.size());
}

}  // namespace agentrt
