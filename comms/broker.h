// The bus broker's state: topic logs, inboxes, retention and readers, with
// parts of their own for duplicate suppression (PublisherTable), tokens and
// publish rights (AccessCache) and pending requests (RequestTable).
// Transport-free (the gRPC service in bus_server.cc is a thin layer over it),
// so its logic is unit-testable.
//
// Thread-safety: every public method may be called from any thread. Publishers
// never wait for readers: a log only grows and is trimmed by retention.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <shared_mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/status.h"
#include "comms/access_cache.h"
#include "comms/auth.h"
#include "comms/bus_log.h"
#include "comms/bus_types.h"
#include "comms/bus_validate.h"
#include "comms/proto/bus.pb.h"
#include "comms/publisher_window.h"
#include "comms/request_table.h"
#include "plan/mpi_shm.h"

namespace agentrt {

struct BrokerOptions {
  BusLimits limits;
  int64_t retention_messages = 100000;         // per topic/inbox
  int64_t retention_bytes = int64_t{1} << 30;  // per topic/inbox, payload bytes
  int64_t max_stream_batch_bytes =
      1 << 20;                 // bytes per SubscribeResponse (one larger message still goes alone)
  double retention_age_s = 0;  // messages older than this expire; 0 = no age limit
  // The durable log (comms/bus_log.h) under log_dir/logs; empty log_dir or
  // kMemory: none. Call Recover() before serving.
  std::string log_dir;
  // Where a broker without log_dir keeps the files of large payloads: a
  // folder of its own under this one ("": the temp folder), removed with the
  // broker, or by the next broker to start when this one was killed.
  std::string spill_root;
  // A broker without a durable log keeps every large payload as a file of
  // its own, open. An async publish's spooled payload (at most 4 MiB) becomes
  // one only while fewer than this many are open; past it, the broker reads
  // the file and keeps the bytes in memory, so small retained payloads cannot
  // take every descriptor. 0: a quarter of the process's open-file limit.
  int64_t max_open_payload_files = 0;
  BusDurability durability = BusDurability::kMemory;
  int fsync_interval_ms = 200;                // kBatch: the longest a record waits for its fsync
  int64_t segment_bytes = int64_t{64} << 20;  // a new segment file past this size
  // The spool is searched for what dead publishers left at most this often
  // (before an adoption; ReapSpool). 0: before every adoption.
  std::chrono::milliseconds spool_reap_every{15000};
  // Which launch of an agent is current where no embedder says so
  // (SetIncarnation): agentrt-bus --plan (a run's broker, a SLURM job
  // array's) reads the checkpoint fence each launcher writes before it starts
  // an agent (plan/fence.h). Asked when a launch of an agent the broker
  // knows no launch of authenticates (none named: that launch is current),
  // before a launch other than the current one is refused, so a requeued
  // task's new launch takes over and the old one is fenced, and again at most
  // every second while the current launch calls, so a replaced launch is
  // refused within a second of its successor's fence even before the
  // successor calls (agentrt-bus --plan also watches the fences, FenceWatcher,
  // and names a new one at once: SetIncarnation). "" : none named.
  // A fence that cannot be read now answers UNAVAILABLE (the caller retries).
  std::function<Result<std::string>(const std::string& agent)> current_launch;
};

class Broker {
 public:
  // One append-only log (a topic or an inbox). Opaque to callers.
  struct Log;
  // A large message's payload: one file, shared by every reader sending it
  // (and removed when retention drops the message). Opaque to callers.
  struct Blob;
  // A large publish in progress (PublishLarge): its bytes go to a file as they arrive.
  struct Upload;

  // A reader's position in one log, produced by OpenReader.
  struct Reader {
    std::shared_ptr<Log> log;
    int64_t next_offset = 0;
    int max_batch_messages = 4096;
    // Set by a read that returned a large message (always alone in its
    // batch): its payload, whose bytes ReadChunk copies out.
    std::shared_ptr<const Blob> chunked;
    bool local_files = false;  // the reader reads large payloads from their files itself
  };

  enum class ReadOutcome { kMessages, kIdle, kExpired };

