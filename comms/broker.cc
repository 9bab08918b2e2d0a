#include "comms/broker.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <random>
#include <set>

#include "common/crc32c.h"
#include "common/file_util.h"
#include "common/random.h"
#include "fmt/format.h"
#include "plan/run_dir.h"

namespace agentrt {

namespace v1 = bus::v1;

std::string InboxName(std::string_view agent) { return "@inbox/" + std::string(agent); }

namespace {
// A log's retained messages: a deque that keeps its storage (a power-of-two
// ring growing by doubling), so a log at its retention bound appends and
// expires without allocating (std::deque frees and allocates a block every
// few dozen messages).
template <typename T>
class Ring {
 public:
  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  T& operator[](size_t i) { return slots_[(head_ + i) & (slots_.size() - 1)]; }
  const T& operator[](size_t i) const { return slots_[(head_ + i) & (slots_.size() - 1)]; }
  T& front() { return (*this)[0]; }
  T& back() { return (*this)[size_ - 1]; }
  void push_back(T v) {
    if (size_ == slots_.size()) Grow();
    (*this)[size_++] = std::move(v);
  }
  // Moves the oldest out (its slot is left empty).
  T take_front() {
    T v = std::move(front());
    front() = T();
    head_ = (head_ + 1) & (slots_.size() - 1);
    --size_;
    return v;
  }
  void pop_front() { (void)take_front(); }
  void pop_back() {
    back() = T();
    --size_;
  }

 private:
  void Grow() {
    std::vector<T> bigger(std::max<size_t>(16, slots_.size() * 2));
    for (size_t i = 0; i < size_; ++i) bigger[i] = std::move((*this)[i]);
    slots_.swap(bigger);
    head_ = 0;
  }
  std::vector<T> slots_;  // size a power of two
  size_t head_ = 0, size_ = 0;
};
}  // namespace

struct Broker::Log {
  explicit Log(std::string n) : name(std::move(n)) {}
  const std::string name;
  std::mutex mu;
  std::condition_variable cv;
  Ring<std::shared_ptr<const v1::Message>> msgs;  // offsets [base, base + msgs.size())
  // Messages retention dropped that no reader held any more, kept for reuse
  // with their strings' storage (so a log at its bound does not allocate).
  std::vector<std::shared_ptr<v1::Message>> spare;
  size_t spare_bytes = 0;  // payload capacity held by `spare`
  int64_t base = 0;
  int64_t bytes = 0;
  int waiters = 0;
  std::unique_ptr<SegmentLog> files;  // the durable log (opened at the first append)
  std::unordered_map<int64_t, std::shared_ptr<Blob>> blobs;  // offset -> large payload
};

struct Broker::Blob {
  Blob(std::string p, int f, int64_t s) : path(std::move(p)), fd(f), size(s) {}
  ~Blob() {
    if (fd >= 0) ::close(fd);
    if (!stored.load()) Unlink();
  }
  Blob(const Blob&) = delete;
  Blob& operator=(const Blob&) = delete;
  // Removes the file's name at once (retention, or a message not stored):
  // readers still sending it keep reading through `fd`. Names go in offset
  // order, so recovery can tell retention's doing from a lost file.
  void Unlink() {
    if (!unlinked.exchange(true)) ::unlink(path.c_str());
  }
  const std::string path;
  const int fd;  // open for reading (and writing while uploading)
  const int64_t size;
  std::atomic<bool> stored{false};  // false: an upload that did not become a message
  std::atomic<bool> unlinked{false};
};

struct Broker::Upload {
  std::shared_ptr<Log> log;
  v1::Message msg;  // every field but the payload
  std::shared_ptr<Blob> blob;
  uint32_t expected_crc = 0;
  uint32_t crc = 0;
  int64_t written = 0;
};

// The recent sequences of one (agent, publisher_id): a ring indexed by
// sequence, so a check is O(1) and memory is fixed.
struct Broker::PublisherState {
  static constexpr uint64_t kWindow = 16384;
  struct Slot {
    uint64_t sequence = 0;
    int64_t offset = -1;
  };
  std::mutex mu;
  std::vector<Slot> ring = std::vector<Slot>(kWindow);
  uint64_t highest = 0;

  bool Seen(uint64_t seq, int64_t* offset) const {
    if (highest >= kWindow && seq <= highest - kWindow) {
      *offset = -1;  // older than the window: a late retry, by contract a duplicate
      return true;
    }
    const Slot& s = ring[seq % kWindow];
    if (s.sequence != seq) return false;
    *offset = s.offset;
    return true;
  }
  void Record(uint64_t seq, int64_t offset) {
    ring[seq % kWindow] = Slot{seq, offset};
    highest = std::max(highest, seq);
  }
  // Un-records seq when its offset is at or past `end` (it was not stored after all).
  void Forget(uint64_t seq, int64_t end) {
    Slot& s = ring[seq % kWindow];
    if (s.sequence == seq && s.offset >= end) s = Slot{};
  }
};

struct Broker::PendingRequest {
  std::string to;
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  v1::RequestResponse response;
};

namespace {
constexpr size_t kMaxPublishers = 1024;
constexpr size_t kMaxSpare = 4096;  // per log: a batch's worth (BusLimits::max_batch_messages)
constexpr size_t kMaxSpareBytes = 1 << 20;  // per log: payload storage kept in spares
constexpr size_t kMaxCacheEntries = 4096;

// What a publish the bus could not store gets (the client retries UNAVAILABLE).
Status NotStored(const Status& why) {
  return Status(StatusCode::kUnavailable,
                why.message() + " (not stored; retry when the bus's disk has room)");
}

// The payload bytes a message stands for (a large one's are in its file).
int64_t PayloadBytes(const v1::Message& m) {
  return static_cast<int64_t>(m.payload().size()) + m.chunked_size();
}

int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}
}  // namespace

