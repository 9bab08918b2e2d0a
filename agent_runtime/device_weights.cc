#include "agent_runtime/device_weights.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>
#include <set>

#include "common/file_util.h"
#include "common/random.h"
#include "comms/auth.h"

namespace agentrt {
namespace {

constexpr off_t kVersionsAt = kSlotVersionsAt;
constexpr off_t kLocksAt = kSlotLocksAt;
constexpr int kMaxSlots = 64;  // slots' versions fit below kLocksAt

std::string Hex(const char* data, size_t n) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out;
  for (size_t i = 0; i < n; ++i) {
    const auto b = static_cast<unsigned char>(data[i]);
    out += kDigits[b >> 4];
    out += kDigits[b & 0xf];
  }
  return out;
}

bool FromHex(std::string_view hex, char* out, size_t n) {
  if (hex.size() != 2 * n) return false;
  auto digit = [](char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
  };
  for (size_t i = 0; i < n; ++i) {
    const int hi = digit(hex[2 * i]), lo = digit(hex[2 * i + 1]);
    if (hi < 0 || lo < 0) return false;
    out[i] = static_cast<char>(hi << 4 | lo);
  }
  return true;
}

// A byte-range lock of the slot table (F_OFD_SETLK: held by the open file
// description, released when it closes or its process dies); never waits.
bool LockByte(int fd, off_t at, short type) {
  struct flock fl {};
  fl.l_type = type;
  fl.l_whence = SEEK_SET;
  fl.l_start = at;
  fl.l_len = 1;
  return ::fcntl(fd, F_OFD_SETLK, &fl) == 0;
}

// Each tensor of the version has exactly one target of its size.
Status CheckTargets(const std::vector<WeightSet::Entry>& entries,
                    const std::vector<DeviceWeightTarget>& targets, const std::string& what) {
  std::set<std::string> seen;
  for (const DeviceWeightTarget& t : targets) {
    const auto e = std::find_if(entries.begin(), entries.end(),
                                [&](const WeightSet::Entry& x) { return x.name == t.name; });
    if (e == entries.end())
      return InvalidArgument(what + " has no tensor \"" + t.name + "\" to read into");
    if (e->bytes != t.bytes) {
      return InvalidArgument(what + ": tensor \"" + t.name + "\" has " + std::to_string(e->bytes) +
                             " bytes, its target " + std::to_string(t.bytes));
    }
    if (!seen.insert(t.name).second)
      return InvalidArgument(what + ": tensor \"" + t.name + "\" has two targets");
  }
  for (const WeightSet::Entry& e : entries) {
    if (seen.count(e.name) == 0)
      return InvalidArgument(what + ": tensor \"" + e.name + "\" has no target");
  }
  return Status::Ok();
}

const WeightSet::Entry& EntryOf(const std::vector<WeightSet::Entry>& entries,
                                const std::string& name) {
  return *std::find_if(entries.begin(), entries.end(),
                       [&](const WeightSet::Entry& x) { return x.name == name; });
}

}  // namespace

std::string WeightDeviceTopic(std::string_view name) {
  return std::string(kWeightsDeviceTopicPrefix) + std::string(name);
}

std::string DeviceWeightRecord::Encode() const {
  nlohmann::json list = nlohmann::json::array();
  for (const WeightSet::Entry& e : tensors) {
    list.push_back({{"name", e.name},
                    {"dtype", e.dtype},
                    {"shape", e.shape},
                    {"offset", e.offset},
                    {"bytes", e.bytes}});
  }
  return nlohmann::json{{"version", version},
                        {"step", step},
                        {"node", node},
                        {"pid", pid},
                        {"fd", fd},
                        {"nonce", nonce},
                        {"slot", slot},
                        {"device", device},
                        {"handle", Hex(handle.bytes.data(), handle.bytes.size())},
                        {"tensors", list}}
      .dump();
}

