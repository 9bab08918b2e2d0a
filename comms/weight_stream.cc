#include "comms/weight_stream.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <thread>
#include <utility>

#include "common/crc32c.h"
#include "common/file_util.h"
#include "comms/auth.h"
#include "comms/weight_delta.h"
#include "comms/weight_framing.h"

namespace agentrt {

namespace {

constexpr std::string_view kMagic = "AGRTWTS1";

std::chrono::milliseconds Left(std::chrono::steady_clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
      deadline - std::chrono::steady_clock::now());
  return std::max(left, std::chrono::milliseconds(1));
}

bool HasNegativeDimension(const std::vector<int64_t>& shape) {
  return std::any_of(shape.begin(), shape.end(), [](int64_t d) { return d < 0; });
}

size_t AlignUp(size_t n) {
  return (n + kWeightsAlignment - 1) / kWeightsAlignment * kWeightsAlignment;
}

}  // namespace

std::string WeightStreamTopic(std::string_view name) {
  return std::string(kWeightsTopicPrefix) + std::string(name);
}

std::string WeightDeltaTopic(std::string_view name) {
  return std::string(kWeightsDeltaTopicPrefix) + std::string(name);
}

WeightLayout LayOutWeights(std::string_view stream, std::string_view agent, int64_t step,
                           int64_t incarnation, const std::vector<WeightTensor>& tensors) {
  // Offsets depend on the header's length, which depends on the offsets'
  // digits: lay out with the header's length as it grows until it holds.
  WeightLayout out;
  size_t data_start = 0;
  for (;;) {
    nlohmann::json list = nlohmann::json::array();
    size_t at = data_start;
    out.offsets.clear();
    for (const auto& t : tensors) {
      out.offsets.push_back(at);
      list.push_back({{"name", t.name},
                      {"dtype", t.dtype},
                      {"shape", t.shape},
                      {"offset", at},
                      {"bytes", t.bytes}});
      at = AlignUp(at + t.bytes);
    }
    const std::string json = nlohmann::json{
        {"stream", stream},
        {"agent", agent},
        {"step", step},
        {"incarnation", incarnation},
        {"tensors", list}}.dump();
    const size_t need = AlignUp(kWeightFrameHead + json.size());
    if (need <= data_start) {
      out.header = FrameWeightHeader(kMagic, json);
      out.header.resize(data_start, '\0');
      out.size = tensors.empty() ? data_start : out.offsets.back() + tensors.back().bytes;
      return out;
    }
    data_start = need;
  }
}

void CopyWeights(const WeightLayout& layout, const std::vector<WeightTensor>& tensors, char* out) {
  std::memcpy(out, layout.header.data(), layout.header.size());
  size_t at = layout.header.size();
  for (size_t i = 0; i < tensors.size(); ++i) {
    std::memset(out + at, 0, layout.offsets[i] - at);
    if (tensors[i].bytes > 0)
      std::memcpy(out + layout.offsets[i], tensors[i].data, tensors[i].bytes);
    at = layout.offsets[i] + tensors[i].bytes;
  }
}

std::string EncodeWeights(std::string_view stream, std::string_view agent, int64_t step,
                          int64_t incarnation, const std::vector<WeightTensor>& tensors) {
  const WeightLayout layout = LayOutWeights(stream, agent, step, incarnation, tensors);
  std::string out(layout.size, '\0');
  CopyWeights(layout, tensors, out.data());
  return out;
}

WeightSet::~WeightSet() {
  if (map_ != nullptr) ::munmap(map_, size_);
}

const WeightSet::Entry* WeightSet::Find(std::string_view name) const {
  for (const auto& e : entries_) {
    if (e.name == name) return &e;
  }
  return nullptr;
}

