// agentrt::DeviceWeightStream — a weight stream (comms/weight_stream.h) whose
// tensors live on a GPU: a policy moves GPU to GPU on one node through CUDA
// IPC, and through pinned host memory everywhere else.
//
//   WeightStream out(*bus, "prey-0");
//   DeviceWeightStream gpu_out(out, *api, device);
//   AGENTRT_ASSIGN_OR_RETURN(int64_t v, gpu_out.Publish({{"fc.w", "float32", {256, 64}, d_w, n}},
//   step));
//   ...
//   WeightStream in(*bus, "prey-0");
//   DeviceWeightStream gpu_in(in, *api, device);
//   AGENTRT_ASSIGN_OR_RETURN(int64_t got, gpu_in.ReadInto(0, {{"fc.w", my_d_w, n}}, timeout));
//
// Publish copies the tensors, on the publisher's device, into one of its
// device slots (`slots` buffers, reused oldest first) and to pinned host
// memory; it publishes the host copy as an ordinary version of the stream
// (so the durable log, other nodes, checkpoints and the ACL are as for any
// version) and then a small record of the slot on the stream's device topic
// "weights-device/<name>" (governed by the ACL as the stream: only its
// subscribers read it): node, process, slot, the slot's CUDA IPC handle and
// where each tensor lies in it (DeviceWeightRecord).
//
// ReadInto on the same node finds the version's record, maps the slot with
// its IPC handle (kept open for the next versions) and copies each tensor
// device to device into the caller's buffers: no byte through the host. A
// reader elsewhere, in the publisher's process, or where the slot cannot be
// opened reads the host version (WeightStream::At: mapped from the broker's
// file on its node, or through the node folder) and copies it to the device
// through a pinned buffer. The two paths give the same bytes.
//
// A slot is never rewritten while a reader copies from it, and the publisher
// never waits for readers: each slot has a byte-range lock (F_OFD_SETLK) in a
// small memfd of the publisher's, which readers open as /proc/<pid>/fd/<fd>
// (a process of another user, or of another PID namespace, cannot; the memfd
// starts with a random nonce the record carries, so a reader never trusts
// another process's file). A reader holds the slot's read lock while it
// copies; the publisher takes a slot only when it gets the write lock at
// once, and otherwise the next slot; when every slot is held, the version is
// not shared on the device (counted) and its readers read it through the
// host. Under the write lock the memfd records which version the slot holds,
// so a reader that asks for a version whose slot was reused meanwhile reads
// it through the host. A reader killed while copying releases its lock with
// its descriptors; a publisher that dies takes its memfd and (on a GPU) the
// device memory with it: nothing is left on the node.
//
// What the ACL guarantees: the IPC handle is read only from the device topic,
// which only the stream's subscribers may fetch. The handle itself is a
// capability: any process of the same user on the node that learned it could
// open the memory (as with every CUDA IPC handle).
//
// Thread-safety: one thread at a time per DeviceWeightStream.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "agent_runtime/device_api.h"
#include "common/status.h"
#include "comms/weight_stream.h"

namespace agentrt {

// The slot table's layout, shared by the publisher's and readers' processes:
// a random nonce at 0, slot i's version at kSlotVersionsAt + 8 i (0: none),
// slot i's lock at byte kSlotLocksAt + i.
inline constexpr int64_t kSlotVersionsAt = 64;
inline constexpr int64_t kSlotLocksAt = 4096;

// The device topic of stream `name`: "weights-device/<name>".
std::string WeightDeviceTopic(std::string_view name);

// A tensor in device memory of the stream's device.
struct DeviceWeightTensor {
  std::string name;
  std::string dtype;
  std::vector<int64_t> shape;
  const void* data = nullptr;
  size_t bytes = 0;
};

// Where ReadInto copies one tensor of a version: device memory of the
// stream's device, exactly the tensor's size.
struct DeviceWeightTarget {
  std::string name;
  void* data = nullptr;
  size_t bytes = 0;
};

// The device topic's message: where one version lies in its publisher's
// device slot (a JSON object; Encode and Decode are each other's inverse).
struct DeviceWeightRecord {
  int64_t version = 0;
  int64_t step = 0;
  std::string node;   // the publisher's boot id
  int64_t pid = 0;    // the publisher's process
  int fd = -1;        // its slot table (memfd), opened as /proc/<pid>/fd/<fd>
  std::string nonce;  // the table's first bytes
  int slot = 0;       // the slot's lock byte and version entry in the table
  int device = 0;     // the publisher's device ordinal (in its process)
  device::IpcMemHandle handle;
  std::vector<WeightSet::Entry> tensors;  // offsets from the slot's start

