// agentrt::WeightStream — an agent's policy weights, published as numbered
// versions on the bus and read by other agents (league opponents, self-play).
//
//   WeightStream out(*bus, "prey-0");                 // topic "weights/prey-0"
//   AGENTRT_ASSIGN_OR_RETURN(int64_t v, out.Publish({{"fc.w", "float32", {256, 64}, w}}, step));
//   WeightStream in(*bus, "prey-0");
//   AGENTRT_ASSIGN_OR_RETURN(auto set, in.Latest(timeout));     // the newest version
//   set = in.WaitNewer(set->version(), timeout);                // the next one to come
//   set = in.At(v, timeout);                                    // a pinned version
//   const float* w = static_cast<const float*>(set->Data(*set->Find("fc.w")));
//
// A stream is a bus topic ("weights/<name>"): the plan's channels say who may
// publish and subscribe, `bus.durability` how it is kept, and a channel's
// `keep_last` how many versions stay (the oldest are removed, their bytes
// with the last reader's mapping). Version N is the topic's offset N - 1, so
// versions go 1, 2, 3 ... per bus incarnation, and a subscriber's position is
// a bus offset like any other.
//
// On the broker's node a version is written once, by the publisher, into a
// file the broker takes over (BusClient::PublishLargeFrom); a subscriber
// there maps that file read-only and WeightSet's tensors are views of the
// mapping (checked against the payload's CRC32C when opened). Elsewhere the
// bytes are streamed, and the set owns them. Publish returns once the
// version is stored; it never waits for subscribers.
//
// PublishAsync returns sooner: once the bytes are copied into the stream's
// next slot (BusClient::ReserveLarge: on the broker's node its next spool
// file, mapped), which a background thread made ready after the version
// before, every page faulted in, so the caller's wait is one memcpy. The
// thread then has the version stored and readies the next slot. At most one
// version is in flight and one slot ready, so a publisher never holds more
// than two versions' bytes, however slow the broker or its disk (two more
// with delta versions: the version kept as the next delta's base, and a copy
// of the one being stored). A slot that
// waits past the kernel's write-back of dirty pages (30 s by default) is
// written back as zeros and its pages fault again on the copy (about 2x a
// memcpy then).
//
// The payload (content type kWeightsContentType):
//   "AGRTWTS1" | u64 (little-endian) length of the header | the header, JSON:
//   {"stream", "agent", "step", "incarnation", "tensors": [{"name", "dtype",
//   "shape", "offset", "bytes"}]} | tensor bytes, each at a 64-byte aligned
//   offset from the payload's start.
//
// Thread-safety: a WeightStream may be used from several threads; a WeightSet
// is immutable.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "common/status.h"
#include "comms/bus_client.h"

namespace agentrt {

inline constexpr const char* kWeightsContentType = "application/x-agentrt-weights";
inline constexpr size_t kWeightsAlignment = 64;
// How long a publish waits for its version to be stored, unless told.
inline constexpr std::chrono::milliseconds kWeightsPublishTimeout = std::chrono::seconds(60);

// The bus topic of stream `name`.
std::string WeightStreamTopic(std::string_view name);

// One tensor to publish: `bytes` bytes at `data` (row-major), tagged with a
// dtype name ("float32", "bfloat16", ...) and a shape.
struct WeightTensor {
  std::string name;
  std::string dtype;
  std::vector<int64_t> shape;
  const void* data = nullptr;
  size_t bytes = 0;
};

// One version as read.
class WeightSet {
 public:
  struct Entry {
    std::string name;
    std::string dtype;
    std::vector<int64_t> shape;
    size_t offset = 0;  // from the payload's start
    size_t bytes = 0;
  };
  ~WeightSet();
  WeightSet(const WeightSet&) = delete;
  WeightSet& operator=(const WeightSet&) = delete;

  int64_t version() const { return version_; }
  const std::string& stream() const { return stream_; }
  const std::string& agent() const { return agent_; }  // the publishing agent (authenticated)
  int64_t step() const { return step_; }
  int64_t incarnation() const { return incarnation_; }  // the publisher's restart count
  const std::vector<Entry>& entries() const { return entries_; }
  const Entry* Find(std::string_view name) const;
  const void* Data(const Entry& e) const { return base_ + e.offset; }
  // The whole payload (header included).
  const char* payload() const { return base_; }
  size_t payload_size() const { return size_; }
  // true: the tensors are views of the broker's file, mapped read-only.
  bool mapped() const { return map_ != nullptr; }
  // That file (its name may already be gone: retention; the mapping stays).
  const std::string& path() const { return path_; }