Status WeightSet::Parse(std::string_view what) {
  auto bad = [&](const std::string& why) {
    return DataLoss(std::string(what) + ": not a weights payload: " + why);
  };
  const std::string where = std::string(what) + ": not a weights payload";
  AGENTRT_ASSIGN_OR_RETURN(const std::string_view header,
                           FramedWeightHeader(std::string_view(base_, size_), kMagic, where));
  const size_t n = header.size();
  const auto json = nlohmann::json::parse(header, nullptr, /*allow_exceptions=*/false);
  if (!json.is_object() || !json.contains("tensors") || !json["tensors"].is_array())
    return bad("its header is not a JSON object with a tensors list");
  try {
    stream_ = json.at("stream").get<std::string>();
    step_ = json.at("step").get<int64_t>();
    incarnation_ = json.at("incarnation").get<int64_t>();
    for (const auto& t : json["tensors"]) {
      Entry e;
      e.name = t.at("name").get<std::string>();
      e.dtype = t.at("dtype").get<std::string>();
      e.shape = t.at("shape").get<std::vector<int64_t>>();
      e.offset = t.at("offset").get<size_t>();
      e.bytes = t.at("bytes").get<size_t>();
      if (HasNegativeDimension(e.shape))
        return bad("tensor \"" + e.name + "\" has a negative dimension");
      if (e.offset % kWeightsAlignment != 0 || e.offset < kWeightFrameHead + n ||
          e.offset > size_ || e.bytes > size_ - e.offset)
        return bad("tensor \"" + e.name + "\" lies outside the payload or is not aligned");
      entries_.push_back(std::move(e));
    }
  } catch (const nlohmann::json::exception& ex) {
    return bad(std::string("its header: ") + ex.what());
  }
  return Status::Ok();
}

Result<std::shared_ptr<const WeightSet>> WeightSet::FromMessage(BusMessage m, int64_t version) {
  std::shared_ptr<WeightSet> set(new WeightSet());
  set->version_ = version;
  set->agent_ = m.publisher();
  const std::string what =
      "weights version " + std::to_string(version) + " of topic \"" + m.topic() + "\"";
  if (!m.chunked_path().empty()) {
    set->path_ = m.chunked_path();
    const int fd = ::open(set->path_.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
      const int err = errno;
      return Status(err == ENOENT ? StatusCode::kNotFound : StatusCode::kUnavailable,
                    what + ": cannot open " + set->path_ + ": " + std::strerror(err));
    }
    struct stat st {};
    if (::fstat(fd, &st) != 0 || st.st_size != m.chunked_size()) {
      ::close(fd);
      return DataLoss(what + ": " + set->path_ + " does not hold its " +
                      std::to_string(m.chunked_size()) + " bytes");
    }
    set->size_ = static_cast<size_t>(st.st_size);
    void* map = ::mmap(nullptr, set->size_, PROT_READ, MAP_SHARED, fd, 0);
    ::close(fd);
    if (map == MAP_FAILED) return ErrnoStatus(errno, what + ": cannot map " + set->path_);
    set->map_ = map;
    set->base_ = static_cast<const char*>(map);
    if (Crc32c(set->base_, set->size_) != m.chunked_crc32c())
      return DataLoss(what + ": " + set->path_ + " does not match its CRC32C");
  } else {
    set->owned_ = std::move(*m.mutable_payload());
    set->base_ = set->owned_.data();
    set->size_ = set->owned_.size();
  }
  AGENTRT_RETURN_IF_ERROR(set->Parse(what));
  return std::shared_ptr<const WeightSet>(std::move(set));
}

// PublishAsync's state: the version in flight, the next slot, and the
// thread that stores the one and readies the other.
struct WeightStream::Async {
  std::mutex mu;
  std::condition_variable cv;
  bool stop = false;
  bool busy = false;                         // storing `filled`, then readying `ready`
  std::unique_ptr<LargePayloadSlot> filled;  // the version to store
  std::unique_ptr<LargePayloadSlot> ready;   // the next slot
  PublishOptions opts;                       // of `filled`
  std::optional<Status> failed;              // a failure not reported yet
  int64_t stored = 0;                        // the newest version it stored
  std::thread thread;
};

WeightStream::WeightStream(BusClient& bus, std::string name, int64_t incarnation,
                           WeightStreamOptions options)
    : bus_(bus),
      name_(std::move(name)),
      topic_(WeightStreamTopic(name_)),
      incarnation_(incarnation),
      options_(options),
      delta_topic_(WeightDeltaTopic(name_)) {}

