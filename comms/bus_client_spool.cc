// BusClient's large publishes through the broker's spool (bus.proto Spool
// and AdoptLarge): a process that sees the spool folder writes the payload
// into a file there once and the broker takes the file over, so no payload
// byte crosses the socket. PublishLargeFrom lets the caller write the
// payload in place, whichever way it travels.
#include <fcntl.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

#include "common/random.h"
#include "comms/bus_client_internal.h"
#include "plan/run_dir.h"

namespace agentrt {

using namespace bus_client_internal;  // NOLINT(google-build-using-namespace): its own insides

namespace {

// Appends to a file, keeping the CRC32C of what went in.
class FileWriter final : public LargePayloadWriter {
 public:
  FileWriter(int fd, std::string path) : fd_(fd), path_(std::move(path)) {}
  Status Append(const void* data, size_t size) override {
    AGENTRT_RETURN_IF_ERROR(WriteAll(fd_, data, size, "bus: cannot write the spool file ", path_));
    crc_ = Crc32c(data, size, crc_);
    written_ += size;
    return Status::Ok();
  }
  size_t written() const { return written_; }
  uint32_t crc() const { return crc_; }

 private:
  int fd_;
  std::string path_;
  size_t written_ = 0;
  uint32_t crc_ = 0;
};

// Gathers a payload in memory (no spool to write to).
class MemoryWriter final : public LargePayloadWriter {
 public:
  explicit MemoryWriter(size_t size) { bytes_.reserve(size); }
  Status Append(const void* data, size_t size) override {
    bytes_.append(static_cast<const char*>(data), size);
    return Status::Ok();
  }
  std::string& bytes() { return bytes_; }