Result<DeviceWeightRecord> DeviceWeightRecord::Decode(std::string_view text) {
  const auto json = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!json.is_object()) return InvalidArgument("device weights record: not a JSON object");
  DeviceWeightRecord r;
  try {
    r.version = json.at("version").get<int64_t>();
    r.step = json.at("step").get<int64_t>();
    r.node = json.at("node").get<std::string>();
    r.pid = json.at("pid").get<int64_t>();
    r.fd = json.at("fd").get<int>();
    r.nonce = json.at("nonce").get<std::string>();
    r.slot = json.at("slot").get<int>();
    r.device = json.at("device").get<int>();
    if (!FromHex(json.at("handle").get<std::string>(), r.handle.bytes.data(),
                 r.handle.bytes.size()))
      return InvalidArgument("device weights record: \"handle\" is not 128 hex digits");
    for (const auto& t : json.at("tensors")) {
      WeightSet::Entry e;
      e.name = t.at("name").get<std::string>();
      e.dtype = t.at("dtype").get<std::string>();
      e.shape = t.at("shape").get<std::vector<int64_t>>();
      e.offset = t.at("offset").get<size_t>();
      e.bytes = t.at("bytes").get<size_t>();
      r.tensors.push_back(std::move(e));
    }
  } catch (const nlohmann::json::exception& ex) {
    return InvalidArgument(std::string("device weights record: ") + ex.what());
  }
  if (r.version < 1 || r.slot < 0 || r.slot >= kMaxSlots || r.pid <= 0 || r.fd < 0)
    return InvalidArgument("device weights record: version, slot, pid or fd out of range");
  return r;
}

// A publisher's slot table as a reader opened it, and the slots it mapped.
struct DeviceWeightStream::Peer {
  int fd = -1;
  std::map<std::string, void*> opened;  // by the handle's hex
};

DeviceWeightStream::DeviceWeightStream(WeightStream& stream, device::Api& api, int device,
                                       DeviceWeightOptions options)
    : stream_(stream),
      api_(api),
      device_(device),
      options_(std::move(options)),
      topic_(WeightDeviceTopic(stream.name())) {
  options_.slots = std::clamp(options_.slots, 1, kMaxSlots);
  if (options_.node.empty()) options_.node = BootId();
}

DeviceWeightStream::~DeviceWeightStream() {
  device::DeviceGuard guard(&api_, device_);
  for (auto& [key, peer] : peers_) {
    for (auto& [hex, ptr] : peer->opened) (void)api_.IpcCloseMemHandle(ptr);
    ::close(peer->fd);
  }
  for (Slot& s : slots_) api_.Free(s.data);
  api_.HostFree(publish_pinned_.first);
  api_.HostFree(read_pinned_.first);
  if (cuda_stream_ != nullptr) api_.DestroyStream(cuda_stream_);
  if (table_fd_ >= 0) ::close(table_fd_);
}

Status DeviceWeightStream::Prepare() {
  if (prepared_) return Status::Ok();
  AGENTRT_ASSIGN_OR_RETURN(cuda_stream_, api_.CreateStream());
  prepared_ = true;
  return Status::Ok();
}

Result<void*> DeviceWeightStream::Pinned(size_t bytes, std::pair<void*, size_t>& buffer) {
  if (buffer.second < bytes) {
    api_.HostFree(buffer.first);
    buffer = {nullptr, 0};
    AGENTRT_ASSIGN_OR_RETURN(void* p, api_.HostAlloc(bytes));
    buffer = {p, bytes};
  }
  return buffer.first;
}