Broker::Broker(BrokerOptions options, BusAcl acl, std::string secret, uint64_t incarnation)
    : options_(options),
      acl_(std::move(acl)),
      secret_(std::move(secret)),
      incarnation_(incarnation),
      next_request_id_(std::random_device{}() | 1) {}

Broker::~Broker() {
  Shutdown();
  if (flusher_.joinable()) flusher_.join();
  // A clean exit leaves every record durable, whatever the mode.
  for (const auto& log : AllLogs()) {
    if (!log->files) continue;
    if (Status synced = log->files->Sync(); !synced.ok()) {
      std::fprintf(stderr, "agentrt: bus: at shutdown, the last records may not be durable: %s\n",
                   synced.ToString().c_str());
    }
  }
  if (!durable() && !spill_dir_.empty()) {
    // Memory mode: the payload files are of no use once the broker is gone.
    logs_.clear();  // closes every large payload's file first
    std::error_code ec;
    if (own_spill_dir_) {
      std::filesystem::remove_all(spill_dir_, ec);
    } else {
      for (const auto& e : std::filesystem::directory_iterator(spill_dir_, ec))
        std::filesystem::remove(e.path(), ec);
    }
  }
}

bool Broker::durable() const {
  return !options_.log_dir.empty() && options_.durability != BusDurability::kMemory;
}

std::vector<std::shared_ptr<Broker::Log>> Broker::AllLogs() const {
  std::shared_lock<std::shared_mutex> lock(logs_mu_);
  std::vector<std::shared_ptr<Log>> out;
  for (const auto& [name, log] : logs_) out.push_back(log);
  return out;
}

Status Broker::Recover(std::vector<std::string>* notes) {
  if (durable()) {
    const std::string root = BusLogTopicsDir(options_.log_dir);
    std::error_code ec;
    std::filesystem::create_directories(root, ec);
    if (ec) return Internal("bus log: cannot create " + root + ": " + ec.message());
    int64_t topics = 0, messages = 0, bytes = 0;
    for (const auto& entry : std::filesystem::directory_iterator(root, ec)) {
      if (!entry.is_directory()) continue;
      AGENTRT_ASSIGN_OR_RETURN(std::string name, UnescapeLogName(entry.path().filename().string()));
      SegmentLog::Recovered rec;
      auto files = SegmentLog::Open(entry.path().string(), options_.segment_bytes, &rec);
      if (!files.ok()) return files.status();
      if (!rec.torn.empty()) notes->push_back("bus log: torn tail cut: " + rec.torn);
      std::shared_ptr<Log> log = GetLog(name, /*create=*/true);
      std::lock_guard<std::mutex> lock(log->mu);
      log->files = std::move(files).value();
      log->base = rec.base;
      for (v1::Message& m : rec.messages) {
        if (m.publisher_id() != 0)
          GetPublisher(m.publisher(), m.publisher_id())->Record(m.sequence(), m.offset());
        log->bytes += PayloadBytes(m);
        log->msgs.push_back(std::make_shared<v1::Message>(std::move(m)));
      }
      AGENTRT_RETURN_IF_ERROR(RecoverBlobs(*log, entry.path().string(), notes));
      retained_bytes_.fetch_add(log->bytes, std::memory_order_relaxed);
      TrimLocked(*log);
      ++topics;
      messages += static_cast<int64_t>(log->msgs.size());
      bytes += log->bytes;
    }
    if (ec) return Internal("bus log: cannot list " + root + ": " + ec.message());
    if (topics > 0) {
      notes->push_back(
          fmt::format("bus log: {} topics and inboxes, {} messages ({} bytes) read "
                      "back from {}",
                      topics, messages, bytes, root));
    }
  }
  if (!durable()) {
    // Large payloads of a memory log: files in the run's bus folder (emptied
    // here: what a crashed broker left there is of no use), or in a folder of
    // our own under the temp folder, removed with the broker. (Not unlinked
    // at once: writes to unlinked files are several times slower on ext4.)
    std::error_code ec;
    if (!options_.log_dir.empty()) {
      spill_dir_ = BusLogSpillDir(options_.log_dir);
      std::filesystem::remove_all(spill_dir_, ec);
      std::filesystem::create_directories(spill_dir_, ec);
      if (ec) return Internal("bus: cannot create " + spill_dir_ + ": " + ec.message());
    } else {
      std::string tmpl =
          (std::filesystem::temp_directory_path(ec) / "agentrt-bus-spill.XXXXXX").string();
      if (::mkdtemp(tmpl.data()) == nullptr)
        return ErrnoStatus(errno, "bus: cannot create a folder for large payloads in " + tmpl);
      spill_dir_ = tmpl;
      own_spill_dir_ = true;
    }
  }
  // Every retained large message keeps its file open (its readers send from
  // it after retention removed its name).
  RaiseOpenFileLimit();
  if ((durable() && options_.durability == BusDurability::kBatch) || options_.retention_age_s > 0)
    flusher_ = std::thread([this] { FlushLoop(); });
  return Status::Ok();
}

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
    auto blob = std::make_shared<Blob>(path, fd, m->chunked_size());
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