WeightStreamStats WeightStream::stats() const {
  std::lock_guard<std::mutex> lock(delta_mu_);
  return stats_;
}

WeightStream::~WeightStream() {
  if (spare_thread_.joinable()) spare_thread_.join();
  if (async_ == nullptr) return;
  {
    std::lock_guard<std::mutex> lock(async_->mu);
    async_->stop = true;
  }
  async_->cv.notify_all();
  async_->thread.join();  // after the version in flight, if any
  if (async_->failed) {
    std::fprintf(stderr, "agentrt: weights stream \"%s\": a version was not stored: %s\n",
                 name_.c_str(), async_->failed->ToString().c_str());
  }
}

Result<WeightLayout> WeightStream::LayOut(const std::vector<WeightTensor>& tensors,
                                          int64_t step) const {
  for (const auto& t : tensors) {
    if (HasNegativeDimension(t.shape))
      return InvalidArgument("weights of stream \"" + name_ + "\": tensor \"" + t.name +
                             "\" has a negative dimension");
    if (t.data == nullptr && t.bytes > 0)
      return InvalidArgument("weights of stream \"" + name_ + "\": tensor \"" + t.name +
                             "\" has no data");
  }
  return LayOutWeights(name_, bus_.agent(), step, incarnation_, tensors);
}

PublishOptions WeightStream::Options(std::chrono::milliseconds timeout) const {
  PublishOptions opts;
  opts.content_type = kWeightsContentType;
  opts.timeout = timeout;
  return opts;
}

Result<int64_t> WeightStream::Publish(const std::vector<WeightTensor>& tensors, int64_t step,
                                      std::chrono::milliseconds timeout) {
  AGENTRT_ASSIGN_OR_RETURN(const WeightLayout layout, LayOut(tensors, step));
  static const char kZeros[kWeightsAlignment] = {};
  auto fill = [&](LargePayloadWriter& w) -> Status {
    AGENTRT_RETURN_IF_ERROR(w.Append(layout.header.data(), layout.header.size()));
    size_t at = layout.header.size();
    for (size_t i = 0; i < tensors.size(); ++i) {
      AGENTRT_RETURN_IF_ERROR(w.Append(kZeros, layout.offsets[i] - at));
      AGENTRT_RETURN_IF_ERROR(w.Append(tensors[i].data, tensors[i].bytes));
      at = layout.offsets[i] + tensors[i].bytes;
    }
    return Status::Ok();
  };
  if (!options_.delta) {
    AGENTRT_ASSIGN_OR_RETURN(PublishAck ack,
                             bus_.PublishLargeFrom(topic_, layout.size, fill, Options(timeout)));
    return ack.offset + 1;
  }
  // Delta versions: the payload laid out here too, kept for the next delta.
  std::string payload(layout.size, '\0');
  CopyWeights(layout, tensors, payload.data());
  auto copy = [&](LargePayloadWriter& w) { return w.Append(payload.data(), payload.size()); };
  AGENTRT_ASSIGN_OR_RETURN(PublishAck ack,
                           bus_.PublishLargeFrom(topic_, layout.size, copy, Options(timeout)));
  PublishDelta(ack.offset + 1, std::move(payload));
  return ack.offset + 1;
}

void WeightStream::PublishDelta(int64_t version, std::string payload) {
  std::lock_guard<std::mutex> chain(base_mu_);  // one version after the other
  // Every version gets a record: its delta, or that it has none (readers
  // waiting for it then read the version whole at once).
  std::string record = EncodeNoWeightDelta(version);
  bool delta = false;
  if (base_version_ == version - 1 && base_.size() == payload.size() && !base_.empty()) {
    WeightDeltaHeader h;
    h.version = version;
    h.base = base_version_;
    h.size = payload.size();
    h.crc32c = Crc32c(payload.data(), payload.size());
    Result<std::string> encoded = EncodeWeightDelta(h, payload, base_);
    // Not worth it when it is no smaller than half the version (every value changed).
    if (encoded.ok() && encoded->size() < payload.size() / 2) {
      record = std::move(*encoded);
      delta = true;
    }
  }
  PublishOptions opts;
  opts.content_type = kWeightsDeltaContentType;
  const Result<PublishAck> sent = bus_.Publish(delta_topic_, record, opts);
  {
    std::lock_guard<std::mutex> lock(delta_mu_);
    if (!sent.ok()) {
      ++stats_.deltas_not_published;  // its readers read the version whole
    } else if (delta) {
      ++stats_.deltas_published;
      stats_.delta_bytes_published += static_cast<int64_t>(record.size());
    }
  }
  base_ = std::move(payload);
  base_version_ = version;
}

