// The broker's payload store: large messages in files beside the log (or
// in spill/), uploaded in chunks, read back in chunks, recovered at start.
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <vector>

#include "common/crc32c.h"
#include "common/file_util.h"
#include "common/random.h"
#include "comms/broker_internal.h"
#include "fmt/format.h"
#include "plan/run_dir.h"

namespace agentrt {

using namespace broker_internal;  // NOLINT(google-build-using-namespace): its own insides

Status Broker::RecoverBlobs(Log& log, const std::string& dir, std::vector<std::string>* notes) {
  // Retention removes payload files (their names, at once) from the oldest
  // on, while their records stay until their whole segment goes: missing
  // files of the oldest large messages are that (those messages are dropped
  // again here). A missing or short file after a present one is not: the
  // log is refused.
  std::set<std::string> named;
  int64_t expired_before = log.base;
  for (size_t i = 0; i < log.msgs.size(); ++i) {
    const auto& m = log.msgs[i];
    if (m->chunked_size() == 0) continue;
    const std::string& file = m->chunked_file();
    const std::string path = dir + "/" + file;
    if (file.empty() || file.find('/') != std::string::npos || file.front() == '.') {
      return DataLoss(fmt::format(
          "bus log: {} offset {}: a large message naming no usable payload file (\"{}\")", dir,
          m->offset(), Printable(file)));
    }
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0 && errno == ENOENT && named.empty()) {
      expired_before = m->offset() + 1;
      continue;
    }
    struct stat st {};
    if (fd < 0 || ::fstat(fd, &st) != 0 || st.st_size != m->chunked_size()) {
      const std::string why =
          fd < 0 ? std::string(std::strerror(errno))
                 : fmt::format("{} of its {} bytes", st.st_size, m->chunked_size());
      if (fd >= 0) ::close(fd);
      return DataLoss(
          fmt::format("bus log: {}: the payload file of offset {}: {}", path, m->offset(), why));
    }
    auto blob = std::make_shared<Blob>(path, fd, m->chunked_size(), open_payload_files_);
    blob->stored.store(true);
    log.blobs.emplace(m->offset(), std::move(blob));
    named.insert(file);
  }
  while (!log.msgs.empty() && log.msgs.front()->offset() < expired_before) {
    log.bytes -= PayloadBytes(*log.msgs.front());
    log.msgs.pop_front();
    ++log.base;
  }
  // A large publish the crash cut short left its file and no record.
  int removed = 0;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    if (entry.path().extension() == ".blob" && named.count(entry.path().filename().string()) == 0) {
      std::filesystem::remove(entry.path(), ec);
      ++removed;
    }
  }
  if (removed > 0) {
    notes->push_back(fmt::format(
        "bus log: removed {} payload file(s) in {} that no retained message names (unfinished "
        "publishes, or retention's)",
        removed, dir));
  }
  return Status::Ok();
}

std::string Broker::BlobDir(const Log& log) const {
  return durable() ? BusLogTopicsDir(options_.log_dir) + "/" + EscapeLogName(log.name) : spill_dir_;
}

void Broker::DropBlob(Log& log, int64_t offset) {
  auto it = log.blobs.find(offset);
  if (it == log.blobs.end()) return;
  it->second->Unlink();  // the name now; the bytes go with the last reader's descriptor
  log.blobs.erase(it);
}

Status Broker::CheckLargeHead(const std::string& agent, const v1::PublishChunk& first) {
  const std::string what =
      "large publish to topic \"" + first.head().topic().substr(0, 64) + "\" by agent " + agent;
  AGENTRT_RETURN_IF_ERROR(
      CheckValid(ValidatePublishHead(first, options_.limits), [&] { return what; }));
  return CheckPublish(agent, first.head());
}