void Broker::FlushLoop() {
  const auto interval = std::chrono::milliseconds(std::max(1, options_.fsync_interval_ms));
  std::unique_lock<std::mutex> lock(flush_mu_);
  while (!shutting_down()) {
    flush_cv_.wait_for(lock, interval, [&] { return shutting_down(); });
    lock.unlock();
    for (const auto& log : AllLogs()) {
      if (options_.retention_age_s > 0) {
        std::lock_guard<std::mutex> l(log->mu);
        TrimLocked(*log);
      }
      SegmentLog* files = nullptr;
      {
        std::lock_guard<std::mutex> l(log->mu);
        files = log->files.get();  // set once, never reset while the broker lives
      }
      if (files != nullptr && files->Dirty() && !files->Sync().ok())
        sync_errors_.fetch_add(1, std::memory_order_relaxed);
    }
    lock.lock();
  }
}

Status Broker::SyncForAck(Log& log) {
  if (options_.durability != BusDurability::kAlways) return Status::Ok();
  SegmentLog* files = nullptr;
  {
    std::lock_guard<std::mutex> l(log.mu);
    files = log.files.get();
  }
  return files == nullptr ? Status::Ok() : files->Sync();
}

Status Broker::Authenticate(std::string_view agent, std::string_view token) {
  auto refuse = [&](std::string m) {
    rejected_unauthenticated_.fetch_add(1, std::memory_order_relaxed);
    return Status(StatusCode::kUnauthenticated, std::move(m));
  };
  if (agent.empty()) return refuse("no agent name (metadata x-agentrt-agent) on the call");
  if (!ValidateAgentName(agent).ok()) return refuse("malformed agent name in x-agentrt-agent");
  if (!acl_.IsAgent(agent))
    return refuse("\"" + std::string(agent) + "\" is not an agent of this run");
  if (token.empty())
    return refuse("agent " + std::string(agent) + " presented no token (x-agentrt-token)");
  std::string expected;
  {
    std::lock_guard<std::mutex> lock(tokens_mu_);
    auto it = tokens_.find(std::string(agent));
    if (it != tokens_.end()) expected = it->second;
  }
  if (expected.empty()) {
    expected = DeriveAgentToken(secret_, agent);
    std::lock_guard<std::mutex> lock(tokens_mu_);
    if (tokens_.size() >= kMaxCacheEntries) tokens_.clear();
    tokens_.emplace(std::string(agent), expected);
  }
  if (!TokenMatches(token, expected)) {
    return refuse("wrong token for agent " + std::string(agent) +
                  " (is AGENTRT_TOKEN_FILE from this run? the run secret changes with every run)");
  }
  return Status::Ok();
}

Status Broker::Deny(std::string message) {
  rejected_permission_.fetch_add(1, std::memory_order_relaxed);
  return PermissionDenied(std::move(message));
}

std::shared_ptr<Broker::Log> Broker::GetLog(const std::string& name, bool create) {
  {
    std::shared_lock<std::shared_mutex> lock(logs_mu_);
    auto it = logs_.find(name);
    if (it != logs_.end()) return it->second;
  }
  if (!create) return nullptr;
  std::unique_lock<std::shared_mutex> lock(logs_mu_);
  auto& slot = logs_[name];
  if (!slot) slot = std::make_shared<Log>(name);
  return slot;
}

int Broker::WaitingReaders(const std::string& topic) {
  std::shared_ptr<Log> log = GetLog(topic, /*create=*/false);
  if (!log) return 0;
  std::lock_guard<std::mutex> lock(log->mu);
  return log->waiters;
}

void Broker::Track(const Reader* reader, const std::string& agent) {
  std::lock_guard<std::mutex> lock(readers_mu_);
  readers_[reader] = agent;
}

void Broker::Untrack(const Reader* reader) {
  std::lock_guard<std::mutex> lock(readers_mu_);
  readers_.erase(reader);
}

std::vector<Broker::ReaderView> Broker::Readers() {
  std::lock_guard<std::mutex> lock(readers_mu_);
  std::vector<ReaderView> out;
  for (const auto& [reader, agent] : readers_) {
    std::lock_guard<std::mutex> log_lock(reader->log->mu);  // next_offset moves under it
    out.push_back({agent, reader->log->name, reader->next_offset,
                   reader->log->base + static_cast<int64_t>(reader->log->msgs.size())});
  }
  return out;
}

std::shared_ptr<Broker::PublisherState> Broker::GetPublisher(const std::string& agent,
                                                             uint64_t publisher_id) {
  std::lock_guard<std::mutex> lock(publishers_mu_);
  auto key = std::make_pair(agent, publisher_id);
  auto it = publishers_.find(key);
  if (it != publishers_.end()) return it->second;
  if (publishers_.size() >= kMaxPublishers) {
    publishers_.erase(publisher_order_.front());
    publisher_order_.pop_front();
  }
  auto state = std::make_shared<PublisherState>();
  publishers_.emplace(key, state);
  publisher_order_.push_back(std::move(key));
  return state;
}

Status Broker::AppendLocked(Log& log, std::shared_ptr<v1::Message> msg, int64_t* offset,
                            std::shared_ptr<Blob> blob) {
  *offset = log.base + static_cast<int64_t>(log.msgs.size());
  const int64_t size = PayloadBytes(*msg);
  msg->set_topic(log.name);
  msg->set_offset(*offset);
  msg->set_publish_time_ns(NowNs());
  if (durable()) {
    if (!log.files) {
      SegmentLog::Recovered rec;
      auto files =
          SegmentLog::Open(BusLogTopicsDir(options_.log_dir) + "/" + EscapeLogName(log.name),
                           options_.segment_bytes, &rec);
      if (!files.ok()) return NotStored(files.status());
      log.files = std::move(files).value();
      if (log.base != 0 || !log.msgs.empty() || !rec.messages.empty()) {
        return Internal("bus log of " + log.name + ": files appeared after recovery");
      }
    }
    if (Status s = log.files->Stage(*msg); !s.ok()) return Unstorable(log, s);
  }
  log.msgs.push_back(std::move(msg));
  if (blob) {
    blob->stored.store(true);
    log.blobs[*offset] = std::move(blob);
  }
  log.bytes += size;
  published_.fetch_add(1, std::memory_order_relaxed);
  retained_bytes_.fetch_add(size, std::memory_order_relaxed);
  return Status::Ok();
}