  std::string Encode() const;
  // InvalidArgument naming what is missing or malformed.
  static Result<DeviceWeightRecord> Decode(std::string_view text);
};

struct DeviceWeightOptions {
  int slots = 2;     // device copies a publisher keeps for its node's readers
  std::string node;  // this process's node ("" : BootId())
};

struct DeviceWeightStats {
  int64_t versions_shared = 0;      // published into a device slot
  int64_t versions_not_shared = 0;  // every slot held by a reader: host only
  int64_t versions_by_ipc = 0;      // read device to device from a slot
  int64_t versions_staged = 0;      // read through the host and a pinned buffer
};

class DeviceWeightStream {
 public:
  // `stream` outlives this; `device` is the ordinal the tensors live on.
  DeviceWeightStream(WeightStream& stream, device::Api& api, int device,
                     DeviceWeightOptions options = {});
  // Frees the slots, the pinned buffers and the stream, and closes the slots
  // opened from other processes.
  ~DeviceWeightStream();
  DeviceWeightStream(const DeviceWeightStream&) = delete;
  DeviceWeightStream& operator=(const DeviceWeightStream&) = delete;

  // Publishes a version of the tensors (device memory of `device`); returns
  // its number once the host copy is stored. Blocks for the two copies and
  // the host version's Publish, never for readers.
  Result<int64_t> Publish(const std::vector<DeviceWeightTensor>& tensors, int64_t step,
                          std::chrono::milliseconds timeout = std::chrono::seconds(60));

  // Copies version `version` (0: the newest) into `targets`, one per tensor
  // of the version, by name and of its size (InvalidArgument otherwise, and
  // nothing copied); returns the version read. NotFound as WeightStream::At.
  Result<int64_t> ReadInto(int64_t version, const std::vector<DeviceWeightTarget>& targets,
                           std::chrono::milliseconds timeout);

  DeviceWeightStats stats() const { return stats_; }
  // Why the last ReadInto went through the host ("" after one by IPC).
  const std::string& last_staged_reason() const { return staged_reason_; }

 private:
  struct Slot {
    void* data = nullptr;
    size_t bytes = 0;
    device::IpcMemHandle handle;
  };
  struct Peer;  // a publisher's slot table opened by a reader

  Status Prepare();  // the stream and the slot table, on first use
  Result<Slot*> LockFreeSlot(size_t bytes, int* index);
  void UnlockSlot(int index, int64_t version);
  Result<const DeviceWeightRecord*> FindRecord(int64_t version);
  // true: copied by IPC; false: read it staged (staged_reason_ says why);
  // an error: the targets do not fit the version.
  Result<bool> ReadByIpc(const DeviceWeightRecord& r,
                         const std::vector<DeviceWeightTarget>& targets);
  Status ReadStaged(int64_t version, const std::vector<DeviceWeightTarget>& targets,
                    std::chrono::milliseconds timeout);
  Result<void*> Pinned(size_t bytes, std::pair<void*, size_t>& buffer);

  WeightStream& stream_;
  device::Api& api_;
  int device_;
  DeviceWeightOptions options_;
  std::string topic_;
  device::Stream cuda_stream_ = nullptr;
  bool prepared_ = false;
  // Publisher.
  int table_fd_ = -1;
  std::string nonce_;
  std::vector<Slot> slots_;
  int next_slot_ = 0;
  std::pair<void*, size_t> publish_pinned_{nullptr, 0};
  // Reader.
  std::pair<void*, size_t> read_pinned_{nullptr, 0};
  std::vector<DeviceWeightRecord> records_;             // the device topic's newest
  std::map<std::string, std::unique_ptr<Peer>> peers_;  // by node, pid, fd and nonce
  DeviceWeightStats stats_;
  std::string staged_reason_;
};

}  // namespace agentrt