bool Broker::AnsweredAsDuplicate(const std::string& agent, const v1::PublishRequest& head,
                                 v1::PublishResponse* resp) {
  if (head.publisher_id() == 0) return false;
  std::shared_ptr<PublisherWindow> pub = publishers_.Get(agent, head.publisher_id());
  std::lock_guard<std::mutex> lock(pub->mu);
  int64_t first_offset = -1;
  if (!pub->Seen(head.sequence(), &first_offset)) return false;
  duplicates_.fetch_add(1, std::memory_order_relaxed);
  resp->set_offset(first_offset);
  resp->set_duplicate(true);
  return true;
}

Result<std::shared_ptr<Broker::Upload>> Broker::PrepareLarge(const std::string& agent,
                                                             v1::PublishChunk& first,
                                                             v1::PublishResponse* resp) {
  AGENTRT_RETURN_IF_ERROR(CheckLargeHead(agent, first));
  v1::PublishRequest& head = *first.mutable_head();
  // A retry of a stored message is answered before its bytes are read.
  if (AnsweredAsDuplicate(agent, head, resp)) return std::shared_ptr<Upload>();
  auto up = std::make_shared<Upload>();
  up->log = GetLog(head.topic(), /*create=*/true);
  up->msg = ToMessage(agent, head);
  up->expected_crc = first.crc32c();
  up->msg.set_chunked_size(first.size());
  up->msg.set_chunked_crc32c(first.crc32c());
  return up;
}

Result<std::shared_ptr<Broker::Upload>> Broker::BeginLarge(const std::string& agent,
                                                           v1::PublishChunk& first,
                                                           v1::PublishResponse* resp) {
  AGENTRT_ASSIGN_OR_RETURN(std::shared_ptr<Upload> up, PrepareLarge(agent, first, resp));
  if (up == nullptr) return up;
  const std::string what =
      "large publish to topic \"" + up->log->name.substr(0, 64) + "\" by agent " + agent;
  const std::string dir = BlobDir(*up->log);
  if (dir.empty())
    return FailedPrecondition(
        what + ": the broker has no folder for large payloads (Recover() was not called)");
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  const std::string name = RandomHex64() + ".blob";
  const std::string path = dir + "/" + name;
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) return NotStored(ErrnoStatus(errno, "bus: cannot create " + path)).WithContext(what);
  if (durable()) up->msg.set_chunked_file(name);
  up->blob = std::make_shared<Blob>(path, fd, first.size(), open_payload_files_);
  AGENTRT_RETURN_IF_ERROR(WriteLarge(*up, first.data()).WithContext(what));
  return up;
}

namespace {

// "<agent>.<16 hex digits>.part": what a publisher may name its spool file.
bool IsSpoolName(const std::string& name, const std::string& agent) {
  const std::string prefix = agent + ".";
  constexpr std::string_view kSuffix = ".part";
  if (name.size() != prefix.size() + 16 + kSuffix.size()) return false;
  if (name.compare(0, prefix.size(), prefix) != 0) return false;
  if (name.compare(name.size() - kSuffix.size(), kSuffix.size(), kSuffix) != 0) return false;
  return std::all_of(name.begin() + static_cast<std::ptrdiff_t>(prefix.size()),
                     name.end() - static_cast<std::ptrdiff_t>(kSuffix.size()),
                     [](char c) { return std::isxdigit(static_cast<unsigned char>(c)) != 0; });
}

}  // namespace

int Broker::ReapSpool() {
  if (spool_dir_.empty()) return 0;
  const int64_t now_ticks = std::chrono::steady_clock::now().time_since_epoch().count();
  const int64_t every =
      std::chrono::duration_cast<std::chrono::steady_clock::duration>(options_.spool_reap_every)
          .count();
  int64_t last = spool_reaped_at_.load();
  if (last != 0 && now_ticks - last < every) return 0;
  if (!spool_reaped_at_.compare_exchange_strong(last, now_ticks))
    return 0;  // another adoption reaps
  int reaped = 0;
  std::error_code ec;
  const auto now = std::filesystem::file_time_type::clock::now();
  for (const auto& e : std::filesystem::directory_iterator(spool_dir_, ec)) {
    if (e.path().extension() != ".part") continue;
    const auto changed = std::filesystem::last_write_time(e.path(), ec);
    if (ec || now - changed < kSpoolStaleAfter) continue;
    // Regular files only, opened without blocking: a FIFO named like a spool
    // file must not hang the broker.
    if (!e.is_regular_file(ec) || e.is_symlink(ec)) continue;
    const int fd = ::open(e.path().c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) continue;
    if (::flock(fd, LOCK_EX | LOCK_NB) == 0) {  // no live writer holds it
      ::unlink(e.path().c_str());
      ++reaped;
    }
    ::close(fd);
  }
  return reaped;
}