Status Broker::CommitLocked(Log& log) {
  if (!log.files) return Status::Ok();
  if (Status s = log.files->Commit(); !s.ok()) return Unstorable(log, s);
  return Status::Ok();
}

Status Broker::Unstorable(Log& log, const Status& why) {
  // What the log's file does not hold is not stored at all: the messages
  // staged since its last commit leave memory again (they are the newest).
  const int64_t end = log.files->committed_end();
  while (!log.msgs.empty() && log.msgs.back()->offset() >= end) {
    const int64_t size = PayloadBytes(*log.msgs.back());
    DropBlob(log, log.msgs.back()->offset());
    log.bytes -= size;
    retained_bytes_.fetch_sub(size, std::memory_order_relaxed);
    published_.fetch_sub(1, std::memory_order_relaxed);
    log.msgs.pop_back();
  }
  return NotStored(why);
}

void Broker::DropBlob(Log& log, int64_t offset) {
  auto it = log.blobs.find(offset);
  if (it == log.blobs.end()) return;
  it->second->Unlink();  // the name now; the bytes go with the last reader's descriptor
  log.blobs.erase(it);
}

void Broker::TrimLocked(Log& log) {
  // Retention: drop the oldest, always keeping the newest message.
  int64_t dropped = 0, dropped_bytes = 0;
  const int64_t oldest_ns = options_.retention_age_s > 0
                                ? NowNs() - static_cast<int64_t>(options_.retention_age_s * 1e9)
                                : std::numeric_limits<int64_t>::min();
  while (log.msgs.size() > 1 &&
         (static_cast<int64_t>(log.msgs.size()) > options_.retention_messages ||
          log.bytes > options_.retention_bytes ||
          log.msgs.front()->publish_time_ns() < oldest_ns)) {
    const int64_t b = PayloadBytes(*log.msgs.front());
    log.bytes -= b;
    dropped_bytes += b;
    if (log.msgs.front()->chunked_size() > 0) DropBlob(log, log.base);
    std::shared_ptr<const v1::Message> old = log.msgs.take_front();
    // Held by no reader (they copy pointers under log.mu, which we hold, and
    // a reader's release is ordered before our reuse by the fence): reusable,
    // when its payload's storage is small (spares hold at most kMaxSpareBytes).
    if (old.use_count() == 1 && old->chunked_size() == 0 && log.spare.size() < kMaxSpare &&
        log.spare_bytes + old->payload().capacity() <= kMaxSpareBytes) {
      std::atomic_thread_fence(std::memory_order_acquire);
      log.spare_bytes += old->payload().capacity();
      log.spare.push_back(std::const_pointer_cast<v1::Message>(std::move(old)));
    }
    ++log.base;
    ++dropped;
  }
  if (dropped > 0) {
    expired_.fetch_add(dropped, std::memory_order_relaxed);
    retained_bytes_.fetch_sub(dropped_bytes, std::memory_order_relaxed);
    if (log.files) log.files->DropBefore(log.base);
  }
}

Broker::Stored Broker::Append(const std::shared_ptr<Log>& log, v1::Message&& msg,
                              std::shared_ptr<Blob> blob) {
  const uint64_t seq = msg.sequence();
  std::shared_ptr<PublisherState> pub;
  std::unique_lock<std::mutex> pub_lock;
  if (msg.publisher_id() != 0) {
    pub = GetPublisher(msg.publisher(), msg.publisher_id());
    pub_lock = std::unique_lock<std::mutex>(pub->mu);
    int64_t first = -1;
    if (pub->Seen(seq, &first)) {
      duplicates_.fetch_add(1, std::memory_order_relaxed);
      return Stored{first, true, Status::Ok()};
    }
  }
  int64_t offset = 0;
  bool wake = false;
  {
    std::lock_guard<std::mutex> lock(log->mu);
    Status s =
        AppendLocked(*log, std::make_shared<v1::Message>(std::move(msg)), &offset, std::move(blob));
    if (s.ok()) s = CommitLocked(*log);
    if (!s.ok()) return Stored{-1, false, s};
    TrimLocked(*log);
    wake = log->waiters > 0;
  }
  if (wake) log->cv.notify_all();
  // Stored (in memory and the file) from here on: a retry is a duplicate of it,
  // as in a batch. Still under pub_lock: a concurrent retry waits for this.
  if (pub) pub->Record(seq, offset);
  // `always`: durable before it is acknowledged; a failed fsync fails the
  // call and every later write to this log (SegmentLog's broken state).
  if (Status s = SyncForAck(*log); !s.ok()) return Stored{-1, false, s};
  return Stored{offset, false, Status::Ok()};
}