Status WeightStream::PublishAsync(const std::vector<WeightTensor>& tensors, int64_t step,
                                  std::chrono::milliseconds timeout) {
  AGENTRT_ASSIGN_OR_RETURN(const WeightLayout layout, LayOut(tensors, step));
  std::lock_guard<std::mutex> caller(publish_mu_);  // one publisher at a time
  Async& a = StartAsync();
  std::unique_ptr<LargePayloadSlot> slot;
  {
    std::unique_lock<std::mutex> lock(a.mu);
    a.cv.wait(lock, [&] { return !a.busy; });
    if (a.failed) {
      const Status failed = std::move(*a.failed);
      a.failed.reset();
      return failed.WithContext("weights stream \"" + name_ + "\": the version before " +
                                (failed.code() == StatusCode::kDeadlineExceeded
                                     ? "may not have been stored (Latest() says)"
                                     : "was not stored") +
                                "; this one was not published");
    }
    if (a.ready != nullptr && a.ready->size() == layout.size) slot = std::move(a.ready);
    a.ready.reset();
  }
  if (slot == nullptr) {
    AGENTRT_ASSIGN_OR_RETURN(slot, bus_.ReserveLarge(topic_, layout.size));
  }
  CopyWeights(layout, tensors, slot->data());
  {
    std::lock_guard<std::mutex> lock(a.mu);
    a.filled = std::move(slot);
    a.opts = Options(timeout);
    a.busy = true;
  }
  a.cv.notify_all();
  return Status::Ok();
}

WeightStream::Async& WeightStream::StartAsync() {
  std::lock_guard<std::mutex> lock(async_mu_);
  if (async_ == nullptr) {
    auto a = std::make_unique<Async>();
    a->thread = std::thread([this, raw = a.get()] { RunAsync(*raw); });
    async_ = std::move(a);  // only once its thread runs
  }
  return *async_;
}

void WeightStream::RunAsync(Async& a) {
  std::unique_lock<std::mutex> lock(a.mu);
  for (;;) {
    a.cv.wait(lock, [&] { return a.stop || a.filled != nullptr; });
    if (a.filled == nullptr) return;  // stopped, nothing in flight
    std::unique_ptr<LargePayloadSlot> slot = std::move(a.filled);
    const PublishOptions opts = a.opts;
    lock.unlock();
    const size_t size = slot->size();
    std::string payload;  // kept for delta versions
    if (options_.delta) payload.assign(slot->data(), size);
    Result<PublishAck> ack = bus_.PublishLargeSlot(topic_, std::move(slot), opts);
    // The next version's slot, made now rather than while the caller waits
    // (not if the stream is going meanwhile). Not made, the next call makes
    // its own.
    lock.lock();
    const bool stopping = a.stop;
    lock.unlock();
    std::unique_ptr<LargePayloadSlot> next;
    if (ack.ok() && !stopping) {
      if (auto reserved = bus_.ReserveLarge(topic_, size); reserved.ok())
        next = std::move(*reserved);
    }
    lock.lock();
    if (ack.ok()) {
      a.stored = ack->offset + 1;
    } else {
      a.failed = ack.status();
    }
    a.ready = std::move(next);
    a.busy = false;
    a.cv.notify_all();
    if (ack.ok() && options_.delta) {  // after the caller may go on; before the next version
      lock.unlock();
      PublishDelta(ack->offset + 1, std::move(payload));
      lock.lock();
    }
  }
}