Result<int> Broker::OpenSpooled(const std::string& agent, const std::string& name, int64_t size,
                                const std::string& what) {
  if (spool_dir_.empty()) return FailedPrecondition(what + ": this broker has no spool");
  if (!IsSpoolName(name, agent)) {
    CountInvalid();
    return InvalidArgument(
        fmt::format("{}: \"{}\" is not a spool file of agent {} (<agent>.<16 "
                    "hex digits>.part)",
                    what, Printable(name.substr(0, 64)), agent));
  }
  const std::string spooled = spool_dir_ + "/" + name;
  const int fd = ::open(spooled.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    return FailedPrecondition(fmt::format("{}: cannot open {}: {} (a publisher on another node?)",
                                          what, spooled, std::strerror(errno)));
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size != size) {
    ::close(fd);
    ::unlink(spooled.c_str());
    CountInvalid();
    return InvalidArgument(fmt::format("{}: {} is not a file of the {} bytes announced; not stored",
                                       what, spooled, size));
  }
  if (st.st_nlink != 1 || st.st_uid != ::geteuid()) {
    // Not a file this publish wrote for the spool alone: the publisher sends its bytes instead.
    ::close(fd);
    return FailedPrecondition(fmt::format(
        "{}: {} has {} links and belongs to uid {}; the broker adopts only a file of its own "
        "user with one name",
        what, spooled, st.st_nlink, st.st_uid));
  }
  return fd;
}

void Broker::ReapSpoolAndSay() {
  if (const int reaped = ReapSpool(); reaped > 0) {
    std::fprintf(stderr, "agentrt: bus: removed %d spool file(s) of publishers that are gone\n",
                 reaped);
  }
}

Status Broker::AdoptLarge(const std::string& agent, v1::AdoptRequest& req,
                          v1::PublishResponse* resp) {
  ReapSpoolAndSay();
  v1::PublishChunk first;
  first.mutable_head()->Swap(req.mutable_head());
  first.set_size(req.size());
  first.set_crc32c(req.crc32c());
  AGENTRT_ASSIGN_OR_RETURN(std::shared_ptr<Upload> up, PrepareLarge(agent, first, resp));
  const std::string spooled = spool_dir_ + "/" + req.name();
  if (up == nullptr) {  // a duplicate: its bytes are stored already
    if (!spool_dir_.empty() && IsSpoolName(req.name(), agent)) ::unlink(spooled.c_str());
    return Status::Ok();
  }
  const std::string what = "large publish to topic \"" + up->log->name.substr(0, 64) +
                           "\" by agent " + agent + " from the spool";
  AGENTRT_ASSIGN_OR_RETURN(const int fd, OpenSpooled(agent, req.name(), req.size(), what));
  const std::string dir = BlobDir(*up->log);
  const std::string name = RandomHex64() + ".blob";
  const std::string path = dir + "/" + name;
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (::rename(spooled.c_str(), path.c_str()) != 0) {
    const int err = errno;
    ::close(fd);  // the file stays the publisher's: it sends the bytes with PublishLarge
    return FailedPrecondition(
        fmt::format("{}: cannot move {} to {}: {}", what, spooled, path, std::strerror(err)));
  }
  // From here the payload store owns the file: it goes with the Blob unless stored.
  up->blob = std::make_shared<Blob>(path, fd, req.size(), open_payload_files_);
  if (durable()) up->msg.set_chunked_file(name);
  AGENTRT_ASSIGN_OR_RETURN(up->crc, FileCrc32c(fd, req.size(), path));
  up->written = req.size();
  up->adopted = true;
  return FinishLarge(*up, resp);
}

