#include "comms/broker.h"

#include <fcntl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <random>
#include <set>
#include <utility>

#include "common/crc32c.h"
#include "common/file_util.h"
#include "common/random.h"
#include "comms/broker_internal.h"
#include "comms/packed_entries.h"
#include "fmt/format.h"
#include "plan/run_dir.h"

namespace agentrt {

using namespace broker_internal;  // NOLINT(google-build-using-namespace): its own insides

std::string InboxName(std::string_view agent) { return "@inbox/" + std::string(agent); }

Broker::Broker(BrokerOptions options, BusAcl acl, std::string secret, uint64_t incarnation)
    : options_(options),
      access_(std::move(acl), std::move(secret), kMaxCacheEntries),
      incarnation_(incarnation),
      publishers_(kMaxPublishers),
      requests_(std::random_device{}() | 1) {}

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
  if (!spool_dir_.empty()) {
    // Spool files nobody adopted: publishes that died half-way.
    std::error_code ec;
    std::filesystem::remove_all(spool_dir_, ec);
  }
  if (!durable() && !spill_dir_.empty()) {
    // Memory mode: the payload files are of no use once the broker is gone.
    logs_.clear();  // closes every large payload's file first
    std::error_code ec;
    if (own_spill_dir_) {
      if (own_spill_.dir().empty()) {
        std::filesystem::remove_all(spill_dir_, ec);
      } else {
        own_spill_.Leave();  // its only member: removes it
      }
    } else {
      for (const auto& e : std::filesystem::directory_iterator(spill_dir_, ec))
        std::filesystem::remove(e.path(), ec);
    }
  }
}

namespace {
constexpr std::string_view kOwnSpillPrefix = "agentrt-bus-spill.";
}  // namespace

// A folder this broker holds as the one member of a SharedNodeDir
// (plan/mpi_shm.h): one whose broker was killed has its lock free, and the
// next broker to start removes it. Where locks are not to be had (a file
// system without flock), a plain folder of its own, removed with the broker.
Status Broker::MakeOwnSpillDir() {
  std::error_code ec;
  const std::string root = !options_.spill_root.empty()
                               ? options_.spill_root
                               : std::filesystem::temp_directory_path(ec).string();
  SweepSharedNodeDirs(root, kOwnSpillPrefix);
  own_spill_ = SharedNodeDir::Join(root, std::string(kOwnSpillPrefix) + RandomHex64());
  if (!own_spill_.dir().empty()) {
    spill_dir_ = own_spill_.dir();
  } else {
    std::string dir = root + "/agentrt-bus-unlocked.XXXXXX";  // not the sweep's
    if (::mkdtemp(dir.data()) == nullptr)
      return ErrnoStatus(errno, "bus: cannot create a folder for large payloads in " + root);
    spill_dir_ = std::move(dir);
  }
  own_spill_dir_ = true;
  return Status::Ok();
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
      if (!files.ok() && files.status().code() == StatusCode::kDataLoss) {
        // What the operator's fix does to subscribers: offsets given again under
        // the old incarnation would be read as the old messages' positions.
        return DataLoss(files.status().message() + "; then also delete " +
                        BusIncarnationFile(options_.log_dir) +
                        ", so that the bus starts a new incarnation: every subscriber resuming "
                        "a saved position is told (broker_restarted) and reads each topic from "
                        "its earliest offset, and no offset is reused under the old one");
      }
      if (!files.ok()) return files.status();
      if (!rec.torn.empty()) notes->push_back("bus log: torn tail cut: " + rec.torn);
      std::shared_ptr<Log> log = GetLog(name, /*create=*/true);
      std::lock_guard<std::mutex> lock(log->mu);
      log->files = std::move(files).value();
      log->base = rec.base;
      for (v1::Message& m : rec.messages) {
        if (m.publisher_id() != 0)
          publishers_.Get(m.publisher(), m.publisher_id())->Record(m.sequence(), m.offset());
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
      AGENTRT_RETURN_IF_ERROR(MakeOwnSpillDir());
    }
  }
  AGENTRT_RETURN_IF_ERROR(MakeSpool());
  // Every retained large message keeps its file open (its readers send from
  // it after retention removed its name).
  RaiseOpenFileLimit();
  max_open_payload_files_ = options_.max_open_payload_files;
  if (rlimit files{}; max_open_payload_files_ <= 0 && ::getrlimit(RLIMIT_NOFILE, &files) == 0)
    max_open_payload_files_ = static_cast<int64_t>(files.rlim_cur / 4);
  if ((durable() && options_.durability == BusDurability::kBatch) || options_.retention_age_s > 0)
    flusher_ = std::thread([this] { FlushLoop(); });
  return Status::Ok();
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