Result<DeviceWeightStream::Slot*> DeviceWeightStream::LockFreeSlot(size_t bytes, int* index) {
  if (table_fd_ < 0) {
    const int fd = ::memfd_create("agentrt-weights-slots", MFD_CLOEXEC);
    if (fd < 0)
      return ErrnoStatus(errno, "weights stream \"" + stream_.name() + "\": memfd_create");
    nonce_ = RandomHex64();
    if (::ftruncate(fd, kLocksAt) != 0 ||
        ::pwrite(fd, nonce_.data(), nonce_.size(), 0) != static_cast<ssize_t>(nonce_.size())) {
      ::close(fd);
      return ErrnoStatus(errno, "weights stream \"" + stream_.name() + "\": its slot table");
    }
    table_fd_ = fd;
    slots_.resize(static_cast<size_t>(options_.slots));
  }
  for (int k = 0; k < options_.slots; ++k) {
    const int i = (next_slot_ + k) % options_.slots;
    if (!LockByte(table_fd_, kLocksAt + i, F_WRLCK)) continue;  // a reader copies from it
    Slot& s = slots_[static_cast<size_t>(i)];
    if (s.bytes < bytes) {
      api_.Free(s.data);
      s = {};
      Result<void*> data = api_.Malloc(bytes);
      Result<device::IpcMemHandle> handle =
          data.ok() ? api_.IpcGetMemHandle(*data) : Result<device::IpcMemHandle>(data.status());
      if (!handle.ok()) {
        if (data.ok()) api_.Free(*data);
        UnlockSlot(i, 0);
        return handle.status();
      }
      s = {*data, bytes, *handle};
    }
    next_slot_ = (i + 1) % options_.slots;
    *index = i;
    return &s;
  }
  return nullptr;
}

void DeviceWeightStream::UnlockSlot(int index, int64_t version) {
  (void)!::pwrite(table_fd_, &version, sizeof version, kVersionsAt + 8 * index);
  LockByte(table_fd_, kLocksAt + index, F_UNLCK);
}

Result<int64_t> DeviceWeightStream::Publish(const std::vector<DeviceWeightTensor>& tensors,
                                            int64_t step, std::chrono::milliseconds timeout) {
  device::DeviceGuard guard(&api_, device_);
  AGENTRT_RETURN_IF_ERROR(guard.status());
  AGENTRT_RETURN_IF_ERROR(Prepare());
  // The payload's layout (one decider of the offsets): the slot holds the
  // tensors where the host version has them.
  std::vector<WeightTensor> host;
  for (const DeviceWeightTensor& t : tensors)
    host.push_back({t.name, t.dtype, t.shape, nullptr, t.bytes});
  const WeightLayout layout =
      LayOutWeights(stream_.name(), stream_.bus().agent(), step, stream_.incarnation(), host);
  AGENTRT_ASSIGN_OR_RETURN(void* pinned, Pinned(layout.size, publish_pinned_));
  int index = -1;
  Result<Slot*> slot = LockFreeSlot(layout.size, &index);
  if (!slot.ok()) slot = nullptr;  // no device memory for a slot: the host version only
  Status copied = Status::Ok();
  for (size_t i = 0; i < tensors.size() && copied.ok(); ++i) {
    char* at = static_cast<char*>(pinned) + layout.offsets[i];
    host[i].data = at;
    copied = api_.CopyAsync(at, tensors[i].data, tensors[i].bytes, device::CopyKind::kDeviceToHost,
                            cuda_stream_);
    if (copied.ok() && *slot != nullptr) {
      copied =
          api_.CopyAsync(static_cast<char*>((*slot)->data) + layout.offsets[i], tensors[i].data,
                         tensors[i].bytes, device::CopyKind::kDeviceToDevice, cuda_stream_);
    }
  }
  if (copied.ok()) copied = api_.SynchronizeStream(cuda_stream_);
  Result<int64_t> version =
      copied.ok() ? stream_.Publish(host, step, timeout) : Result<int64_t>(copied);
  if (*slot == nullptr) {
    ++stats_.versions_not_shared;
    return version;
  }
  UnlockSlot(index, version.ok() ? *version : 0);
  if (!version.ok()) return version;
  DeviceWeightRecord r;
  r.version = *version;
  r.step = step;
  r.node = options_.node;
  r.pid = ::getpid();
  r.fd = table_fd_;
  r.nonce = nonce_;
  r.slot = index;
  r.device = device_;
  r.handle = (*slot)->handle;
  for (size_t i = 0; i < tensors.size(); ++i) {
    r.tensors.push_back(
        {tensors[i].name, tensors[i].dtype, tensors[i].shape, layout.offsets[i], tensors[i].bytes});
  }
  PublishOptions po;
  po.timeout = timeout;
  po.content_type = "application/json";
  if (stream_.bus().Publish(topic_, r.Encode(), po).ok()) {
    ++stats_.versions_shared;
  } else {
    ++stats_.versions_not_shared;  // its readers read the host version
  }
  return version;
}