Result<int64_t> WeightStream::Flush(std::chrono::milliseconds timeout) {
  Async* started = nullptr;
  {
    std::lock_guard<std::mutex> lock(async_mu_);
    started = async_.get();
  }
  if (started == nullptr) return int64_t{0};
  Async& a = *started;
  std::unique_lock<std::mutex> lock(a.mu);
  if (!a.cv.wait_for(lock, timeout, [&] { return !a.busy; })) {
    return DeadlineExceeded("weights stream \"" + name_ +
                            "\": the version in flight was not stored within " +
                            std::to_string(timeout.count()) + " ms");
  }
  if (a.failed) {
    const Status failed = std::move(*a.failed);
    a.failed.reset();
    return failed;
  }
  return a.stored;
}

Result<std::pair<int64_t, int64_t>> WeightStream::Bounds() {
  AGENTRT_ASSIGN_OR_RETURN(auto topics, bus_.ListTopics(topic_));
  for (const auto& t : topics) {
    if (t.topic() == topic_) return std::make_pair(t.earliest_offset(), t.end_offset());
  }
  return std::make_pair(int64_t{0}, int64_t{0});
}

Result<int64_t> WeightStream::Newest() {
  AGENTRT_ASSIGN_OR_RETURN(const auto bounds, Bounds());
  return bounds.second;
}

Result<std::shared_ptr<const WeightSet>> WeightStream::Read(int64_t version,
                                                            std::chrono::milliseconds wait) {
  const std::string what = "weights stream \"" + name_ + "\" version " + std::to_string(version);
  if (version < 1) return InvalidArgument(what + ": versions start at 1");
  const std::string gone = what + " is no longer kept (keep_last or bus.retention removed it)";
  // The version's message, as `how` asks for it, within `within`.
  const auto deadline = std::chrono::steady_clock::now() + wait;
  auto fetch = [&](const FetchOptions& how,
                   std::chrono::milliseconds within) -> Result<BusMessage> {
    auto got = bus_.Fetch(topic_, version - 1, 1, within, how);
    if (!got.ok()) {
      if (got.status().code() == StatusCode::kOutOfRange) return NotFound(gone);
      return got.status();
    }
    if (got->empty() || got->front().offset() != version - 1)
      return NotFound(what + " does not exist (yet)");
    return std::move(got->front());
  };
  // The version's record, waited for: its bytes when it is small, else the
  // broker's file name, size, CRC32C and publisher.
  AGENTRT_ASSIGN_OR_RETURN(BusMessage stored,
                           fetch({.local_paths = true, .metadata_only = true}, wait));
  if (stored.chunked_size() == 0) {  // small: it came whole
    const auto streamed = static_cast<int64_t>(stored.payload().size());
    return Kept(WeightSet::FromMessage(std::move(stored), version), streamed);
  }
  if (options_.delta) {
    std::shared_ptr<const WeightSet> held;
    {
      std::lock_guard<std::mutex> lock(delta_mu_);
      held = held_;
    }
    if (held != nullptr && held->version() == version - 1) {
      auto rebuilt = ReadDelta(version, *held, stored);
      if (rebuilt.ok()) return rebuilt;
      if (rebuilt.status().code() == StatusCode::kDataLoss) {
        std::lock_guard<std::mutex> lock(delta_mu_);
        ++stats_.delta_mismatches;  // and read whole below
      }
    }
  }
  // On the broker's node: its file, mapped.
  if (bus_.BrokerFileReadable(stored)) {
    auto set = WeightSet::FromMessage(std::move(stored), version);
    // Its file's name went between the fetch and the open: trimmed meanwhile.
    if (!set.ok() && set.status().code() == StatusCode::kNotFound) return NotFound(gone);
    return Kept(std::move(set), 0);
  }
  // Elsewhere the bytes are streamed. The version exists: reading it gets at
  // least a call's time, however short the wait for it was.
  const auto read_by = std::max(deadline, std::chrono::steady_clock::now() + bus_.call_timeout());
  auto whole = [&] { return fetch({}, Left(read_by)); };
  // Off the broker's node (not a file trimmed meanwhile): once per node.
  if (!bus_.reads_broker_files()) {
    if (const std::string dir = bus_.NodeCacheDir(); !dir.empty())
      return ReadThroughNodeCache(version, stored, dir, whole, read_by);
  }
  AGENTRT_ASSIGN_OR_RETURN(BusMessage got, whole());
  const auto streamed = static_cast<int64_t>(got.payload().size());
  return Kept(WeightSet::FromMessage(std::move(got), version), streamed);
}