Status Broker::CheckPublish(const std::string& agent, const v1::PublishRequest& req,
                            bool check_acl) {
  if (Status s = ValidatePublish(req, options_.limits); !s.ok()) {
    CountInvalid();
    return s.WithContext("publish to topic \"" + req.topic().substr(0, 64) + "\" by agent " +
                         agent);
  }
  if (!req.publisher().empty() && req.publisher() != agent) {
    return Deny("agent " + agent + " cannot publish as agent " + req.publisher());
  }
  if (!check_acl) return Status::Ok();
  thread_local std::string key;  // keeps its storage: no allocation per publish
  key.clear();
  key.append("p|").append(agent).push_back('\0');
  key.append(req.topic());
  bool allowed = false;
  {
    std::lock_guard<std::mutex> lock(acl_cache_mu_);
    auto it = acl_cache_.find(key);
    if (it != acl_cache_.end()) {
      allowed = it->second;
    } else {
      allowed = acl_.MayPublish(agent, req.topic());
      if (acl_cache_.size() >= kMaxCacheEntries) acl_cache_.clear();
      acl_cache_.emplace(key, allowed);
    }
  }
  if (!allowed) {
    return Deny("agent " + agent + " may not publish to topic \"" + req.topic() +
                "\" (no channel in the plan lists it as a publisher)");
  }
  return Status::Ok();
}

namespace {
// A stored message from a publish, into `m` (a reused one keeps its strings'
// storage: the payload is swapped, so the request keeps a buffer to parse
// the next one into).
void FillMessage(const std::string& agent, v1::PublishRequest& req, v1::Message* m) {
  m->set_publisher(agent);
  m->set_publisher_id(req.publisher_id());
  m->set_sequence(req.sequence());
  m->set_content_type(req.content_type());
  m->mutable_payload()->swap(*req.mutable_payload());
  m->set_request_id(0);
  m->set_chunked_size(0);
  m->set_chunked_crc32c(0);
  m->clear_chunked_file();
}

v1::Message ToMessage(const std::string& agent, v1::PublishRequest& req) {
  v1::Message msg;
  FillMessage(agent, req, &msg);
  return msg;
}
}  // namespace

Status Broker::Publish(const std::string& agent, v1::PublishRequest& req,
                       v1::PublishResponse* resp) {
  AGENTRT_RETURN_IF_ERROR(CheckPublish(agent, req));
  Stored st = Append(GetLog(req.topic(), /*create=*/true), ToMessage(agent, req));
  AGENTRT_RETURN_IF_ERROR(st.status.WithContext("publish to topic \"" + req.topic() + "\""));
  resp->set_offset(st.offset);
  resp->set_duplicate(st.duplicate);
  return Status::Ok();
}

Status Broker::PublishBatch(const std::string& agent, v1::PublishBatchRequest& req,
                            v1::PublishBatchResponse* resp) {
  if (req.messages_size() == 0 || req.messages_size() > options_.limits.max_batch_messages) {
    CountInvalid();
    return ValidatePublishBatch(req, options_.limits)
        .WithContext("publish batch by agent " + agent);
  }
  const int n = req.messages_size();
  int i = 0;
  while (i < n) {
    // A run: consecutive entries with the same topic and publisher_id that
    // pass their checks (the ACL answer is the run's first entry's).
    const std::string& topic = req.messages(i).topic();
    const uint64_t pid = req.messages(i).publisher_id();
    int end = i;
    Status failed;
    while (end < n && req.messages(end).topic() == topic &&
           req.messages(end).publisher_id() == pid) {
      failed = CheckPublish(agent, req.messages(end), /*check_acl=*/end == i);
      if (!failed.ok()) break;
      ++end;
    }
    if (end > i) {
      std::shared_ptr<Log> log = GetLog(topic, /*create=*/true);
      std::shared_ptr<PublisherState> pub;
      std::unique_lock<std::mutex> pub_lock;
      if (pid != 0) {
        pub = GetPublisher(agent, pid);
        pub_lock = std::unique_lock<std::mutex>(pub->mu);
      }
      bool wake = false;
      const int acked_before = resp->acks_size();
      Status io;  // the durable log's answer
      {
        std::lock_guard<std::mutex> lock(log->mu);
        for (int k = i; k < end; ++k) {
          v1::PublishRequest& entry = *req.mutable_messages(k);
          const uint64_t seq = entry.sequence();
          int64_t first = -1;
          if (pub && pub->Seen(seq, &first)) {
            duplicates_.fetch_add(1, std::memory_order_relaxed);
            v1::PublishResponse* ack = resp->add_acks();
            ack->set_offset(first);
            ack->set_duplicate(true);
            continue;
          }
          std::shared_ptr<v1::Message> m;
          if (log->spare.empty()) {
            m = std::make_shared<v1::Message>();
          } else {
            m = std::move(log->spare.back());
            log->spare.pop_back();
            log->spare_bytes -= m->payload().capacity();
          }
          FillMessage(agent, entry, m.get());
          int64_t offset = -1;
          if (io = AppendLocked(*log, std::move(m), &offset); !io.ok()) break;
          if (pub) pub->Record(seq, offset);
          resp->add_acks()->set_offset(offset);
        }
        // One write for the run's records; what it could not write is not
        // stored, and the acknowledgements stop before the first such entry.
        if (io.ok()) io = CommitLocked(*log);
        if (!io.ok()) {
          const int64_t committed = log->files ? log->files->committed_end()
                                               : log->base + static_cast<int64_t>(log->msgs.size());
          int keep = acked_before;
          while (keep < resp->acks_size() &&
                 (resp->acks(keep).duplicate() || resp->acks(keep).offset() < committed))
            ++keep;
          while (resp->acks_size() > keep) resp->mutable_acks()->RemoveLast();
          if (pub) {
            // Un-records what this run stored past `committed` (a duplicate's
            // slot names an older offset and stays).
            for (int k = i; k < end; ++k) pub->Forget(req.messages(k).sequence(), committed);
          }
          end = i + (keep - acked_before);
          failed = io;
        }
        TrimLocked(*log);
        wake = log->waiters > 0;
      }
      if (wake) log->cv.notify_all();
      if (Status s = SyncForAck(*log); !s.ok()) {
        // This run's entries are not acknowledged: they may not be durable.
        while (resp->acks_size() > acked_before) resp->mutable_acks()->RemoveLast();
        return s.WithContext("publish batch by agent " + agent + ", entry " + std::to_string(i));
      }
    }
    if (!failed.ok()) {
      return failed.WithContext("batch entry " + std::to_string(end) + " (the " +
                                std::to_string(end) + " before it are stored)");
    }
    i = end;
  }
  return Status::Ok();
}