  // Lets a SubscribeResponse point at stored messages instead of copying them
  // (the stream fast path). The response must not be cleared or destroyed
  // while it borrows; the lease takes the messages back out of it (without
  // freeing them) in Release() or its destructor. Not thread-safe.
  class Lease {
   public:
    explicit Lease(bus::v1::SubscribeResponse* out) : out_(out) {}
    ~Lease() { Release(); }
    Lease(const Lease&) = delete;
    Lease& operator=(const Lease&) = delete;
    void Release();

   private:
    friend class Broker;
    bus::v1::SubscribeResponse* out_;
    std::vector<std::shared_ptr<const bus::v1::Message>> held_;
  };

  Broker(BrokerOptions options, BusAcl acl, std::string secret, uint64_t incarnation);
  ~Broker();
  Broker(const Broker&) = delete;
  Broker& operator=(const Broker&) = delete;

  uint64_t incarnation() const { return incarnation_; }
  bool durable() const;

  // With a durable log: reads every log under options.log_dir back (torn
  // tails cut; each cut is a line of *notes, and so is a summary), restores
  // duplicate suppression from the stored messages, and starts the fsync
  // thread (kBatch). An error names the corrupt file and offset.
  Status Recover(std::vector<std::string>* notes);
  const BrokerOptions& options() const { return options_; }

  // Checks (agent, token) against the secret and the run's agents.
  // UNAUTHENTICATED names the agent (never the token). `incarnation`: the
  // launch the calling process belongs to (x-agentrt-incarnation; "" for a
  // client that is no agent's launch, such as agentrt-bus): once the
  // controller said which launch of `agent` is current (SetIncarnation), any
  // other is PERMISSION_DENIED "fenced: ...", so a rank cut off by a
  // network partition and still running cannot publish (or read) beside its
  // successor when the link heals.
  Status Authenticate(std::string_view agent, std::string_view token,
                      std::string_view incarnation = {});
  // The current launch of `agent` (AgentLaunch::incarnation, the checkpoint
  // fence's id), named by whoever embeds the broker and starts launches
  // (agentctl's broker reads the fences instead: BrokerOptions::current_launch).
  void SetIncarnation(const std::string& agent, const std::string& incarnation);
  // The fence part of Authenticate, for streams that outlive their first
  // check (each publish batch, each turn of a subscription). Allocates
  // nothing unless it refuses, or asks BrokerOptions::current_launch.
  Status CheckIncarnation(std::string_view agent, std::string_view incarnation) const;

  // Stores one message (its payload is moved out of `req`). Validates, checks
  // the ACL and `req.publisher` == `agent`, and suppresses duplicates.
  Status Publish(const std::string& agent, bus::v1::PublishRequest& req,
                 bus::v1::PublishResponse* resp);
  // Stores the entries in order, each checked as by Publish; consecutive
  // entries for one topic are stored under one lock. On the first failing
  // entry, returns its error; `resp->acks` then covers the entries before it.
  Status PublishBatch(const std::string& agent, bus::v1::PublishBatchRequest& req,
                      bus::v1::PublishBatchResponse* resp);
  Status Send(const std::string& agent, bus::v1::SendRequest& req, bus::v1::SendResponse* resp);