namespace {

// How many versions of a stream a node's folder keeps: the newest and the
// one before (a reader still mapping a removed one keeps its bytes).
constexpr int64_t kNodeCachedVersions = 2;

// What a stream's files in a node's folder start with: its topic, hashed
// (no '/'), and a '.'.
std::string NodeCachedPrefix(std::string_view topic) {
  char prefix[16];
  std::snprintf(prefix, sizeof(prefix), "%08x.", Crc32c(topic.data(), topic.size()));
  return prefix;
}

// The name of a stream's version in a node's folder: that prefix, the
// version's number, CRC32C and size, so that only the same bytes ever answer to it.
std::string NodeCachedName(std::string_view topic, int64_t version, const BusMessage& stored) {
  char rest[64];
  std::snprintf(rest, sizeof(rest), "%lld.%08x.%lld", static_cast<long long>(version),
                stored.chunked_crc32c(), static_cast<long long>(stored.chunked_size()));
  return NodeCachedPrefix(topic) + rest;
}

// The node folder's file `path` as version `version` (NotFound when it is
// not there; one whose bytes are not the version's is removed).
Result<std::shared_ptr<const WeightSet>> MapNodeCached(const std::string& path,
                                                       const BusMessage& stored, int64_t version) {
  BusMessage m;
  m.set_topic(stored.topic());
  m.set_publisher(stored.publisher());
  m.set_chunked_path(path);
  m.set_chunked_size(stored.chunked_size());
  m.set_chunked_crc32c(stored.chunked_crc32c());
  auto set = WeightSet::FromMessage(std::move(m), version);
  if (!set.ok() && set.status().code() == StatusCode::kDataLoss) ::unlink(path.c_str());
  return set;
}

// Removes the stream's files (versions, their locks and partial copies)
// older than the newest kNodeCachedVersions in the folder.
void TrimNodeCached(const std::string& dir, std::string_view topic) {
  const std::string prefix = NodeCachedPrefix(topic);
  std::vector<std::pair<long long, std::string>> files;  // version, path
  long long newest = 0;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    long long v = 0;
    if (name.rfind(prefix, 0) != 0 || std::sscanf(name.c_str() + prefix.size(), "%lld", &v) != 1)
      continue;
    newest = std::max(newest, v);
    files.emplace_back(v, e.path().string());
  }
  for (const auto& [v, path] : files) {
    if (v <= newest - kNodeCachedVersions) ::unlink(path.c_str());
  }
}

// An exclusive flock on `path` (made if need be) that is still the file of
// that name, waited for until `until`; -1 when not had by then.
int LockNodeCached(const std::string& path, std::chrono::steady_clock::time_point until) {
  for (;;) {
    const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd < 0) return -1;
    bool locked = false;
    while (!(locked = ::flock(fd, LOCK_EX | LOCK_NB) == 0) &&
           (errno == EWOULDBLOCK || errno == EINTR) && std::chrono::steady_clock::now() < until)
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    struct stat held {
    }, named{};
    if (locked && ::fstat(fd, &held) == 0 && ::stat(path.c_str(), &named) == 0 &&
        held.st_ino == named.st_ino && held.st_dev == named.st_dev)
      return fd;
    ::close(fd);
    // Not locked in time, or the lock file was trimmed meanwhile: start over.
    if (!locked || std::chrono::steady_clock::now() >= until) return -1;
  }
}

}  // namespace