Result<std::shared_ptr<Broker::Upload>> Broker::BeginLarge(const std::string& agent,
                                                           v1::PublishChunk& first,
                                                           v1::PublishResponse* resp) {
  v1::PublishRequest& head = *first.mutable_head();
  const std::string what =
      "large publish to topic \"" + head.topic().substr(0, 64) + "\" by agent " + agent;
  if (Status s = ValidatePublishHead(first, options_.limits); !s.ok()) {
    CountInvalid();
    return s.WithContext(what);
  }
  AGENTRT_RETURN_IF_ERROR(CheckPublish(agent, head));
  if (head.publisher_id() != 0) {
    // A retry of a stored message is answered before its bytes are read.
    std::shared_ptr<PublisherState> pub = GetPublisher(agent, head.publisher_id());
    std::lock_guard<std::mutex> lock(pub->mu);
    int64_t first_offset = -1;
    if (pub->Seen(head.sequence(), &first_offset)) {
      duplicates_.fetch_add(1, std::memory_order_relaxed);
      resp->set_offset(first_offset);
      resp->set_duplicate(true);
      return std::shared_ptr<Upload>();
    }
  }
  auto up = std::make_shared<Upload>();
  up->log = GetLog(head.topic(), /*create=*/true);
  up->msg = ToMessage(agent, head);
  up->expected_crc = first.crc32c();
  const std::string dir = BlobDir(*up->log);
  if (dir.empty())
    return FailedPrecondition(
        what + ": the broker has no folder for large payloads (Recover() was not called)");
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  const std::string name = fmt::format("{:016x}.blob", RandomNonZeroU64());
  const std::string path = dir + "/" + name;
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) return NotStored(ErrnoStatus(errno, "bus: cannot create " + path)).WithContext(what);
  if (durable()) up->msg.set_chunked_file(name);
  up->blob = std::make_shared<Blob>(path, fd, first.size());
  up->msg.set_chunked_size(first.size());
  up->msg.set_chunked_crc32c(first.crc32c());
  AGENTRT_RETURN_IF_ERROR(WriteLarge(*up, first.data()).WithContext(what));
  return up;
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
  resp->set_offset(st.offset);
  resp->set_duplicate(st.duplicate);
  return Status::Ok();
}

Status Broker::ReadChunk(const Reader& reader, int64_t pos, size_t max, std::string* out) const {
  const Blob& blob = *reader.chunked;
  const size_t n = static_cast<size_t>(
      std::max<int64_t>(0, std::min<int64_t>(static_cast<int64_t>(max), blob.size - pos)));
  out->resize(n);
  size_t done = 0;
  while (done < n) {
    const ssize_t got = ::pread(blob.fd, out->data() + done, n - done,
                                static_cast<off_t>(pos + static_cast<int64_t>(done)));
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) {
      return DataLoss(fmt::format("bus: the payload file of offset {} of {} ended at byte {} of {}",
                                  reader.next_offset - 1, reader.log->name,
                                  pos + static_cast<int64_t>(done), blob.size));
    }
    done += static_cast<size_t>(got);
  }
  return Status::Ok();
}

std::string Broker::ChunkedPath(const Reader& reader) const {
  std::error_code ec;
  const auto abs = std::filesystem::absolute(reader.chunked->path, ec);
  return ec ? reader.chunked->path : abs.string();
}

Status Broker::Send(const std::string& agent, v1::SendRequest& req, v1::SendResponse* resp) {
  if (Status s = ValidateSend(req, options_.limits); !s.ok()) {
    CountInvalid();
    return s.WithContext("send from agent " + agent);
  }
  if (!acl_.IsAgent(req.to()))
    return NotFound("send from agent " + agent + ": no agent \"" + req.to() + "\" in this run");
  v1::Message msg;
  msg.set_publisher(agent);
  msg.set_publisher_id(req.publisher_id());
  msg.set_sequence(req.sequence());
  msg.set_content_type(std::move(*req.mutable_content_type()));
  msg.set_payload(std::move(*req.mutable_payload()));
  Stored st = Append(GetLog(InboxName(req.to()), /*create=*/true), std::move(msg));
  AGENTRT_RETURN_IF_ERROR(st.status.WithContext("send to agent " + req.to()));
  resp->set_offset(st.offset);
  resp->set_duplicate(st.duplicate);
  return Status::Ok();
}

Result<Broker::Reader> Broker::OpenReader(std::shared_ptr<Log> log, const v1::StartAt& start,
                                          uint64_t incarnation, int max_batch, bool local_files,
                                          v1::SubscribeResponse::Header* header) {
  Reader r;
  r.max_batch_messages = max_batch > 0 ? max_batch : options_.limits.max_batch_messages;
  r.local_files = local_files;
  std::lock_guard<std::mutex> lock(log->mu);
  const int64_t end = log->base + static_cast<int64_t>(log->msgs.size());
  header->Clear();
  header->set_incarnation(incarnation_);
  header->set_earliest_offset(log->base);
  header->set_end_offset(end);
  if (incarnation != 0 && incarnation != incarnation_) {
    header->set_broker_restarted(true);
    r.next_offset = log->base;
  } else if (start.position_case() == v1::StartAt::kEarliest) {
    r.next_offset = log->base;
  } else if (start.position_case() == v1::StartAt::kOffset && start.offset() > end) {
    // A position past the end: the log lost its newest messages (a machine
    // crash in batch mode) and their offsets will be used again. Said, not
    // skipped: the reader is told, and goes on at the end.
    header->set_broker_restarted(true);
    r.next_offset = end;
  } else if (start.position_case() == v1::StartAt::kOffset) {
    r.next_offset = start.offset();  // below base: the first Read reports OFFSET_EXPIRED
  } else {
    r.next_offset = end;
  }
  header->set_start_offset(r.next_offset);
  r.log = std::move(log);
  return r;
}