  // Large messages (bus.proto PublishLarge). BeginLarge checks the first
  // chunk as Publish checks a message (and the size against
  // max_message_bytes) and opens the payload's file; a duplicate is answered
  // in *resp at once and returns null. WriteLarge appends the next bytes;
  // FinishLarge stores the message once all of them arrived and match the
  // CRC (in the durable modes after an fdatasync of the file). An upload
  // dropped unfinished leaves nothing behind. Memory is bounded by the
  // caller's chunk, whatever the size.
  Result<std::shared_ptr<Upload>> BeginLarge(const std::string& agent, bus::v1::PublishChunk& first,
                                             bus::v1::PublishResponse* resp);
  Status WriteLarge(Upload& upload, std::string_view data);
  Status FinishLarge(Upload& upload, bus::v1::PublishResponse* resp);
  // The spool (bus.proto Spool): its absolute folder and the id in its
  // .spool-id file; both empty when the broker has none. With a topic, the
  // publish of `size` bytes there by `agent` is checked first (ACL, size).
  Status SpoolInfo(const std::string& agent, const bus::v1::SpoolRequest& req,
                   bus::v1::SpoolResponse* resp);
  // bus.proto AdoptLarge: checks the request as BeginLarge checks a first
  // chunk, then takes `agent`'s file from the spool (size and CRC32C
  // checked, renamed into the payload store) and stores it as FinishLarge
  // does. A file that does not become a message is removed.
  Status AdoptLarge(const std::string& agent, bus::v1::AdoptRequest& req,
                    bus::v1::PublishResponse* resp);
  // A publish `head` by `agent` already stored (its publisher id and
  // sequence seen): answered in *resp as a duplicate; true then.
  bool AnsweredAsDuplicate(const std::string& agent, const bus::v1::PublishRequest& head,
                           bus::v1::PublishResponse* resp);
  // ReapSpool, saying on stderr what it removed.
  void ReapSpoolAndSay();
  // `agent`'s spool file `name`, opened read-only: a regular file of this
  // user with one name (FAILED_PRECONDITION otherwise: the publisher sends
  // its bytes instead) and of `size` bytes (INVALID_ARGUMENT, and removed,
  // otherwise). `what` names the publish in errors.
  Result<int> OpenSpooled(const std::string& agent, const std::string& name, int64_t size,
                          const std::string& what);
  // A PublishBatch entry whose payload is a spool file (spooled_name): stored
  // as AdoptLarge stores it, or, by a durable broker, read and stored inline
  // as Publish stores it (`entry` is used up).
  Status AdoptSpooledEntry(const std::string& agent, bus::v1::PublishRequest& entry,
                           bus::v1::PublishResponse* resp);
  // How long an unlocked spool file must stay unchanged before ReapSpool
  // takes its publisher for gone.
  static constexpr std::chrono::seconds kSpoolStaleAfter{60};
  // Copies up to `max` bytes of the reader's large message (reader.chunked)
  // from byte `pos` into *out (resized to what was read).
  Status ReadChunk(const Reader& reader, int64_t pos, size_t max, std::string* out) const;
  // The absolute path of the reader's large message's file (for local_files readers).
  std::string ChunkedPath(const Reader& reader) const;

  // Opens a reader on a topic (ACL-checked) or on `agent`'s own inbox, and
  // fills the stream header.
  Result<Reader> OpenTopicReader(const std::string& agent, const bus::v1::SubscribeRequest& req,
                                 bus::v1::SubscribeResponse::Header* header);
  Result<Reader> OpenInboxReader(const std::string& agent, const bus::v1::ReceiveRequest& req,
                                 bus::v1::SubscribeResponse::Header* header);

  // Appends to `out` the messages from reader->next_offset on (up to the
  // batch caps) and advances it; waits up to `wait` when there are none.
  // kExpired: next_offset fell out of retention; *earliest is set.
  ReadOutcome Read(Reader* reader, std::chrono::milliseconds wait, bus::v1::SubscribeResponse* out,
                   int64_t* earliest);
  // The same, but the messages are borrowed into lease's response (no copy).
  ReadOutcome ReadBorrowed(Reader* reader, std::chrono::milliseconds wait, Lease* lease,
                           int64_t* earliest);

  // Request/Reply. Request stores the request in `req.to`'s inbox and blocks
  // until the reply, `deadline`, or `cancelled()` returns true (polled).
  Status Request(const std::string& agent, bus::v1::RequestRequest& req,
                 std::chrono::system_clock::time_point deadline,
                 const std::function<bool()>& cancelled, bus::v1::RequestResponse* resp);
  Status Reply(const std::string& agent, bus::v1::ReplyRequest& req);

  // Readers blocked in Read() on `topic` right now (for tests and diagnostics).
  int WaitingReaders(const std::string& topic);

  // The open subscriptions (streams register theirs): who reads which log, at
  // which offset, and the log's end then — a subscriber's lag is end - next.
  struct ReaderView {
    std::string agent;
    std::string log;
    int64_t next_offset = 0;
    int64_t end_offset = 0;
  };
  void Track(const Reader* reader, const std::string& agent);
  void Untrack(const Reader* reader);
  std::vector<ReaderView> Readers();

  // Topics `agent` may subscribe to (all topics when agent is empty); only
  // `only` when it is given (none when it does not exist or is not readable).
  std::vector<bus::v1::TopicInfo> ListTopics(const std::string& agent,
                                             const std::string& only = {});
  BusStats Stats() const;