  // Reads a payload (header checks: DataLoss naming `what` when bad). Public
  // for the C API and tests; WeightStream is the way to get one.
  // A streamed payload is moved out of `m`, not copied.
  static Result<std::shared_ptr<const WeightSet>> FromMessage(BusMessage m, int64_t version);

 private:
  WeightSet() = default;
  Status Parse(std::string_view what);

  int64_t version_ = 0;
  std::string stream_, agent_, path_;
  int64_t step_ = 0, incarnation_ = 0;
  std::vector<Entry> entries_;
  std::string owned_;    // streamed bytes
  void* map_ = nullptr;  // or the mapping
  const char* base_ = nullptr;
  size_t size_ = 0;
};

// The bytes of a version: header then aligned tensors. Exposed so that the
// C API and tests lay out the same payload.
struct WeightLayout {
  std::string header;           // magic, length and JSON, padded to the alignment
  std::vector<size_t> offsets;  // of each tensor
  size_t size = 0;              // the whole payload
};
WeightLayout LayOutWeights(std::string_view stream, std::string_view agent, int64_t step,
                           int64_t incarnation, const std::vector<WeightTensor>& tensors);
// Writes the payload laid out as `layout` (layout.size bytes) to `out`: the
// header, each tensor at its offset, zeros between.
void CopyWeights(const WeightLayout& layout, const std::vector<WeightTensor>& tensors, char* out);
// A whole payload, for a version published as an ordinary message (content
// type kWeightsContentType) on WeightStreamTopic(stream): what a small
// version costs, without a stream's slots (the league's policy snapshots).
std::string EncodeWeights(std::string_view stream, std::string_view agent, int64_t step,
                          int64_t incarnation, const std::vector<WeightTensor>& tensors);

struct WeightStreamOptions {
  // Delta versions (comms/weight_delta.h). A publisher: after each version,
  // also publish its difference to the version before on the stream's delta
  // topic, when both have the same size (it keeps the version before: one
  // version's bytes). A reader: once it holds version N, it reads N + 1 from
  // its delta when there is one, and whole when there is none or the result
  // does not match the version's CRC32C (counted in stats()).
  bool delta = false;
};

// What a stream did with delta versions.
struct WeightStreamStats {
  int64_t deltas_published = 0;
  int64_t delta_bytes_published = 0;
  int64_t deltas_not_published = 0;  // the delta's publish failed (readers read whole)
  int64_t versions_from_delta = 0;   // read by applying a delta
  int64_t delta_bytes_read = 0;
  int64_t delta_mismatches = 0;  // a delta whose result was not the version: read whole
  int64_t whole_bytes_read = 0;  // of versions read whole and not mapped (streamed to this process)
  // Off the broker's node: versions mapped from the file another process of
  // this node fetched (BusClient::NodeCacheDir), no byte streamed here.
  int64_t versions_from_node_cache = 0;
};

// The delta topic of stream `name`: "weights-delta/<name>".
std::string WeightDeltaTopic(std::string_view name);

class WeightStream {
 public:
  // `incarnation`: what versions published from here carry (the agent's
  // restart count; AgentEnv::restart_count).
  WeightStream(BusClient& bus, std::string name, int64_t incarnation = 0,
               WeightStreamOptions options = {});
  // Waits for a version PublishAsync still has in flight (the broker's
  // answer is awaited up to the publish's timeout); a failure no Flush
  // reported is written to stderr. A stream goes before its BusClient.
  ~WeightStream();
  WeightStream(const WeightStream&) = delete;
  WeightStream& operator=(const WeightStream&) = delete;

  const std::string& name() const { return name_; }
  BusClient& bus() const { return bus_; }
  WeightStreamStats stats() const;
  const std::string& topic() const { return topic_; }
  int64_t incarnation() const { return incarnation_; }
  const WeightStreamOptions& options() const { return options_; }

