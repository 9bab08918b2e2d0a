#include "agent_runtime/device_weights.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>

#include "common/file_util.h"
#include "common/random.h"
#include "comms/auth.h"

namespace agentrt {
namespace {

using namespace std::chrono_literals;

constexpr off_t kVersionsAt = kSlotVersionsAt;
constexpr off_t kLocksAt = kSlotLocksAt;
constexpr int kMaxSlots = 64;      // slots' versions fit below kLocksAt
constexpr size_t kNonceSize = 16;  // RandomHex64

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
// 0: taken; EAGAIN: another holds it; else why it cannot be taken (a kernel
// without open file description locks: EINVAL).
int LockByte(int fd, off_t at, short type) {
  struct flock fl {};
  fl.l_type = type;
  fl.l_whence = SEEK_SET;
  fl.l_start = at;
  fl.l_len = 1;
  if (::fcntl(fd, F_OFD_SETLK, &fl) == 0) return 0;
  return errno == EACCES ? EAGAIN : errno;
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
    if (!t.dtype.empty() && (e->dtype != t.dtype || e->shape != t.shape)) {
      auto shape = [](const std::vector<int64_t>& s) {
        std::string out = "(";
        for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
        return out + ")";
      };
      return InvalidArgument(what + ": tensor \"" + t.name + "\" is " + e->dtype + " " +
                             shape(e->shape) + ", its target " + t.dtype + " " + shape(t.shape));
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
  return nlohmann::json{
      {"version", version}, {"step", step},
      {"node", node},       {"pid", pid},
      {"fd", fd},           {"nonce", nonce},
      {"slot", slot},       {"slots", slots},
      {"device", device},   {"handle", Hex(handle.bytes.data(), handle.bytes.size())},
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
    r.slots = json.at("slots").get<int>();
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
  if (r.version < 1 || r.slot < -1 || r.slot >= kMaxSlots || r.slots < 0 || r.slots > kMaxSlots)
    return InvalidArgument("device weights record: version, slot or slots out of range");
  if (r.slot >= 0 && (r.pid <= 0 || r.fd < 0 || r.nonce.size() != kNonceSize))
    return InvalidArgument("device weights record: pid, fd or nonce of its slot table malformed");
  return r;
}

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
  api_.HostFree(publish_pinned_.first);
  api_.HostFree(read_pinned_.first);
  // Every slot marked empty under its write lock, once no reader copies
  // from it, then freed; one still read after 10 s is left to the exit.
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  for (size_t i = 0; i < slots_.size(); ++i) {
    if (slots_[i].data == nullptr) continue;
    while (LockByte(table_fd_, kLocksAt + static_cast<off_t>(i), F_WRLCK) == EAGAIN &&
           std::chrono::steady_clock::now() < until) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    const int64_t none = 0;
    if (::pwrite(table_fd_, &none, sizeof none, kVersionsAt + 8 * static_cast<off_t>(i)) ==
            sizeof none &&
        LockByte(table_fd_, kLocksAt + static_cast<off_t>(i), F_WRLCK) == 0) {
      api_.Free(slots_[i].data);
    }
  }
  if (side_ != nullptr) api_.DestroyStream(side_);
  if (after_event_ != nullptr) api_.DestroyEvent(after_event_);
  if (table_fd_ >= 0) ::close(table_fd_);  // releases the write locks
}

Status DeviceWeightStream::Prepare(device::Stream after) {
  if (after_event_ == nullptr) {
    AGENTRT_ASSIGN_OR_RETURN(after_event_, api_.CreateEvent());
  }
  if (side_ == nullptr) {
    AGENTRT_ASSIGN_OR_RETURN(side_, api_.CreateStream());
  }
  AGENTRT_RETURN_IF_ERROR(api_.RecordEvent(after_event_, after));
  return api_.StreamWaitEvent(side_, after_event_);
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
  const std::string what = "weights stream \"" + stream_.name() + "\": ";
  if (table_fd_ < 0) {
    const int fd = ::memfd_create("agentrt-weights-slots", MFD_CLOEXEC);
    if (fd < 0) return ErrnoStatus(errno, what + "memfd_create of its slot table");
    nonce_ = RandomHex64();
    if (::ftruncate(fd, kLocksAt) != 0 ||
        ::pwrite(fd, nonce_.data(), nonce_.size(), 0) != static_cast<ssize_t>(nonce_.size())) {
      const int err = errno;
      ::close(fd);
      return ErrnoStatus(err, what + "writing its slot table");
    }
    table_fd_ = fd;
    slots_.resize(static_cast<size_t>(options_.slots));
  }
  for (int k = 0; k < options_.slots; ++k) {
    const int i = (next_slot_ + k) % options_.slots;
    const int locked = LockByte(table_fd_, kLocksAt + i, F_WRLCK);
    if (locked == EAGAIN) continue;  // a reader copies from it
    if (locked != 0) return ErrnoStatus(locked, what + "locking a slot of its slot table");
    Slot& s = slots_[static_cast<size_t>(i)];
    if (s.bytes < bytes) {
      api_.Free(s.data);  // under its write lock: no reader has it open
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
                                            int64_t step, std::chrono::milliseconds timeout,
                                            device::Stream after) {
  device::DeviceGuard guard(&api_, device_);
  AGENTRT_RETURN_IF_ERROR(guard.status());
  AGENTRT_RETURN_IF_ERROR(Prepare(after));
  // The payload's layout (one decider of the offsets): the slot holds the
  // tensors where the host version has them.
  std::vector<WeightTensor> host;
  for (const DeviceWeightTensor& t : tensors)
    host.push_back({t.name, t.dtype, t.shape, nullptr, t.bytes});
  const WeightLayout layout =
      LayOutWeights(stream_.name(), stream_.bus().agent(), step, stream_.incarnation(), host);
  AGENTRT_ASSIGN_OR_RETURN(void* pinned, Pinned(layout.size, publish_pinned_));
  int index = -1;
  Slot* slot = nullptr;
  if (slot_error_.ok()) {
    Result<Slot*> got = LockFreeSlot(layout.size, &index);
    if (got.ok()) {
      slot = *got;
    } else {
      slot_error_ = got.status();  // the host version only, from now on
      ++stats_.slot_failures;
    }
  }
  Status copied = Status::Ok();
  for (size_t i = 0; i < tensors.size() && copied.ok(); ++i) {
    char* at = static_cast<char*>(pinned) + layout.offsets[i];
    host[i].data = at;
    copied = api_.CopyAsync(at, tensors[i].data, tensors[i].bytes, device::CopyKind::kDeviceToHost,
                            side_);
    if (copied.ok() && slot != nullptr) {
      copied = api_.CopyAsync(static_cast<char*>(slot->data) + layout.offsets[i], tensors[i].data,
                              tensors[i].bytes, device::CopyKind::kDeviceToDevice, side_);
    }
  }
  const Status synced = api_.SynchronizeStream(side_);  // always: the slot is unlocked after
  if (copied.ok()) copied = synced;
  Result<int64_t> version =
      copied.ok() ? stream_.Publish(host, step, timeout) : Result<int64_t>(copied);
  if (slot != nullptr) UnlockSlot(index, version.ok() ? *version : 0);
  if (!version.ok()) return version;
  // The version's record: its slot, or none (its readers read the host's).
  DeviceWeightRecord r;
  r.version = *version;
  r.step = step;
  r.node = options_.node;
  r.pid = ::getpid();
  r.fd = table_fd_;
  r.nonce = nonce_;
  r.slots = options_.slots;
  r.device = device_;
  if (slot != nullptr) {
    r.slot = index;
    r.handle = slot->handle;
    for (size_t i = 0; i < tensors.size(); ++i) {
      r.tensors.push_back({tensors[i].name, tensors[i].dtype, tensors[i].shape, layout.offsets[i],
                           tensors[i].bytes});
    }
  }
  PublishOptions po;
  po.timeout = timeout;
  po.content_type = "application/json";
  const bool recorded = stream_.bus().Publish(topic_, r.Encode(), po).ok();
  if (slot != nullptr && recorded) {
    ++stats_.versions_shared;
  } else {
    ++stats_.versions_not_shared;  // its readers read the host version
  }
  return version;
}

Result<DeviceWeightRecord> DeviceWeightStream::FindRecord(int64_t version,
                                                          std::chrono::milliseconds timeout) {
  BusClient& bus = stream_.bus();
  const std::string what = "version " + std::to_string(version);
  AGENTRT_ASSIGN_OR_RETURN(auto topics, bus.ListTopics(topic_));
  int64_t earliest = 0, end = 0;
  for (const auto& t : topics) {
    if (t.topic() == topic_) {
      earliest = t.earliest_offset();
      end = t.end_offset();
    }
  }
  if (end == 0) return NotFound("the stream's publisher shares no device slots");
  // The version's record follows the version: wait for it, at most 1 s.
  const auto deadline =
      std::chrono::steady_clock::now() + std::min<std::chrono::milliseconds>(timeout, 1s);
  for (;;) {
    // (Records that exist come at once: the wait only bounds the call.)
    AGENTRT_ASSIGN_OR_RETURN(auto got, bus.Fetch(topic_, end - 1, 1, bus.call_timeout()));
    if (got.empty()) return NotFound(what + " has no device record");
    AGENTRT_ASSIGN_OR_RETURN(DeviceWeightRecord newest,
                             DeviceWeightRecord::Decode(got.front().payload()));
    if (newest.version < version) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
      AGENTRT_ASSIGN_OR_RETURN(auto next, bus.Fetch(topic_, end, 1, std::max(left, 1ms)));
      if (next.empty()) return NotFound(what + " has no device record yet");
      ++end;
      continue;
    }
    // One record per version, the publisher's slot count of them back.
    const int64_t from = std::max(earliest, end - newest.slots - 2);
    AGENTRT_ASSIGN_OR_RETURN(
        auto window, bus.Fetch(topic_, from, static_cast<int>(end - from), bus.call_timeout()));
    for (const BusMessage& m : window) {
      Result<DeviceWeightRecord> r = DeviceWeightRecord::Decode(m.payload());
      if (!r.ok() || r->version != version) continue;
      if (r->slot < 0) return NotFound(what + " has no device slot (every slot was held)");
      return *r;
    }
    return NotFound(what + " has no device slot any more");
  }
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
  // The publisher's table, opened anew each time: a publisher gone is seen.
  const std::string path = "/proc/" + std::to_string(r.pid) + "/fd/" + std::to_string(r.fd);
  // Opens only a regular file (a memfd is one; the number may now be another
  // file's: a device, whose open acts) and never waits in open (a FIFO put
  // there after the check).
  struct stat st {};
  const int fd = ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode)
                     ? ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY)
                     : -1;
  std::string nonce(r.nonce.size(), '\0');
  if (fd < 0 || ::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) ||
      ::pread(fd, nonce.data(), nonce.size(), 0) != static_cast<ssize_t>(nonce.size()) ||
      nonce != r.nonce) {
    if (fd >= 0) ::close(fd);
    return staged("the publisher's slot table is not open to this process (" + path + ")");
  }
  // Held from before the handle is opened until it is closed.
  if (const int locked = LockByte(fd, kLocksAt + r.slot, F_RDLCK); locked != 0) {
    ::close(fd);
    return staged(locked == EAGAIN
                      ? std::string("its slot is being rewritten by the publisher")
                      : "its slot cannot be locked: " + std::string(std::strerror(locked)));
  }
  auto release = [&] { ::close(fd); };  // drops the lock
  int64_t held = 0;
  if (::pread(fd, &held, sizeof held, kVersionsAt + 8 * r.slot) != sizeof held ||
      held != r.version) {
    release();
    return staged("its slot now holds version " + std::to_string(held));
  }
  Result<void*> slot = api_.IpcOpenMemHandle(r.handle);
  if (!slot.ok()) {
    release();
    return staged("its slot cannot be opened: " + slot.status().message());
  }
  Status copied = Status::Ok();
  for (const DeviceWeightTarget& t : targets) {
    const WeightSet::Entry& e = EntryOf(r.tensors, t.name);
    if (copied.ok()) {
      copied = api_.CopyAsync(t.data, static_cast<const char*>(*slot) + e.offset, t.bytes,
                              device::CopyKind::kDeviceToDevice, side_);
    }
  }
  const Status synced = api_.SynchronizeStream(side_);  // always, before the slot goes
  if (copied.ok()) copied = synced;
  const Status closed = api_.IpcCloseMemHandle(*slot);
  release();
  if (!copied.ok()) return staged("the copy from its slot failed: " + copied.message());
  if (!closed.ok()) return closed;
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
  Status copied = Status::Ok();
  for (const DeviceWeightTarget& t : targets) {
    std::memcpy(at, set->Data(*set->Find(t.name)), t.bytes);
    if (copied.ok())
      copied = api_.CopyAsync(t.data, at, t.bytes, device::CopyKind::kHostToDevice, side_);
    at += t.bytes;
  }
  const Status synced = api_.SynchronizeStream(side_);
  return copied.ok() ? synced : copied;
}

Result<int64_t> DeviceWeightStream::ReadInto(int64_t version,
                                             const std::vector<DeviceWeightTarget>& targets,
                                             std::chrono::milliseconds timeout,
                                             device::Stream after) {
  device::DeviceGuard guard(&api_, device_);
  AGENTRT_RETURN_IF_ERROR(guard.status());
  AGENTRT_RETURN_IF_ERROR(Prepare(after));
  if (version == 0) {
    AGENTRT_ASSIGN_OR_RETURN(version, stream_.Newest());
    if (version == 0) return NotFound("weights stream \"" + stream_.name() + "\" has no version");
  }
  Result<DeviceWeightRecord> record = FindRecord(version, timeout);
  if (record.ok()) {
    AGENTRT_ASSIGN_OR_RETURN(const bool by_ipc, ReadByIpc(*record, targets));
    if (by_ipc) {
      ++stats_.versions_by_ipc;
      staged_reason_.clear();
      return version;
    }
  } else if (record.status().code() == StatusCode::kPermissionDenied) {
    return record.status();
  } else {
    staged_reason_ = record.status().message();
  }
  AGENTRT_RETURN_IF_ERROR(ReadStaged(version, targets, timeout));
  ++stats_.versions_staged;
  return version;
}

}  // namespace agentrt