Result<std::shared_ptr<const WeightSet>> WeightStream::ReadThroughNodeCache(
    int64_t version, const BusMessage& stored, const std::string& dir,
    const std::function<Result<BusMessage>()>& fetch_whole,
    std::chrono::steady_clock::time_point deadline) {
  const std::string path = dir + "/" + NodeCachedName(topic_, version, stored);
  auto cached = [&]() -> Result<std::shared_ptr<const WeightSet>> {
    auto hit = MapNodeCached(path, stored, version);
    if (hit.ok()) {
      std::lock_guard<std::mutex> lock(delta_mu_);
      ++stats_.versions_from_node_cache;
    }
    return hit;
  };
  if (auto hit = cached(); hit.ok()) return hit;
  // One process of the node fetches it; the others wait for its file (until
  // the read's deadline: then they fetch it themselves).
  const int lock = LockNodeCached(path + ".lock", deadline);
  if (lock >= 0) {
    if (auto hit = cached(); hit.ok()) {
      ::close(lock);
      return hit;
    }
  }
  Result<BusMessage> got = fetch_whole();
  if (got.ok() && lock >= 0 && got->chunked_path().empty() &&
      static_cast<int64_t>(got->payload().size()) == stored.chunked_size()) {
    const Status written =
        WriteFileAtomic(path, got->payload(), {.mode = 0600, .sync_file = false});
    if (written.ok()) {
      TrimNodeCached(dir, topic_);
    } else {
      // A full /dev/shm (a container's 64 MiB): this client stops using it,
      // and each of its readers fetches its own bytes from then on.
      std::fprintf(stderr,
                   "agentrt: weights stream \"%s\": the node's folder is not used from now on: "
                   "%s\n",
                   name_.c_str(), written.ToString().c_str());
      bus_.DropNodeCacheDir();
    }
  }
  if (lock >= 0) ::close(lock);  // its file stays: a waiter holding it checks it is the one
  if (!got.ok()) return got.status();
  const auto streamed = static_cast<int64_t>(got->payload().size());
  return Kept(WeightSet::FromMessage(std::move(*got), version), streamed);
}

Result<std::shared_ptr<const WeightSet>> WeightStream::Kept(
    Result<std::shared_ptr<const WeightSet>> set, int64_t streamed) {
  if (!set.ok()) return set;
  std::lock_guard<std::mutex> lock(delta_mu_);
  stats_.whole_bytes_read += streamed;
  // A delta reader holds its last version; a mapped one has no bytes to save.
  if (options_.delta && !(*set)->mapped()) {
    held_ = *set;
    PrepareSpare((*set)->payload_size());
  }
  return set;
}

void WeightStream::PrepareSpare(size_t size) {
  if (spare_busy_ || spare_.size() == size) return;
  if (spare_thread_.joinable()) spare_thread_.join();  // done: it cleared spare_busy_
  spare_busy_ = true;
  spare_thread_ = std::thread([this, size] {
    std::string buffer(size, '\0');  // every page written, so faulted in
    std::lock_guard<std::mutex> lock(delta_mu_);
    spare_ = std::move(buffer);
    spare_busy_ = false;
  });
}