  // Stores a new version; returns its number. DeadlineExceeded leaves it
  // unknown whether the version was stored (the broker may still be taking
  // it over): Latest() says which version is the newest.
  Result<int64_t> Publish(const std::vector<WeightTensor>& tensors, int64_t step,
                          std::chrono::milliseconds timeout = kWeightsPublishTimeout);
  // Copies the tensors into the stream's next slot and returns; the version
  // is stored in the background (Flush says its number). A call while the
  // version before is still in flight waits for it first. If that one
  // failed, this call says so and publishes nothing. A call that finds no
  // slot of its payload's size ready readies its own (as long as Publish
  // takes): the stream's first, one after a failure, and one whose size
  // changed (a tensor's shape, or the header growing by a digit of the step
  // across a 64-byte boundary).
  Status PublishAsync(const std::vector<WeightTensor>& tensors, int64_t step,
                      std::chrono::milliseconds timeout = kWeightsPublishTimeout);
  // Waits until PublishAsync's version is stored (and the next slot ready);
  // returns its number (0 before the first), or why it was not stored.
  Result<int64_t> Flush(std::chrono::milliseconds timeout);

  // The newest version's number (0 when the stream has none), not read.
  Result<int64_t> Newest();
  // The newest version (NotFound when the stream has none).
  Result<std::shared_ptr<const WeightSet>> Latest(std::chrono::milliseconds timeout);
  // The newest version after `version`, waiting up to `timeout` for one
  // (DeadlineExceeded).
  Result<std::shared_ptr<const WeightSet>> WaitNewer(int64_t version,
                                                     std::chrono::milliseconds timeout);
  // Exactly `version` (NotFound when keep_last or retention removed it, or
  // it does not exist yet).
  Result<std::shared_ptr<const WeightSet>> At(int64_t version, std::chrono::milliseconds timeout);

 private:
  // {earliest, end} offsets of the topic ({0, 0} before its first version).
  Result<std::pair<int64_t, int64_t>> Bounds();
  Result<std::shared_ptr<const WeightSet>> Read(int64_t version, std::chrono::milliseconds wait);
  static void PauseBeforeRetry(int attempt, std::chrono::steady_clock::time_point deadline);

  // The tensors checked and laid out for step `step`.
  Result<WeightLayout> LayOut(const std::vector<WeightTensor>& tensors, int64_t step) const;
  PublishOptions Options(std::chrono::milliseconds timeout) const;
  // Delta versions: publishes the delta of version `version` (`payload`)
  // to the one kept before it, then keeps `payload`.
  void PublishDelta(int64_t version, std::string payload);
  // Version `version` from its delta and `held` (version - 1), checked
  // against `stored` (the version's record: size, CRC32C, publisher);
  // NotFound when it has no delta, DataLoss when the delta is not of it.
  Result<std::shared_ptr<const WeightSet>> ReadDelta(int64_t version, const WeightSet& held,
                                                     const BusMessage& stored);
  // Version `version` (`stored`: the broker's record of it, no bytes) off
  // the broker's node: mapped from this node's folder `dir` when another
  // process fetched it, else fetched whole here (`fetch_whole`) by one
  // process at a time and left there for the others.
  Result<std::shared_ptr<const WeightSet>> ReadThroughNodeCache(
      int64_t version, const BusMessage& stored, const std::string& dir,
      const std::function<Result<BusMessage>()>& fetch_whole,
      std::chrono::steady_clock::time_point deadline);
  // A delta reader's next rebuild goes into spare_, a buffer of `size`
  // bytes that a thread of its own faults in meanwhile (fresh memory's page
  // faults cost several times the rebuild). Called with delta_mu_ held.
  void PrepareSpare(size_t size);
  // `set` read whole (`streamed` bytes reached this process), counted and,
  // for a delta reader, held.
  Result<std::shared_ptr<const WeightSet>> Kept(Result<std::shared_ptr<const WeightSet>> set,
                                                int64_t streamed);
  struct Async;             // PublishAsync's slot and background thread (weight_stream.cc)
  Async& StartAsync();      // async_, its thread started on first use
  void RunAsync(Async& a);  // that thread

  BusClient& bus_;
  std::string name_, topic_;
  int64_t incarnation_;
  WeightStreamOptions options_;
  std::string delta_topic_;
  std::mutex base_mu_;  // guards base_, base_version_ (one delta after the other)
  std::string base_;    // the publisher's last version (delta)
  int64_t base_version_ = 0;
  mutable std::mutex delta_mu_;            // guards held_ and stats_
  std::shared_ptr<const WeightSet> held_;  // the reader's last version (delta)
  std::string spare_;                      // and its next rebuild's buffer
  bool spare_busy_ = false;                // spare_thread_ is faulting one in
  std::thread spare_thread_;
  WeightStreamStats stats_;
  std::mutex async_mu_;    // guards async_
  std::mutex publish_mu_;  // orders PublishAsync callers
  std::unique_ptr<Async> async_;
};

}  // namespace agentrt