  // Wakes every waiting reader and request; Read returns kIdle and Request
  // UNAVAILABLE from then on.
  void Shutdown();
  bool shutting_down() const { return shutdown_.load(std::memory_order_acquire); }

  void CountInvalid() { rejected_invalid_.fetch_add(1, std::memory_order_relaxed); }
  // A request's validation: an error is counted and said with `what()`'s
  // context (called only then, so the valid path builds no string).
  template <typename What>
  Status CheckValid(Status validated, const What& what) {
    if (validated.ok()) return validated;
    CountInvalid();
    return validated.WithContext(what());
  }
  void StreamOpened() { active_streams_.fetch_add(1, std::memory_order_relaxed); }
  void StreamClosed() { active_streams_.fetch_sub(1, std::memory_order_relaxed); }

 private:
  struct Stored {
    int64_t offset = -1;
    bool duplicate = false;
    Status status;  // not ok: not stored (the durable log refused it)
  };

  std::shared_ptr<Log> GetLog(const std::string& name, bool create);
  // Appends msg (publisher fields already stamped) with duplicate suppression.
  Stored Append(const std::shared_ptr<Log>& log, bus::v1::Message&& msg,
                std::shared_ptr<Blob> blob = nullptr);
  // Where a log's large payloads are written: its durable log folder, or
  // (memory) the spill folder.
  std::string BlobDir(const Log& log) const;
  // Recover's part for one log's large messages: opens each payload's file
  // (DATA_LOSS when missing or short) and removes files no message names.
  Status RecoverBlobs(Log& log, const std::string& dir, std::vector<std::string>* notes);
  // What a large publish's head must pass (its limits, the publisher's
  // fields, the ACL) before any byte is taken: PrepareLarge's and Spool's.
  Status CheckLargeHead(const std::string& agent, const bus::v1::PublishChunk& first);
  // What BeginLarge and AdoptLarge share: CheckLargeHead, and a retry's
  // duplicate (answered in *resp; null returned).
  Result<std::shared_ptr<Upload>> PrepareLarge(const std::string& agent,
                                               bus::v1::PublishChunk& first,
                                               bus::v1::PublishResponse* resp);
  // Recover's part for the spool: emptied (what publishers that died left
  // there), made 0700, and given a fresh .spool-id.
  Status MakeSpool();
  // Recover's part for a broker without log_dir: its own spill folder under
  // options_.spill_root, after removing those of brokers that were killed.
  Status MakeOwnSpillDir();
  // Removes spool files whose publisher is gone: no writer holds their lock
  // (a publisher holds one until its adoption is answered) and they have not
  // changed for kSpoolStaleAfter. Runs before an adoption, at most once
  // every options_.spool_reap_every, so a long run whose publishers get
  // killed does not fill the spool and a busy one does not list it per
  // publish. Returns how many.
  int ReapSpool();
  Result<Reader> OpenReader(std::shared_ptr<Log> log, const bus::v1::StartAt& start,
                            uint64_t incarnation, int max_batch, bool local_files,
                            bus::v1::SubscribeResponse::Header* header);
  Status Deny(std::string message);
  // Read's common part: the next batch's messages, or kIdle/kExpired.
  ReadOutcome Collect(Reader* reader, std::chrono::milliseconds wait,
                      std::vector<std::shared_ptr<const bus::v1::Message>>* batch,
                      int64_t* earliest);
  // Validation, publisher field and (when check_acl) ACL of one publish; no state change.
  Status CheckPublish(const std::string& agent, const bus::v1::PublishRequest& req,
                      bool check_acl = true);
  // The ACL's answer to `agent` publishing to `topic` (PERMISSION_DENIED, counted).
  Status CheckMayPublish(const std::string& agent, const std::string& topic);
  // Stores `count` checked entries of one topic and publisher_id (a run of
  // a PublishBatch; `run` gives each entry's sequence and fills its message)
  // under one lock of the topic's log, answered in *resp: an ack each (a
  // duplicate's names its first offset), or for packed entries
  // (Run::kAnswersAsRun) the run stored first at consecutive offsets
  // (`first_offset`, `stored`) and an ack each from its first duplicate.
  // *answered: the entries answered; *refused: the durable log's refusal
  // that stopped the run after them (ok: none). A failed SyncForAck is
  // returned, the run's answers removed.
  template <typename Run>
  Status StoreRun(const std::string& agent, const std::string& topic, uint64_t publisher_id,
                  int count, Run& run, bus::v1::PublishBatchResponse* resp, int* answered,
                  Status* refused);
  // Under log->mu: appends one message (to the durable log first, when there
  // is one) and sets *offset; `blob` holds a large message's payload.
  // TrimLocked drops what retention no longer allows.
  Status AppendLocked(Log& log, std::shared_ptr<bus::v1::Message> msg, int64_t* offset,
                      std::shared_ptr<Blob> blob = nullptr);
  // Under log->mu: writes what AppendLocked staged (one write(2) for a batch);
  // on an error Unstorable drops the unwritten messages from memory again.
  Status CommitLocked(Log& log);
  Status Unstorable(Log& log, const Status& why);
  void TrimLocked(Log& log);
  // Under log.mu: forgets the large payload stored at `offset` and removes its file's name.
  void DropBlob(Log& log, int64_t offset);
  // kAlways: makes log's appended records durable before an acknowledgement.
  Status SyncForAck(Log& log);
  void FlushLoop();
  std::vector<std::shared_ptr<Log>> AllLogs() const;