Status Broker::AdoptSpooledEntry(const std::string& agent, v1::PublishRequest& entry,
                                 v1::PublishResponse* resp) {
  if (Status s = ValidateBatchEntry(entry, options_.limits); !s.ok()) {
    CountInvalid();
    return s.WithContext("spooled publish to topic \"" + entry.topic().substr(0, 64) +
                         "\" by agent " + agent);
  }
  if (durable() || open_payload_files_->load() >= max_open_payload_files_) {
    // A durable log writes its records in runs and fsyncs them together (a
    // payload file would need an fsync of its own per message): the bytes
    // are read from the spool file here and stored inline, as Publish does.
    // So does a memory broker whose payload files hold
    // max_open_payload_files descriptors already.
    const std::string what =
        "spooled publish to topic \"" + entry.topic().substr(0, 64) + "\" by agent " + agent;
    const std::string name = std::move(*entry.mutable_spooled_name());
    const int64_t size = entry.spooled_size();
    const uint32_t crc = entry.spooled_crc32c();
    entry.clear_spooled_name();
    entry.clear_spooled_size();
    entry.clear_spooled_crc32c();
    if (size > kMaxInlineBytes) {
      CountInvalid();
      return InvalidArgument(fmt::format("{}: {} bytes; a batch entry carries at most {}", what,
                                         size, kMaxInlineBytes));
    }
    AGENTRT_RETURN_IF_ERROR(CheckPublish(agent, entry));
    ReapSpoolAndSay();
    // A resend of a stored entry is answered before its file is looked at
    // (a durable broker removed the file it read).
    if (AnsweredAsDuplicate(agent, entry, resp)) {
      if (!spool_dir_.empty() && IsSpoolName(name, agent))
        ::unlink((spool_dir_ + "/" + name).c_str());
      return Status::Ok();
    }
    AGENTRT_ASSIGN_OR_RETURN(const int fd, OpenSpooled(agent, name, size, what));
    std::string* payload = entry.mutable_payload();
    payload->resize(static_cast<size_t>(size));
    const ssize_t got = ReadAllAt(fd, payload->data(), payload->size(), 0);
    ::close(fd);
    ::unlink((spool_dir_ + "/" + name).c_str());
    if (got != size || Crc32c(payload->data(), payload->size()) != crc) {
      CountInvalid();
      return DataLoss(fmt::format(
          "{}: the spool file {} does not hold the {} bytes of CRC32C {:08x} announced; not stored",
          what, name, size, crc));
    }
    AGENTRT_RETURN_IF_ERROR(Publish(agent, entry, resp));
    if (!resp->duplicate()) large_adopted_.fetch_add(1);
    return Status::Ok();
  }
  v1::AdoptRequest req;
  req.set_size(entry.spooled_size());
  req.set_crc32c(entry.spooled_crc32c());
  req.mutable_name()->swap(*entry.mutable_spooled_name());
  entry.clear_spooled_size();
  entry.clear_spooled_crc32c();
  req.mutable_head()->Swap(&entry);
  return AdoptLarge(agent, req, resp);
}

Status Broker::SpoolInfo(const std::string& agent, const v1::SpoolRequest& req,
                         v1::SpoolResponse* resp) {
  if (!req.topic().empty()) {
    v1::PublishChunk first;
    first.mutable_head()->set_topic(req.topic());
    first.set_size(req.size());
    AGENTRT_RETURN_IF_ERROR(CheckLargeHead(agent, first));
  }
  resp->set_dir(spool_dir_);
  resp->set_id(spool_id_);
  static const std::string boot_id = BootId();
  resp->set_boot_id(boot_id);
  resp->set_adopts_spooled_entries(true);
  return Status::Ok();
}