Result<const DeviceWeightRecord*> DeviceWeightStream::FindRecord(int64_t version) {
  BusClient& bus = stream_.bus();
  AGENTRT_ASSIGN_OR_RETURN(auto topics, bus.ListTopics(topic_));
  int64_t earliest = 0, end = 0;
  for (const auto& t : topics) {
    if (t.topic() == topic_) {
      earliest = t.earliest_offset();
      end = t.end_offset();
    }
  }
  // A version's record follows it within the publisher's next few records.
  const int64_t count = options_.slots + 2;
  const int64_t from = std::max(earliest, end - count);
  records_.clear();
  if (end > from) {
    AGENTRT_ASSIGN_OR_RETURN(
        auto got, bus.Fetch(topic_, from, static_cast<int>(end - from), bus.call_timeout()));
    for (const BusMessage& m : got) {
      Result<DeviceWeightRecord> r = DeviceWeightRecord::Decode(m.payload());
      if (r.ok()) records_.push_back(std::move(*r));
    }
  }
  for (const DeviceWeightRecord& r : records_) {
    if (r.version == version) return &r;
  }
  return NotFound("version " + std::to_string(version) + " has no device slot");
}

Result<bool> DeviceWeightStream::ReadByIpc(const DeviceWeightRecord& r,
                                           const std::vector<DeviceWeightTarget>& targets) {
  const std::string what =
      "weights stream \"" + stream_.name() + "\" version " + std::to_string(r.version);
  AGENTRT_RETURN_IF_ERROR(CheckTargets(r.tensors, targets, what));
  auto staged = [&](std::string why) {
    staged_reason_ = std::move(why);
    return false;
  };
  if (r.node != options_.node) return staged("published on another node");
  if (r.pid == ::getpid()) return staged("published by this process");
  const std::string key =
      r.node + "/" + std::to_string(r.pid) + "/" + std::to_string(r.fd) + "/" + r.nonce;
  auto it = peers_.find(key);
  if (it == peers_.end()) {
    const std::string path = "/proc/" + std::to_string(r.pid) + "/fd/" + std::to_string(r.fd);
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    std::string nonce(r.nonce.size(), '\0');
    if (fd < 0 ||
        ::pread(fd, nonce.data(), nonce.size(), 0) != static_cast<ssize_t>(nonce.size()) ||
        nonce != r.nonce) {
      if (fd >= 0) ::close(fd);
      return staged("the publisher's slot table is not open to this process (" + path + ")");
    }
    // One publisher at a time: the slots of one before it are closed.
    for (auto& [k, peer] : peers_) {
      for (auto& [hex, ptr] : peer->opened) (void)api_.IpcCloseMemHandle(ptr);
      ::close(peer->fd);
    }
    peers_.clear();
    it = peers_.emplace(key, std::make_unique<Peer>()).first;
    it->second->fd = fd;
  }
  Peer& peer = *it->second;
  if (!LockByte(peer.fd, kLocksAt + r.slot, F_RDLCK))
    return staged("its slot is being rewritten by the publisher");
  auto unlock = [&] { LockByte(peer.fd, kLocksAt + r.slot, F_UNLCK); };
  int64_t held = 0;
  if (::pread(peer.fd, &held, sizeof held, kVersionsAt + 8 * r.slot) != sizeof held ||
      held != r.version) {
    unlock();
    return staged("its slot now holds version " + std::to_string(held));
  }
  const std::string hex = Hex(r.handle.bytes.data(), r.handle.bytes.size());
  auto opened = peer.opened.find(hex);
  if (opened == peer.opened.end()) {
    Result<void*> p = api_.IpcOpenMemHandle(r.handle);
    if (!p.ok()) {
      unlock();
      return staged("its slot cannot be opened: " + p.status().message());
    }
    opened = peer.opened.emplace(hex, *p).first;
  }
  Status copied = Status::Ok();
  for (const DeviceWeightTarget& t : targets) {
    const WeightSet::Entry& e = EntryOf(r.tensors, t.name);
    if (copied.ok()) {
      copied = api_.CopyAsync(t.data, static_cast<const char*>(opened->second) + e.offset, t.bytes,
                              device::CopyKind::kDeviceToDevice, cuda_stream_);
    }
  }
  if (copied.ok()) copied = api_.SynchronizeStream(cuda_stream_);
  unlock();
  // Slots no recent record names (the publisher reallocated them) are closed.
  std::set<std::string> named;
  for (const DeviceWeightRecord& x : records_)
    named.insert(Hex(x.handle.bytes.data(), x.handle.bytes.size()));
  for (auto o = peer.opened.begin(); o != peer.opened.end();) {
    if (named.count(o->first) == 0) {
      (void)api_.IpcCloseMemHandle(o->second);
      o = peer.opened.erase(o);
    } else {
      ++o;
    }
  }
  if (!copied.ok()) return staged("the copy from its slot failed: " + copied.message());
  return true;
}