Result<Broker::Reader> Broker::OpenTopicReader(const std::string& agent,
                                               const v1::SubscribeRequest& req,
                                               v1::SubscribeResponse::Header* header) {
  if (Status s = ValidateSubscribe(req, options_.limits); !s.ok()) {
    CountInvalid();
    return s.WithContext("subscribe by agent " + agent);
  }
  if (!acl_.MaySubscribe(agent, req.topic())) {
    return Deny("agent " + agent + " may not subscribe to topic \"" + req.topic() +
                "\" (no channel in the plan lists it as a subscriber)");
  }
  return OpenReader(GetLog(req.topic(), true), req.start(), req.incarnation(),
                    req.max_batch_messages(), req.local_files(), header);
}

Result<Broker::Reader> Broker::OpenInboxReader(const std::string& agent,
                                               const v1::ReceiveRequest& req,
                                               v1::SubscribeResponse::Header* header) {
  if (Status s = ValidateReceive(req, options_.limits); !s.ok()) {
    CountInvalid();
    return s.WithContext("receive by agent " + agent);
  }
  return OpenReader(GetLog(InboxName(agent), true), req.start(), req.incarnation(),
                    req.max_batch_messages(), req.local_files(), header);
}

Broker::ReadOutcome Broker::Collect(Reader* reader, std::chrono::milliseconds wait,
                                    std::vector<std::shared_ptr<const v1::Message>>* batch,
                                    int64_t* earliest) {
  Log& log = *reader->log;
  std::unique_lock<std::mutex> lock(log.mu);
  auto end = [&] { return log.base + static_cast<int64_t>(log.msgs.size()); };
  if (reader->next_offset >= end() && wait.count() > 0 && !shutting_down()) {
    ++log.waiters;
    log.cv.wait_for(lock, wait, [&] { return reader->next_offset < end() || shutting_down(); });
    --log.waiters;
  }
  if (reader->next_offset < log.base) {
    *earliest = log.base;
    return ReadOutcome::kExpired;
  }
  size_t idx = static_cast<size_t>(reader->next_offset - log.base);
  int64_t bytes = 0;
  reader->chunked.reset();
  while (idx < log.msgs.size() && static_cast<int>(batch->size()) < reader->max_batch_messages) {
    const auto& m = log.msgs[idx];
    if (m->chunked_size() > 0) {
      // A large message goes alone; its bytes follow from its file.
      if (!batch->empty()) break;
      auto it = log.blobs.find(m->offset());
      if (it == log.blobs.end()) break;  // cannot happen: stored with its blob
      reader->chunked = it->second;
      batch->push_back(m);
      ++idx;
      break;
    }
    const int64_t b = static_cast<int64_t>(m->payload().size());
    if (!batch->empty() && bytes + b > options_.max_stream_batch_bytes) break;
    bytes += b;
    batch->push_back(m);
    ++idx;
  }
  if (batch->empty()) return ReadOutcome::kIdle;
  reader->next_offset += static_cast<int64_t>(batch->size());
  delivered_.fetch_add(static_cast<int64_t>(batch->size()), std::memory_order_relaxed);
  return ReadOutcome::kMessages;
}

Broker::ReadOutcome Broker::Read(Reader* reader, std::chrono::milliseconds wait,
                                 v1::SubscribeResponse* out, int64_t* earliest) {
  // Pointers are taken under the log lock and copied outside it, so a large
  // copy never holds up publishers.
  std::vector<std::shared_ptr<const v1::Message>> batch;
  ReadOutcome outcome = Collect(reader, wait, &batch, earliest);
  for (const auto& m : batch) *out->add_messages() = *m;
  return outcome;
}

Broker::ReadOutcome Broker::ReadBorrowed(Reader* reader, std::chrono::milliseconds wait,
                                         Lease* lease, int64_t* earliest) {
  lease->Release();
  ReadOutcome outcome = Collect(reader, wait, &lease->held_, earliest);
  auto* field = lease->out_->mutable_messages();
  field->Reserve(static_cast<int>(lease->held_.size()));
  // Stored messages are never modified, so serializing them from several
  // streams at once is safe (protobuf const access).
  for (const auto& m : lease->held_)
    field->UnsafeArenaAddAllocated(const_cast<v1::Message*>(m.get()));
  return outcome;
}

void Broker::Lease::Release() {
  auto* field = out_->mutable_messages();
  while (!field->empty()) field->UnsafeArenaReleaseLast();
  held_.clear();
}