Status Broker::MakeSpool() {
  spool_dir_ =
      options_.log_dir.empty() ? spill_dir_ + "/incoming" : BusLogSpoolDir(options_.log_dir);
  std::error_code ec;
  std::filesystem::remove_all(spool_dir_, ec);
  if (!std::filesystem::create_directories(spool_dir_, ec) || ec)
    return Internal("bus: cannot create the spool " + spool_dir_ + ": " + ec.message());
  ::chmod(spool_dir_.c_str(), 0700);
  const auto abs = std::filesystem::absolute(spool_dir_, ec);
  if (!ec) spool_dir_ = abs.lexically_normal().string();
  spool_id_ = RandomHex64();
  return WriteFileAtomic(spool_dir_ + "/" + kBusSpoolIdFile, spool_id_ + "\n");
}

Status Broker::WriteLarge(Upload& up, std::string_view data) {
  if (up.written + static_cast<int64_t>(data.size()) > up.blob->size) {
    CountInvalid();
    return InvalidArgument(fmt::format(
        "large publish to topic \"{}\": more bytes than the {} its first chunk announced",
        up.log->name, up.blob->size));
  }
  // Written in order by its one upload, at the file's position.
  if (Status s = WriteAll(up.blob->fd, data.data(), data.size(),
                          "bus: cannot write a large payload of topic ", up.log->name);
      !s.ok())
    return NotStored(s);
  up.crc = Crc32c(data.data(), data.size(), up.crc);
  up.written += static_cast<int64_t>(data.size());
  return Status::Ok();
}

Status Broker::FinishLarge(Upload& up, v1::PublishResponse* resp) {
  const std::string what = "large publish to topic \"" + up.log->name + "\"";
  if (up.written != up.blob->size) {
    CountInvalid();
    return InvalidArgument(fmt::format("{}: the stream ended after {} of its {} bytes; not stored",
                                       what, up.written, up.blob->size));
  }
  if (up.crc != up.expected_crc) {
    CountInvalid();
    return DataLoss(fmt::format(
        "{}: the {} bytes received have CRC32C {:08x}, not the {:08x} announced; not stored", what,
        up.written, up.crc, up.expected_crc));
  }
  if (durable()) {
    // The record may name the file only once the file is whole on disk.
    if (::fdatasync(up.blob->fd) != 0)
      return NotStored(ErrnoStatus(errno, "bus: cannot fsync " + up.blob->path));
    if (Status synced = FsyncDir(BlobDir(*up.log)); !synced.ok())
      return NotStored(synced.WithContext("bus: the payload file " + up.blob->path));
  }
  Stored st = Append(up.log, std::move(up.msg), up.blob);
  AGENTRT_RETURN_IF_ERROR(st.status.WithContext(what));
  if (!st.duplicate) (up.adopted ? large_adopted_ : large_streamed_).fetch_add(1);
  resp->set_offset(st.offset);
  resp->set_duplicate(st.duplicate);
  return Status::Ok();
}

Status Broker::ReadChunk(const Reader& reader, int64_t pos, size_t max, std::string* out) const {
  const Blob& blob = *reader.chunked;
  const size_t n = static_cast<size_t>(
      std::max<int64_t>(0, std::min<int64_t>(static_cast<int64_t>(max), blob.size - pos)));
  out->resize(n);
  const ssize_t got = ReadAllAt(blob.fd, out->data(), n, static_cast<off_t>(pos));
  if (got != static_cast<ssize_t>(n)) {
    return DataLoss(fmt::format("bus: the payload file of offset {} of {} ended at byte {} of {}",
                                reader.next_offset - 1, reader.log->name,
                                pos + std::max<int64_t>(got, 0), blob.size));
  }
  return Status::Ok();
}

std::string Broker::ChunkedPath(const Reader& reader) const {
  std::error_code ec;
  const auto abs = std::filesystem::absolute(reader.chunked->path, ec);
  return ec ? reader.chunked->path : abs.string();
}

}  // namespace agentrt