Status DeviceWeightStream::ReadStaged(int64_t version,
                                      const std::vector<DeviceWeightTarget>& targets,
                                      std::chrono::milliseconds timeout) {
  AGENTRT_ASSIGN_OR_RETURN(auto set, stream_.At(version, timeout));
  const std::string what =
      "weights stream \"" + stream_.name() + "\" version " + std::to_string(version);
  AGENTRT_RETURN_IF_ERROR(CheckTargets(set->entries(), targets, what));
  size_t total = 0;
  for (const DeviceWeightTarget& t : targets) total += t.bytes;
  AGENTRT_ASSIGN_OR_RETURN(void* pinned, Pinned(std::max<size_t>(total, 1), read_pinned_));
  char* at = static_cast<char*>(pinned);
  for (const DeviceWeightTarget& t : targets) {
    std::memcpy(at, set->Data(*set->Find(t.name)), t.bytes);
    AGENTRT_RETURN_IF_ERROR(
        api_.CopyAsync(t.data, at, t.bytes, device::CopyKind::kHostToDevice, cuda_stream_));
    at += t.bytes;
  }
  return api_.SynchronizeStream(cuda_stream_);
}

Result<int64_t> DeviceWeightStream::ReadInto(int64_t version,
                                             const std::vector<DeviceWeightTarget>& targets,
                                             std::chrono::milliseconds timeout) {
  device::DeviceGuard guard(&api_, device_);
  AGENTRT_RETURN_IF_ERROR(guard.status());
  AGENTRT_RETURN_IF_ERROR(Prepare());
  if (version == 0) {
    AGENTRT_ASSIGN_OR_RETURN(version, stream_.Newest());
    if (version == 0) return NotFound("weights stream \"" + stream_.name() + "\" has no version");
  }
  Result<const DeviceWeightRecord*> record = FindRecord(version);
  if (record.ok()) {
    AGENTRT_ASSIGN_OR_RETURN(const bool by_ipc, ReadByIpc(**record, targets));
    if (by_ipc) {
      ++stats_.versions_by_ipc;
      staged_reason_.clear();
      return version;
    }
  } else {
    staged_reason_ = record.status().message();
  }
  AGENTRT_RETURN_IF_ERROR(ReadStaged(version, targets, timeout));
  ++stats_.versions_staged;
  return version;
}

}  // namespace agentrt
