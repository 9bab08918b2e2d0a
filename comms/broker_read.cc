// The broker's readers: where a subscription reads from, how it waits for
// more, and the list of them the status shows.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>

#include "common/crc32c.h"
#include "common/file_util.h"
#include "comms/broker_internal.h"
#include "fmt/format.h"
#include "plan/run_dir.h"

namespace agentrt {

using namespace broker_internal;  // NOLINT(google-build-using-namespace): its own insides

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
  AGENTRT_RETURN_IF_ERROR(CheckValid(ValidateSubscribe(req, options_.limits),
                                     [&] { return "subscribe by agent " + agent; }));
  if (!access_.acl().MaySubscribe(agent, req.topic())) {
    return Deny("agent " + agent + " may not subscribe to topic \"" + req.topic() +
                "\" (no channel in the plan lists it as a subscriber)");
  }
  return OpenReader(GetLog(req.topic(), true), req.start(), req.incarnation(),
                    req.max_batch_messages(), req.local_files(), header);
}

Result<Broker::Reader> Broker::OpenInboxReader(const std::string& agent,
                                               const v1::ReceiveRequest& req,
                                               v1::SubscribeResponse::Header* header) {
  AGENTRT_RETURN_IF_ERROR(CheckValid(ValidateReceive(req, options_.limits),
                                     [&] { return "receive by agent " + agent; }));
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

}  // namespace agentrt