Status Broker::Authenticate(std::string_view agent, std::string_view token,
                            std::string_view incarnation) {
  auto refuse = [&](std::string m) {
    rejected_unauthenticated_.fetch_add(1, std::memory_order_relaxed);
    return Status(StatusCode::kUnauthenticated, std::move(m));
  };
  if (agent.empty()) return refuse("no agent name (metadata x-agentrt-agent) on the call");
  if (!ValidateAgentName(agent).ok()) return refuse("malformed agent name in x-agentrt-agent");
  if (!access_.acl().IsAgent(agent))
    return refuse("\"" + std::string(agent) + "\" is not an agent of this run");
  if (token.empty())
    return refuse("agent " + std::string(agent) + " presented no token (x-agentrt-token)");
  if (!access_.TokenValid(agent, token)) {
    return refuse("wrong token for agent " + std::string(agent) +
                  " (is AGENTRT_TOKEN_FILE from this run? the run secret changes with every run)");
  }
  return CheckIncarnation(agent, incarnation);
}

Status Broker::CheckIncarnation(std::string_view agent, std::string_view incarnation) const {
  if (incarnation.empty()) return Status::Ok();
  auto fenced = [&](std::string_view current) {
    return PermissionDenied(fmt::format(
        "fenced: launch {} of agent {} was replaced by launch {}; only the current one may use "
        "the bus",
        incarnation, agent, current));
  };
  // The current launch (as the fence said at most kCurrentKept ago), or a
  // refusal remembered for a second; nullopt: ask.
  auto known = [&]() -> std::optional<Status> {
    auto current = launches_.find(agent);
    if (current != launches_.end() && current->second == incarnation) {
      if (!options_.current_launch) return Status::Ok();
      auto launches = asked_.find(agent);
      if (launches != asked_.end() &&
          std::chrono::steady_clock::now() - launches->second.read_at < kCurrentKept)
        return Status::Ok();
      return std::nullopt;
    }
    if (!options_.current_launch) {
      if (current == launches_.end()) return Status::Ok();
      return fenced(current->second);
    }
    if (current == launches_.end()) return std::nullopt;
    auto launches = asked_.find(agent);
    if (launches == asked_.end()) return std::nullopt;
    auto refused = launches->second.refused.find(incarnation);
    if (refused == launches->second.refused.end() ||
        std::chrono::steady_clock::now() - refused->second >= kRefusalKept)
      return std::nullopt;
    return fenced(current->second);
  };
  std::mutex* asking = nullptr;
  {
    std::shared_lock<std::shared_mutex> lock(launches_mu_);
    if (std::optional<Status> s = known()) return *s;
    auto launches = asked_.find(agent);
    if (launches != asked_.end()) asking = launches->second.mu.get();
  }
  if (asking == nullptr) {
    std::unique_lock<std::shared_mutex> lock(launches_mu_);
    std::unique_ptr<std::mutex>& mu = asked_[std::string(agent)].mu;
    if (!mu) mu = std::make_unique<std::mutex>();
    asking = mu.get();
  }
  // The launcher's record: at the first launch seen, or before refusing one.
  // One asker per agent at a time, so the record follows the fence in the
  // file's order; a caller that waited may find its answer meanwhile.
  std::lock_guard<std::mutex> one(*asking);
  {
    std::shared_lock<std::shared_mutex> lock(launches_mu_);
    if (std::optional<Status> s = known()) return *s;
  }
  Result<std::string> named = options_.current_launch(std::string(agent));
  if (!named.ok()) {
    return Unavailable(fmt::format("which launch of agent {} is current cannot be told now: {}",
                                   agent, named.status().ToString()));
  }
  std::unique_lock<std::shared_mutex> lock(launches_mu_);
  auto current = launches_.find(agent);
  Asked& asked = asked_[std::string(agent)];
  asked.read_at = std::chrono::steady_clock::now();
  std::string id = std::move(named).value();
  // A fence never goes back to a launch it replaced: such a read is stale
  // (a shared file system's cache) and names the current one.
  if (!id.empty() && asked.replaced.count(id)) id.clear();
  if (id.empty()) {  // none named: the first launch seen is current
    if (current == launches_.end()) {
      launches_.emplace(std::string(agent), std::string(incarnation));
      return Status::Ok();
    }
    id = current->second;
  } else if (current == launches_.end()) {
    current = launches_.emplace(std::string(agent), id).first;
  } else if (current->second != id) {
    if (asked.replaced.size() >= kMaxLaunchesKept) asked.replaced.clear();
    asked.replaced.insert(std::exchange(current->second, id));
  }
  if (id == incarnation) return Status::Ok();
  if (asked.refused.size() >= kMaxLaunchesKept) asked.refused.clear();
  asked.refused[std::string(incarnation)] = std::chrono::steady_clock::now();
  return fenced(id);
}