  const BrokerOptions options_;
  AccessCache access_;
  const uint64_t incarnation_;
  std::atomic<bool> shutdown_{false};

  mutable std::shared_mutex logs_mu_;
  std::map<std::string, std::shared_ptr<Log>> logs_;

  PublisherTable publishers_;

  mutable std::shared_mutex launches_mu_;
  mutable std::map<std::string, std::string, std::less<>>
      launches_;  // agent -> current incarnation
  // What BrokerOptions::current_launch said of an agent (under launches_mu_):
  // one asker at a time (`mu`), when it was last asked (the current launch
  // is taken on its word for kCurrentKept, then the fence is read again, so a
  // launch its successor replaced is refused at most that long after the
  // successor's fence was written, even before the successor calls), the
  // launches it replaced (never current again) and those it refused, refused
  // again without asking for kRefusalKept (a replaced launch's every call
  // would read the fence). At most kMaxLaunchesKept of each, then forgotten.
  struct Asked {
    std::unique_ptr<std::mutex> mu;
    std::chrono::steady_clock::time_point read_at{};
    std::set<std::string, std::less<>> replaced;
    std::map<std::string, std::chrono::steady_clock::time_point, std::less<>> refused;
  };
  static constexpr size_t kMaxLaunchesKept = 64;
  static constexpr std::chrono::seconds kRefusalKept{1};
  static constexpr std::chrono::seconds kCurrentKept{1};
  mutable std::map<std::string, Asked, std::less<>> asked_;

  std::mutex readers_mu_;                         // before any log's mu
  std::map<const Reader*, std::string> readers_;  // -> agent

  RequestTable requests_;

  std::string spill_dir_;       // memory mode: where large payloads go (see BlobDir)
  bool own_spill_dir_ = false;  // made by Recover, removed by the destructor
  SharedNodeDir own_spill_;     // the own spill folder, held while the broker lives
  std::string spool_dir_;       // where publishers write payloads to adopt (removed at the end)
  std::string spool_id_;
  std::atomic<int64_t> spool_reaped_at_{0};  // steady_clock ticks of ReapSpool's last pass

  std::thread flusher_;  // kBatch fsyncs, age retention
  std::mutex flush_mu_;
  std::condition_variable flush_cv_;
  std::atomic<int64_t> sync_errors_{0};

  std::atomic<int64_t> published_{0}, duplicates_{0}, delivered_{0}, expired_{0},
      retained_bytes_{0}, active_streams_{0}, rejected_unauthenticated_{0}, rejected_permission_{0},
      rejected_invalid_{0}, large_adopted_{0}, large_streamed_{0};
  // Payload files open (Blob); see BrokerOptions::max_open_payload_files.
  std::shared_ptr<std::atomic<int64_t>> open_payload_files_ =
      std::make_shared<std::atomic<int64_t>>(0);
  int64_t max_open_payload_files_ = 0;
};

// The inbox log name of an agent: "@inbox/<agent>".

}  // namespace agentrt
