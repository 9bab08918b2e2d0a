// The bus's durable log: one topic's (or inbox's) messages as append-only
// segment files on disk, so a broker that restarts — a SLURM requeue,
// `agentctl resume`, a crashed controller — serves the same offsets again.
//
//   <dir>/<escaped log name>/<base offset, 20 digits>.seg
//
// A segment starts with an 8-byte magic and holds records
//   [u32 body length][u32 CRC32C of body][body: the serialized bus.v1.Message]
// (little-endian) for consecutive offsets from its base. Only the newest
// segment is written; a new one starts when it would pass segment_bytes.
// Retention deletes whole segments below the broker's earliest offset.
//
// Recovery (SegmentLog::Open) reads every segment in order and checks each
// record. A record cut short or failing its CRC at the very end of the newest
// segment is a torn tail (a write the crash interrupted): it is cut off and
// reported. Anything else that does not check — a bad record with data after
// it, a gap between segments, an offset out of sequence — is an error naming
// the file, the byte position and the offset: never skipped.
//
// Thread-safety: Append and DropBefore are called under the owner's lock for
// this log (the broker's Log::mu); Sync may be called from any thread at any
// time, concurrently with them.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/status.h"
#include "comms/proto/bus.pb.h"

namespace agentrt {

enum class BusDurability {
  kMemory,  // no files: the log lives as long as the broker
  kBatch,   // written at once, fsynced at least every fsync_interval_ms
  kAlways,  // a publish is acknowledged once its record is fsynced
};
// "memory" | "batch" | "always".
Result<BusDurability> ParseBusDurability(std::string_view text);
std::string_view BusDurabilityName(BusDurability d);

// A log's folder name: every byte outside [A-Za-z0-9_-] as %XX, so "." and
// "/" never reach the file system ("policies/prey" -> "policies%2Fprey").
std::string EscapeLogName(std::string_view name);
Result<std::string> UnescapeLogName(std::string_view escaped);

class SegmentLog {
 public:
  struct Recovered {
    int64_t base = 0;  // offset of messages.front() (or the end, when empty)
    std::vector<bus::v1::Message> messages;
    std::string torn;  // non-empty: what was cut off, and where
  };

  // Opens (creating when absent) the folder `dir` of one log and reads it back.
  static Result<std::unique_ptr<SegmentLog>> Open(std::string dir, int64_t segment_bytes,
                                                  Recovered* recovered);
  ~SegmentLog();
  SegmentLog(const SegmentLog&) = delete;
  SegmentLog& operator=(const SegmentLog&) = delete;

  // Stages m (m.offset() must be the next offset) for the newest segment,
  // starting a new one first when it would pass segment_bytes (which writes
  // what was staged before). Commit writes every staged record with one
  // write(2); on an error (disk full) none of them stays in the file and
  // committed_end() says where the log ends.
  Status Stage(const bus::v1::Message& m);
  Status Commit();
  int64_t committed_end() const;
  // Makes everything appended before the call durable (fdatasync). Concurrent
  // callers share one fdatasync.
  Status Sync();
  // True when something appended is not yet synced.
  bool Dirty() const;
  // Deletes the segments all of whose offsets are below `earliest`.
  void DropBefore(int64_t earliest);
  const std::string& dir() const { return dir_; }
  int64_t segments() const;

 private:
  struct Segment;
  SegmentLog(std::string dir, int64_t segment_bytes);
  Status Roll(int64_t base);

  const std::string dir_;
  const int64_t segment_bytes_;
  mutable std::mutex mu_;                           // segments_, end_, written_
  std::vector<std::shared_ptr<Segment>> segments_;  // by base; back() is written
  int64_t end_ = 0;                                 // next offset in the file
  int64_t staged_end_ = 0;                          // next offset to stage
  uint64_t written_ = 0;                            // records written, ever (Sync's ticket)
  std::string pending_;                             // staged records, not yet written (reused)
  Status broken_;       // set after a failed fsync or cut: every later write fails with it
  std::mutex sync_mu_;  // one Sync at a time
  std::atomic<uint64_t> synced_{0};  // records durable
};

}  // namespace agentrt