void Broker::SetIncarnation(const std::string& agent, const std::string& incarnation) {
  std::unique_lock<std::shared_mutex> lock(launches_mu_);
  launches_[agent] = incarnation;
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

void Broker::TrimLocked(Log& log) {
  // Retention: drop the oldest, always keeping the newest message.
  int64_t dropped = 0, dropped_bytes = 0;
  const int64_t oldest_ns = options_.retention_age_s > 0
                                ? NowNs() - static_cast<int64_t>(options_.retention_age_s * 1e9)
                                : std::numeric_limits<int64_t>::min();
  // A channel's keep_last overrides bus.retention for its topics (asked once per log).
  if (log.keep_last < 0) log.keep_last = access_.acl().KeepLast(log.name);
  const int64_t keep = log.keep_last > 0 ? log.keep_last : options_.retention_messages;
  while (log.msgs.size() > 1 &&
         (static_cast<int64_t>(log.msgs.size()) > keep || log.bytes > options_.retention_bytes ||
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
  std::shared_ptr<PublisherWindow> pub;
  std::unique_lock<std::mutex> pub_lock;
  if (msg.publisher_id() != 0) {
    pub = publishers_.Get(msg.publisher(), msg.publisher_id());
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
  AGENTRT_RETURN_IF_ERROR(CheckValid(ValidatePublish(req, options_.limits), [&] {
    return "publish to topic \"" + req.topic().substr(0, 64) + "\" by agent " + agent;
  }));
  if (!req.publisher().empty() && req.publisher() != agent) {
    return Deny("agent " + agent + " cannot publish as agent " + req.publisher());
  }
  if (!check_acl) return Status::Ok();
  return CheckMayPublish(agent, req.topic());
}

Status Broker::CheckMayPublish(const std::string& agent, const std::string& topic) {
  if (access_.MayPublish(agent, topic)) return Status::Ok();
  return Deny("agent " + agent + " may not publish to topic \"" + topic +
              "\" (no channel in the plan lists it as a publisher)");
}

Status Broker::Publish(const std::string& agent, v1::PublishRequest& req,
                       v1::PublishResponse* resp) {
  AGENTRT_RETURN_IF_ERROR(CheckPublish(agent, req));
  Stored st = Append(GetLog(req.topic(), /*create=*/true), ToMessage(agent, req));
  AGENTRT_RETURN_IF_ERROR(st.status.WithContext("publish to topic \"" + req.topic() + "\""));
  resp->set_offset(st.offset);
  resp->set_duplicate(st.duplicate);
  return Status::Ok();
}

namespace {
// The entries of one run of PublishBatch, as StoreRun takes them: a run of
// its `messages` (each payload moved into its message) ...
class MessageRun {
 public:
  static constexpr bool kAnswersAsRun = false;  // an ack each, as before packed entries
  MessageRun(const std::string& agent, v1::PublishBatchRequest& req, int first)
      : agent_(agent), req_(req), first_(first) {}
  uint64_t Sequence(int k) const { return req_.messages(first_ + k).sequence(); }
  void Fill(int k, v1::Message* m) { FillMessage(agent_, *req_.mutable_messages(first_ + k), m); }

 private:
  const std::string& agent_;
  v1::PublishBatchRequest& req_;
  const int first_;
};

// ... or its packed entries (validated: every entry is there). Fill is
// called with increasing k (a duplicate's entry is skipped).
class PackedRun {
 public:
  static constexpr bool kAnswersAsRun = true;
  PackedRun(const std::string& agent, const v1::PackedEntries& packed)
      : agent_(agent), packed_(packed), reader_(packed.payloads()) {}
  uint64_t Sequence(int k) const {
    return packed_.first_sequence() == 0 ? 0 : packed_.first_sequence() + static_cast<uint64_t>(k);
  }
  void Fill(int k, v1::Message* m) {
    std::string_view payload;
    while (next_ <= k) {
      (void)reader_.Next(&payload);
      ++next_;
    }
    FillStoredFields(agent_, packed_.publisher_id(), Sequence(k), packed_.content_type(), m);
    m->mutable_payload()->assign(payload.data(), payload.size());  // copied: a packed field
  }

 private:
  const std::string& agent_;
  const v1::PackedEntries& packed_;
  PackedEntryReader reader_;
  int next_ = 0;  // the entry reader_ reads next
};
}  // namespace

template <typename Run>
Status Broker::StoreRun(const std::string& agent, const std::string& topic, uint64_t publisher_id,
                        int count, Run& run, v1::PublishBatchResponse* resp, int* answered,
                        Status* refused) {
  std::shared_ptr<Log> log = GetLog(topic, /*create=*/true);
  std::shared_ptr<PublisherWindow> pub;
  std::unique_lock<std::mutex> pub_lock;
  if (publisher_id != 0) {
    pub = publishers_.Get(agent, publisher_id);
    pub_lock = std::unique_lock<std::mutex>(pub->mu);
  }
  bool wake = false;
  const int acked_before = resp->acks_size();
  // Packed entries are answered as a run stored at consecutive offsets
  // (PublishBatchResponse.stored) up to the first duplicate, then an ack each.
  bool in_run = Run::kAnswersAsRun && acked_before == 0 && resp->stored() == 0;
  Status io;  // the durable log's answer
  {
    std::lock_guard<std::mutex> lock(log->mu);
    for (int k = 0; k < count; ++k) {
      const uint64_t seq = run.Sequence(k);
      int64_t first = -1;
      if (pub && pub->Seen(seq, &first)) {
        duplicates_.fetch_add(1, std::memory_order_relaxed);
        v1::PublishResponse* ack = resp->add_acks();
        ack->set_offset(first);
        ack->set_duplicate(true);
        in_run = false;
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
      run.Fill(k, m.get());
      int64_t offset = -1;
      if (io = AppendLocked(*log, std::move(m), &offset); !io.ok()) break;
      if (pub) pub->Record(seq, offset);
      if (in_run) {
        if (resp->stored() == 0) resp->set_first_offset(offset);
        resp->set_stored(resp->stored() + 1);
      } else {
        resp->add_acks()->set_offset(offset);
      }
    }
    // One write for the run's records; what it could not write is not
    // stored, and the answers stop before the first such entry.
    if (io.ok()) io = CommitLocked(*log);
    if (!io.ok()) {
      const int64_t committed = log->files ? log->files->committed_end()
                                           : log->base + static_cast<int64_t>(log->msgs.size());
      int keep = acked_before;
      if (resp->stored() > 0 && resp->first_offset() + resp->stored() > committed) {
        // The run stored first is cut there, and nothing after it is answered.
        resp->set_stored(
            static_cast<int32_t>(std::max<int64_t>(0, committed - resp->first_offset())));
      } else {
        while (keep < resp->acks_size() &&
               (resp->acks(keep).duplicate() || resp->acks(keep).offset() < committed))
          ++keep;
      }
      while (resp->acks_size() > keep) resp->mutable_acks()->RemoveLast();
      if (pub) {
        // Un-records what this run stored past `committed` (a duplicate's
        // slot names an older offset and stays).
        for (int k = 0; k < count; ++k) pub->Forget(run.Sequence(k), committed);
      }
    }
    TrimLocked(*log);
    wake = log->waiters > 0;
  }
  if (wake) log->cv.notify_all();
  *answered = AnsweredEntries(*resp) - acked_before;
  *refused = io;
  if (Status s = SyncForAck(*log); !s.ok()) {
    // This run's entries are not acknowledged: they may not be durable.
    while (resp->acks_size() > acked_before) resp->mutable_acks()->RemoveLast();
    if (acked_before == 0) resp->set_stored(0);
    *answered = 0;
    return s;
  }
  return Status::Ok();
}

Status Broker::PublishBatch(const std::string& agent, v1::PublishBatchRequest& req,
                            v1::PublishBatchResponse* resp) {
  resp->set_packed_entries(true);
  if (req.has_packed()) {
    // One topic, one publisher: checked once, then stored as one run up to
    // the first entry refused, as a run of messages would be.
    const v1::PackedEntries& packed = req.packed();
    int good = 0;
    Status failed = req.messages_size() == 0 ? ValidatePackedEntries(packed, options_.limits, &good)
                                             : ValidatePublishBatch(req, options_.limits);
    if (!failed.ok()) {
      CountInvalid();
      failed = failed.WithContext("publish batch to topic \"" + packed.topic().substr(0, 64) +
                                  "\" by agent " + agent);
    }
    if (good > 0) {
      if (Status denied = CheckMayPublish(agent, packed.topic()); !denied.ok())
        return denied.WithContext("batch entry 0 (the 0 before it are stored)");
      PackedRun run(agent, packed);
      int answered = 0;
      Status refused;
      if (Status s = StoreRun(agent, packed.topic(), packed.publisher_id(), good, run, resp,
                              &answered, &refused);
          !s.ok()) {
        return s.WithContext("publish batch by agent " + agent + ", entry 0");
      }
      if (!refused.ok()) {
        good = answered;
        failed = refused;
      }
    }
    if (!failed.ok()) {
      return failed.WithContext("batch entry " + std::to_string(good) + " (the " +
                                std::to_string(good) + " before it are stored)");
    }
    return Status::Ok();
  }
  if (req.messages_size() == 0 || req.messages_size() > options_.limits.max_batch_messages) {
    CountInvalid();
    return ValidatePublishBatch(req, options_.limits)
        .WithContext("publish batch by agent " + agent);
  }
  const int n = req.messages_size();
  int i = 0;
  while (i < n) {
    if (IsSpooledEntry(req.messages(i))) {  // its bytes in the spool: stored on its own
      v1::PublishResponse ack;
      if (Status s = AdoptSpooledEntry(agent, *req.mutable_messages(i), &ack); !s.ok()) {
        return s.WithContext("batch entry " + std::to_string(i) + " (the " + std::to_string(i) +
                             " before it are stored)");
      }
      *resp->add_acks() = ack;
      ++i;
      continue;
    }
    // A run: consecutive entries with the same topic and publisher_id that
    // pass their checks (the ACL answer is the run's first entry's).
    const std::string& topic = req.messages(i).topic();
    const uint64_t pid = req.messages(i).publisher_id();
    int end = i;
    Status failed;
    while (end < n && req.messages(end).topic() == topic &&
           req.messages(end).publisher_id() == pid && !IsSpooledEntry(req.messages(end))) {
      failed = CheckPublish(agent, req.messages(end), /*check_acl=*/end == i);
      if (!failed.ok()) break;
      ++end;
    }
    if (end > i) {
      MessageRun run(agent, req, i);
      int answered = 0;
      Status refused;
      if (Status s = StoreRun(agent, topic, pid, end - i, run, resp, &answered, &refused);
          !s.ok()) {
        return s.WithContext("publish batch by agent " + agent + ", entry " + std::to_string(i));
      }
      if (!refused.ok()) {
        end = i + answered;
        failed = refused;
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

Status Broker::Send(const std::string& agent, v1::SendRequest& req, v1::SendResponse* resp) {
  AGENTRT_RETURN_IF_ERROR(
      CheckValid(ValidateSend(req, options_.limits), [&] { return "send from agent " + agent; }));
  if (!access_.acl().IsAgent(req.to()))
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

std::vector<v1::TopicInfo> Broker::ListTopics(const std::string& agent, const std::string& only) {
  std::vector<std::shared_ptr<Log>> logs;
  {
    std::shared_lock<std::shared_mutex> lock(logs_mu_);
    auto take = [&](const std::string& name, const std::shared_ptr<Log>& log) {
      if (name.empty() || name.front() == '@') return;
      if (!agent.empty() && !access_.acl().MaySubscribe(agent, name)) return;
      logs.push_back(log);
    };
    if (only.empty()) {
      for (const auto& [name, log] : logs_) take(name, log);
    } else if (auto it = logs_.find(only); it != logs_.end()) {
      take(it->first, it->second);
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
  s.large_adopted = large_adopted_.load();
  s.large_streamed = large_streamed_.load();
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
  requests_.WakeAll();
}

}  // namespace agentrt