Result<std::shared_ptr<const WeightSet>> WeightStream::ReadDelta(int64_t version,
                                                                 const WeightSet& held,
                                                                 const BusMessage& stored) {
  AGENTRT_ASSIGN_OR_RETURN(auto topics, bus_.ListTopics(delta_topic_));
  int64_t end = 0;
  for (const auto& t : topics) {
    if (t.topic() == delta_topic_) end = t.end_offset();
  }
  if (end == 0) return NotFound("no delta versions");
  // The newest record; when it is the version before's, the version's own
  // follows right after the version (stored now): wait for it, at most 1 s.
  for (int64_t offset = end - 1; offset <= end; ++offset) {
    // (The newest is there already: its wait only bounds the call.)
    auto got = bus_.Fetch(delta_topic_, offset, 1,
                          offset < end ? std::chrono::seconds(10) : std::chrono::seconds(1));
    if (!got.ok() || got->empty() || got->front().offset() != offset)
      return NotFound("no delta for the version");
    const BusMessage& m = got->front();
    AGENTRT_ASSIGN_OR_RETURN(const WeightDeltaHeader h, ReadWeightDeltaHeader(m.payload()));
    if (h.version == version - 1 && offset < end) continue;
    if (h.version != version || h.base == 0) return NotFound("no delta for the version");
    // Only a delta of this version as the broker stored it (its size and
    // CRC32C, its publisher), from the version held.
    if (h.base != held.version() || m.publisher() != stored.publisher() ||
        static_cast<int64_t>(h.size) != stored.chunked_size() ||
        h.crc32c != stored.chunked_crc32c()) {
      return DataLoss("the delta of version " + std::to_string(version) +
                      " is not of the version stored, or not from the version held");
    }
    std::string buffer;
    {
      std::lock_guard<std::mutex> lock(delta_mu_);
      if (spare_.size() == h.size) buffer = std::exchange(spare_, {});
    }
    AGENTRT_ASSIGN_OR_RETURN(
        std::string bytes,
        ApplyWeightDelta(m.payload(), std::string_view(held.payload(), held.payload_size()),
                         std::move(buffer)));
    BusMessage rebuilt;
    rebuilt.set_topic(topic_);
    rebuilt.set_publisher(stored.publisher());
    *rebuilt.mutable_payload() = std::move(bytes);
    AGENTRT_ASSIGN_OR_RETURN(auto set, WeightSet::FromMessage(std::move(rebuilt), version));
    std::lock_guard<std::mutex> lock(delta_mu_);
    ++stats_.versions_from_delta;
    stats_.delta_bytes_read += static_cast<int64_t>(m.payload().size());
    held_ = set;
    PrepareSpare(set->payload_size());
    return set;
  }
  return NotFound("no delta for the version");
}

// A version picked from the bounds may be trimmed (keep_last) before it is
// read when the publisher is fast: the callers below then look again, until
// their deadline, rather than report a version gone while newer ones exist.
// Each further look waits a little longer (1 ms doubling to 64 ms), so that
// a stream that keeps changing under them is not asked for in a tight loop.
void WeightStream::PauseBeforeRetry(int attempt, std::chrono::steady_clock::time_point deadline) {
  const auto pause = std::chrono::milliseconds(int64_t{1} << std::min(attempt, 6));
  std::this_thread::sleep_until(std::min(deadline, std::chrono::steady_clock::now() + pause));
}

Result<std::shared_ptr<const WeightSet>> WeightStream::Latest(std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (int attempt = 0;; ++attempt) {
    AGENTRT_ASSIGN_OR_RETURN(auto bounds, Bounds());
    if (bounds.second <= bounds.first)
      return NotFound("weights stream \"" + name_ + "\" has no version yet");
    auto got = Read(bounds.second, Left(deadline));
    if (got.ok() || got.status().code() != StatusCode::kNotFound ||
        std::chrono::steady_clock::now() >= deadline)
      return got;
    PauseBeforeRetry(attempt, deadline);
  }
}

Result<std::shared_ptr<const WeightSet>> WeightStream::WaitNewer(
    int64_t version, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (int attempt = 0;; ++attempt) {
    AGENTRT_ASSIGN_OR_RETURN(auto bounds, Bounds());
    const auto nothing_newer = [&] {
      return DeadlineExceeded("weights stream \"" + name_ + "\": no version after " +
                              std::to_string(version) + " within " +
                              std::to_string(timeout.count()) + " ms");
    };
    // Nothing newer and no time left (a poll): one round trip.
    if (bounds.second <= version && std::chrono::steady_clock::now() >= deadline)
      return nothing_newer();
    // The newest, if there is one after `version`; else wait for the next.
    auto got = Read(bounds.second > version ? bounds.second : version + 1, Left(deadline));
    if (got.ok() || got.status().code() != StatusCode::kNotFound) return got;
    if (std::chrono::steady_clock::now() >= deadline) return nothing_newer();
    PauseBeforeRetry(attempt, deadline);
  }
}

Result<std::shared_ptr<const WeightSet>> WeightStream::At(int64_t version,
                                                          std::chrono::milliseconds timeout) {
  return Read(version, timeout);
}

}  // namespace agentrt