 private:
  std::string bytes_;
};

// "<agent>.<16 hex digits>.part", the name the broker adopts (IsSpoolName).
std::string SpoolName(const std::string& agent) { return agent + "." + RandomHex64() + ".part"; }

}  // namespace

bus_client_internal::SpooledPayload::~SpooledPayload() {
  if (fd >= 0) {
    ::unlink(path.c_str());  // no such name any more once the broker took the file over
    ::close(fd);
  }
  if (room != nullptr) room->Give(charged);  // once its descriptor is closed
}

bool BusClient::Impl::SpoolAskDue() {
  const bool first = !spool_asked.exchange(true);
  std::lock_guard<std::mutex> lock(spool_mu);
  if (first) return true;
  if (spool_state != 0 || !spool_ask_after || DeadlineClock::now() < *spool_ask_after) return false;
  spool_ask_after.reset();  // asked once now; a new refusal waits again
  return true;
}

std::optional<bool> BusClient::Impl::OnBrokerNode(bool again) {
  if (!options.write_local_files) return false;
  uint64_t answers = 0;
  {
    std::lock_guard<std::mutex> lock(spool_mu);
    if (spool_state < 0) return false;
    if (spool_state > 0 && !again) return true;
    // Asked again, a spool proven before stays in use until the answer:
    // async publishes meanwhile are spooled, not sent inline. One written
    // into a spool the broker has since made anew is refused and resent
    // inline (its file is held open), and the answer proves the new one.
    answers = spool_answers;
  }
  (void)SpoolFor("", 0);  // an empty topic: no publish to check
  std::lock_guard<std::mutex> lock(spool_mu);
  // No answer (the broker unreachable): proven no more, asked at the next use.
  if (again && spool_answers == answers && spool_state > 0) spool_state = 0;
  if (spool_state == 0) return std::nullopt;
  return spool_state > 0;
}

std::unique_ptr<bus_client_internal::SpooledPayload> BusClient::Impl::SpoolPayload(
    std::string_view payload, std::chrono::milliseconds wait) {
  std::string dir, id;
  {
    std::lock_guard<std::mutex> lock(spool_mu);
    if (spool_state <= 0 || !spool_adopts_entries) return nullptr;
    dir = spool_dir;
    id = spool_id;
  }
  const int64_t charge =
      std::max(static_cast<int64_t>(payload.size()), kSpoolAsyncMaxBytes / kSpoolAsyncMaxFiles);
  auto held = std::make_unique<SpooledPayload>();
  if (!spool_room.Take(charge, DeadlineClock::now() + wait)) {
    return nullptr;  // the files not answered in time: inline
  }
  held->room = &spool_room;
  held->charged = charge;
  held->size = payload.size();
  held->spool_id = std::move(id);
  std::optional<SpoolFile> file = CreateSpoolFile(dir);
  if (!file) return nullptr;
  held->fd = file->fd;
  held->path = std::move(file->path);
  held->name = std::move(file->name);
  if (!WriteAll(held->fd, payload.data(), payload.size(), "bus: cannot write the spool file ",
                held->path)
           .ok()) {
    return nullptr;  // a full folder: inline (the holder removes the file)
  }
  held->crc = Crc32c(payload.data(), payload.size());
  return held;
}

Result<std::string> BusClient::Impl::SpoolFor(std::string_view topic, size_t size) {
  if (!options.write_local_files) return std::string();
  {
    std::lock_guard<std::mutex> lock(spool_mu);
    if (spool_state < 0 || SpoolHeldOffLocked()) return std::string();
  }
  v1::SpoolRequest req;
  req.set_topic(std::string(topic));
  req.set_size(static_cast<int64_t>(size));
  v1::SpoolResponse resp;
  grpc::ClientContext ctx;
  Prepare(&ctx, DeadlineClock::now() + options.call_timeout);
  const grpc::Status s = stub->Spool(&ctx, req, &resp);
  if (s.ok() || s.error_code() == grpc::StatusCode::UNIMPLEMENTED) {
    std::lock_guard<std::mutex> lock(spool_mu);
    ++spool_answers;
  }
  if (!s.ok()) {
    switch (s.error_code()) {
      case grpc::StatusCode::UNIMPLEMENTED: {  // a broker without a spool
        std::lock_guard<std::mutex> lock(spool_mu);
        spool_state = -1;
        return std::string();
      }
      case grpc::StatusCode::UNAVAILABLE:
      case grpc::StatusCode::DEADLINE_EXCEEDED:
        return std::string();  // the chunked publish retries
      default:                 // the broker refuses the publish itself (ACL, size)
        return FromGrpc(s, "publish of " + std::to_string(size) + " bytes to topic \"" +
                               std::string(topic) + "\" (bus " + address + ", agent " + cred.agent +
                               ")");
    }
  }
  std::lock_guard<std::mutex> lock(spool_mu);
  spool_adopts_entries = resp.adopts_spooled_entries();
  // A refusal that came while this call was out stands (its wait is not cut short).
  if (spool_state < 0 || SpoolHeldOffLocked()) return std::string();
  if (spool_state == 1 && spool_dir == resp.dir() && spool_id == resp.id()) return spool_dir;
  // Only on the broker's node (another node's bytes would reach the broker
  // only through a shared file system's caches), and only if the folder
  // holds the id the broker gave.
  Result<std::string> id = ReadWholeFile(resp.dir() + "/" + kBusSpoolIdFile, 256);
  if (resp.dir().empty() || resp.boot_id().empty() || resp.boot_id() != BootId() || !id.ok() ||
      *id != resp.id() + "\n") {
    spool_state = -1;
    return std::string();
  }
  spool_state = 1;
  spool_dir = resp.dir();
  spool_id = resp.id();
  return spool_dir;
}

std::optional<SpoolFile> BusClient::Impl::CreateSpoolFile(const std::string& dir) {
  SpoolFile f;
  f.name = SpoolName(cred.agent);
  f.path = dir + "/" + f.name;
  f.fd = ::open(f.path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (f.fd < 0) {
    // A folder this process may never write (another user's, read-only):
    // chunks from now on. Anything else (a full disk, no descriptor left,
    // the broker restarted and made its spool anew) may pass: this publish
    // goes another way, the next one asks for the spool again.
    const int err = errno;
    std::lock_guard<std::mutex> lock(spool_mu);
    spool_state = (err == EACCES || err == EPERM || err == EROFS) ? -1 : 0;
    return std::nullopt;
  }
  // Held until the adoption is answered: the broker reaps only files no
  // live publisher holds (Broker::ReapSpool).
  ::flock(f.fd, LOCK_EX);
  return f;
}

std::optional<Result<PublishAck>> BusClient::Impl::PublishSpooled(
    std::string_view topic, size_t size, const std::function<Status(LargePayloadWriter&)>& fill,
    const PublishOptions& opts, uint64_t seq) {
  Result<std::string> dir = SpoolFor(topic, size);
  if (!dir.ok()) return Result<PublishAck>(dir.status());
  if (dir->empty()) return std::nullopt;
  std::optional<SpoolFile> file = CreateSpoolFile(*dir);
  if (!file) return std::nullopt;
  FileWriter writer(file->fd, file->path);
  Status filled = fill(writer);
  if (filled.ok() && writer.written() != size) {
    filled =
        InvalidArgument("publish of " + std::to_string(size) + " bytes to topic \"" +
                        std::string(topic) + "\" through the spool: the payload writer wrote " +
                        std::to_string(writer.written()) + " bytes, not " + std::to_string(size));
  }
  if (!filled.ok()) {
    ::unlink(file->path.c_str());
    ::close(file->fd);
    return Result<PublishAck>(filled);
  }
  return AdoptSpooled(topic, *file, size, writer.crc(), opts, seq);
}

Result<PublishAck> BusClient::Impl::AdoptSpooled(std::string_view topic, const SpoolFile& file,
                                                 size_t size, uint32_t crc,
                                                 const PublishOptions& opts, uint64_t seq) {
  const std::string what = "publish of " + std::to_string(size) + " bytes to topic \"" +
                           std::string(topic) + "\" through the spool";
  v1::AdoptRequest req;
  v1::PublishRequest* head = req.mutable_head();
  head->set_topic(std::string(topic));
  head->set_content_type(opts.content_type);
  head->set_publisher_id(publisher_id);
  head->set_sequence(seq);
  req.set_size(static_cast<int64_t>(size));
  req.set_crc32c(crc);
  req.set_name(file.name);
  v1::PublishResponse resp;
  // One attempt with the whole deadline (the broker reads the file once and,
  // durable, fsyncs it): call_timeout plus a second per 64 MiB unless told.
  grpc::ClientContext ctx;
  Prepare(&ctx, DeadlineClock::now() +
                    opts.timeout.value_or(options.call_timeout +
                                          std::chrono::seconds(static_cast<int64_t>(size >> 26))));
  const grpc::Status adopted = stub->AdoptLarge(&ctx, req, &resp);
  if (adopted.ok()) {
    ::close(file.fd);
    return PublishAck{resp.offset(), resp.duplicate(), seq};
  }
  const grpc::StatusCode code = adopted.error_code();
  // A clear refusal ends the publish, and so does the end of its time: the
  // broker may still be storing the version (a slow disk's fsync), and a
  // resend would only write the bytes a second time to be dropped as a
  // duplicate. Any other outcome may have stored the version too, and a
  // resend with the same sequence is answered as a duplicate.
  if (code == grpc::StatusCode::INVALID_ARGUMENT || code == grpc::StatusCode::PERMISSION_DENIED ||
      code == grpc::StatusCode::UNAUTHENTICATED || code == grpc::StatusCode::DATA_LOSS ||
      code == grpc::StatusCode::RESOURCE_EXHAUSTED || code == grpc::StatusCode::DEADLINE_EXCEEDED) {
    ::unlink(file.path.c_str());
    ::close(file.fd);
    return FromGrpc(adopted, what);
  }
  // The broker could not take the file (FAILED_PRECONDITION: this client
  // sends chunks for options.spool_retry_after), or the answer was lost:
  // send the bytes from our own descriptor in chunks, with the same
  // sequence, so that a version the broker did store is answered as a
  // duplicate, not stored twice.
  if (code == grpc::StatusCode::FAILED_PRECONDITION) {
    std::lock_guard<std::mutex> lock(spool_mu);
    RefuseSpoolLocked();
  }
  ::unlink(file.path.c_str());  // if still ours: an adopted file was renamed away
  void* map = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, file.fd, 0);
  ::close(file.fd);
  if (map == MAP_FAILED) return FromGrpc(adopted, what);
  Result<PublishAck> sent =
      PublishChunked(topic, std::string_view(static_cast<const char*>(map), size), opts, seq);
  ::munmap(map, size);
  return sent;
}

Result<PublishAck> BusClient::PublishLargeFrom(
    std::string_view topic, size_t size, const std::function<Status(LargePayloadWriter&)>& fill,
    const PublishOptions& opts) {
  const bool large = static_cast<int64_t>(size) > kMaxInlineBytes;
  const uint64_t seq = impl_->SequenceFor(opts);
  if (large) {
    if (auto spooled = impl_->PublishSpooled(topic, size, fill, opts, seq)) return *spooled;
  }
  MemoryWriter mem(size);
  AGENTRT_RETURN_IF_ERROR(fill(mem));
  if (mem.bytes().size() != size)
    return InvalidArgument("publish to topic \"" + std::string(topic) +
                           "\": the payload writer wrote " + std::to_string(mem.bytes().size()) +
                           " bytes, not " + std::to_string(size));
  if (large) return impl_->PublishChunked(topic, mem.bytes(), opts, seq);
  PublishOptions sequenced = opts;
  sequenced.sequence = seq;
  return Publish(topic, mem.bytes(), sequenced);
}

LargePayloadSlot::~LargePayloadSlot() {
  Unmap();
  if (fd_ >= 0) {
    ::unlink(path_.c_str());
    ::close(fd_);
  }
}

void LargePayloadSlot::Unmap() {
  if (data_ != nullptr) ::munmap(data_, size_);
  data_ = nullptr;
}

Result<std::unique_ptr<LargePayloadSlot>> BusClient::ReserveLarge(std::string_view topic,
                                                                  size_t size) {
  if (size == 0) {
    return InvalidArgument("bus: a slot for a publish to topic \"" + std::string(topic) +
                           "\" needs a size");
  }
  std::unique_ptr<LargePayloadSlot> slot(new LargePayloadSlot());
  slot->size_ = size;
  if (static_cast<int64_t>(size) > kMaxInlineBytes) {
    AGENTRT_ASSIGN_OR_RETURN(const std::string dir, impl_->SpoolFor(topic, size));
    std::optional<SpoolFile> file = dir.empty() ? std::nullopt : impl_->CreateSpoolFile(dir);
    if (file) {
      // Its blocks allocated first: a full disk is this fallback, not a
      // SIGBUS in the caller's copy into the mapping.
      void* map = ::posix_fallocate(file->fd, 0, static_cast<off_t>(size)) == 0
                      ? ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, file->fd, 0)
                      : MAP_FAILED;
      if (map != MAP_FAILED) {
        ::madvise(map, size, MADV_DONTFORK);  // a forked child (a data loader) never holds it
        slot->data_ = static_cast<char*>(map);
        slot->fd_ = file->fd;
        slot->path_ = std::move(file->path);
        slot->name_ = std::move(file->name);
        // A write to every page now, so that the caller's copy faults none.
        const auto page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
        for (size_t at = 0; at < size; at += page) reinterpret_cast<volatile char*>(map)[at] = 0;
        return slot;
      }
      ::unlink(file->path.c_str());
      ::close(file->fd);
    }
  }
  // The client's own memory, faulted in by the kernel.
  void* map = ::mmap(nullptr, size, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
  if (map == MAP_FAILED) {
    return ErrnoStatus(errno, "bus: cannot allocate " + std::to_string(size) +
                                  " bytes for a publish to topic \"" + std::string(topic) + "\"");
  }
  ::madvise(map, size, MADV_DONTFORK);
  slot->data_ = static_cast<char*>(map);
  return slot;
}

Result<PublishAck> BusClient::PublishLargeSlot(std::string_view topic,
                                               std::unique_ptr<LargePayloadSlot> slot,
                                               const PublishOptions& opts) {
  if (slot == nullptr) {
    return InvalidArgument("bus: a publish to topic \"" + std::string(topic) + "\" without a slot");
  }
  const uint64_t seq = impl_->SequenceFor(opts);
  const size_t size = slot->size_;
  const std::string_view payload(slot->data_, size);
  struct stat st {};
  if (slot->spooled() && ::fstat(slot->fd_, &st) == 0 && st.st_nlink == 0) {
    // The broker made its spool anew (a restart) since the slot was made:
    // the bytes go in chunks, and the next publish asks for the spool again.
    {
      std::lock_guard<std::mutex> lock(impl_->spool_mu);
      impl_->spool_state = 0;
    }
    return impl_->PublishChunked(topic, payload, opts, seq);
  }
  if (slot->spooled()) {
    const uint32_t crc = Crc32c(slot->data_, size);
    slot->Unmap();  // nothing of ours writes to it once the broker may read it
    const SpoolFile file{slot->fd_, slot->path_, slot->name_};
    slot->fd_ = -1;  // AdoptSpooled closes it (and removes it unless adopted)
    return impl_->AdoptSpooled(topic, file, size, crc, opts, seq);
  }
  if (static_cast<int64_t>(size) > kMaxInlineBytes)
    return impl_->PublishChunked(topic, payload, opts, seq);
  PublishOptions sequenced = opts;
  sequenced.sequence = seq;
  return Publish(topic, payload, sequenced);
}

}  // namespace agentrt