Status Broker::Request(const std::string& agent, v1::RequestRequest& req,
                       std::chrono::system_clock::time_point deadline,
                       const std::function<bool()>& cancelled, v1::RequestResponse* resp) {
  if (Status s = ValidateRequest(req, options_.limits); !s.ok()) {
    CountInvalid();
    return s.WithContext("request from agent " + agent);
  }
  if (!acl_.IsAgent(req.to())) {
    return NotFound("request from agent " + agent + ": no agent \"" + req.to() + "\" in this run");
  }
  auto pending = std::make_shared<PendingRequest>();
  pending->to = req.to();
  const uint64_t id = next_request_id_.fetch_add(1, std::memory_order_relaxed);
  {
    std::lock_guard<std::mutex> lock(requests_mu_);
    requests_.emplace(id, pending);
  }
  auto forget = [&] {
    std::lock_guard<std::mutex> lock(requests_mu_);
    requests_.erase(id);
  };
  v1::Message msg;
  msg.set_publisher(agent);
  msg.set_request_id(id);
  msg.set_content_type(std::move(*req.mutable_content_type()));
  msg.set_payload(std::move(*req.mutable_payload()));
  if (Stored st = Append(GetLog(InboxName(req.to()), true), std::move(msg)); !st.status.ok()) {
    forget();
    return st.status.WithContext("request to agent " + req.to());
  }

  std::unique_lock<std::mutex> lock(pending->mu);
  while (!pending->done) {
    const auto now = std::chrono::system_clock::now();
    if (now >= deadline) {
      lock.unlock();
      forget();
      return DeadlineExceeded("request " + std::to_string(id) + " from agent " + agent +
                              " to agent " + req.to() + ": no reply before the deadline");
    }
    if (shutting_down()) {
      lock.unlock();
      forget();
      return Unavailable("the bus broker is shutting down");
    }
    if (cancelled && cancelled()) {
      lock.unlock();
      forget();
      return Status(StatusCode::kCancelled,
                    "request " + std::to_string(id) + " cancelled by the caller");
    }
    pending->cv.wait_for(lock, std::min<std::chrono::system_clock::duration>(
                                   deadline - now, std::chrono::milliseconds(50)));
  }
  *resp = std::move(pending->response);
  return Status::Ok();
}

Status Broker::Reply(const std::string& agent, v1::ReplyRequest& req) {
  if (Status s = ValidateReply(req, options_.limits); !s.ok()) {
    CountInvalid();
    return s.WithContext("reply from agent " + agent);
  }
  std::shared_ptr<PendingRequest> pending;
  {
    std::lock_guard<std::mutex> lock(requests_mu_);
    auto it = requests_.find(req.request_id());
    if (it == requests_.end()) {
      return NotFound("reply from agent " + agent + ": request " +
                      std::to_string(req.request_id()) +
                      " is unknown or no longer waiting (its deadline passed?)");
    }
    if (it->second->to != agent) {
      return Deny("agent " + agent + " cannot answer request " + std::to_string(req.request_id()) +
                  ", which was addressed to agent " + it->second->to);
    }
    pending = it->second;
    requests_.erase(it);
  }
  {
    std::lock_guard<std::mutex> lock(pending->mu);
    pending->response.set_payload(std::move(*req.mutable_payload()));
    pending->response.set_content_type(std::move(*req.mutable_content_type()));
    pending->response.set_replier(agent);
    pending->done = true;
  }
  pending->cv.notify_all();
  return Status::Ok();
}

std::vector<v1::TopicInfo> Broker::ListTopics(const std::string& agent) {
  std::vector<std::shared_ptr<Log>> logs;
  {
    std::shared_lock<std::shared_mutex> lock(logs_mu_);
    for (const auto& [name, log] : logs_) {
      if (name.empty() || name.front() == '@') continue;
      if (!agent.empty() && !acl_.MaySubscribe(agent, name)) continue;
      logs.push_back(log);
    }
  }
  std::vector<v1::TopicInfo> out;
  for (const auto& log : logs) {
    v1::TopicInfo info;
    std::lock_guard<std::mutex> lock(log->mu);
    info.set_topic(log->name);
    info.set_earliest_offset(log->base);
    info.set_end_offset(log->base + static_cast<int64_t>(log->msgs.size()));
    info.set_retained_messages(static_cast<int64_t>(log->msgs.size()));
    info.set_retained_bytes(log->bytes);
    out.push_back(std::move(info));
  }
  return out;
}

BusStats Broker::Stats() const {
  BusStats s;
  s.incarnation = incarnation_;
  {
    std::shared_lock<std::shared_mutex> lock(logs_mu_);
    for (const auto& [name, log] : logs_) {
      if (!name.empty() && name.front() != '@') ++s.topics;
    }
  }
  s.messages_published = published_.load();
  s.duplicates_dropped = duplicates_.load();
  s.messages_delivered = delivered_.load();
  s.messages_expired = expired_.load();
  s.retained_bytes = retained_bytes_.load();
  s.active_streams = active_streams_.load();
  s.rejected_unauthenticated = rejected_unauthenticated_.load();
  s.rejected_permission = rejected_permission_.load();
  s.rejected_invalid = rejected_invalid_.load();
  s.log_sync_errors = sync_errors_.load();
  return s;
}

void Broker::Shutdown() {
  {
    std::lock_guard<std::mutex> lock(flush_mu_);
    shutdown_.store(true, std::memory_order_release);
  }
  flush_cv_.notify_all();
  std::vector<std::shared_ptr<Log>> logs;
  {
    std::shared_lock<std::shared_mutex> lock(logs_mu_);
    for (const auto& [name, log] : logs_) logs.push_back(log);
  }
  for (const auto& log : logs) {
    std::lock_guard<std::mutex> lock(log->mu);
    log->cv.notify_all();
  }
  std::lock_guard<std::mutex> lock(requests_mu_);
  for (const auto& [id, p] : requests_) {
    std::lock_guard<std::mutex> plock(p->mu);
    p->cv.notify_all();
  }
}

}  // namespace agentrt
