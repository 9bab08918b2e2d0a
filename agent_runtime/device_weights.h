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
// version) and then a small record of the version on the stream's device
// topic "weights-device/<name>" (governed by the ACL as the stream: only its
// subscribers read it): node, process, slot, the slot's CUDA IPC handle and
// where each tensor lies in it, or that the version has no slot
// (DeviceWeightRecord). Both calls order their copies after the work already
// enqueued on the caller's stream (`after`; the legacy default stream when
// null), and return with the copies complete.
//
// ReadInto on the same node finds the version's record (waiting up to 1 s
// for it, as it follows the version), opens the slot with its IPC handle,
// copies each tensor device to device into the caller's buffers and closes
// the handle: no byte through the host. A reader elsewhere, in the
// publisher's process (CUDA refuses IPC there), where the slot cannot be
// opened, or of a version without a slot reads the host version
// (WeightStream::At: mapped from the broker's file on its node, or through
// the node folder) and copies it to the device through a pinned buffer. The
// two paths give the same bytes.
//
// A slot is never rewritten or freed while a reader copies from it, and
// Publish never waits for readers: each slot has a byte-range lock
// (F_OFD_SETLK) in a small memfd of the publisher's, which readers open as
// /proc/<pid>/fd/<fd> (possible only for processes that may read the
// publisher's /proc entries: its user's, and root; the memfd starts with a
// random nonce the record carries, so a reader never trusts another
// process's file). A reader holds the slot's read lock from before it opens
// the handle until it has closed it; Publish takes a slot only when it gets
// the write lock at once, and otherwise the next slot; when every slot is
// held, the version gets no slot (counted) and its readers read it through
// the host. Under the write lock the memfd records which version the slot
// holds, so a reader that asks for a version whose slot was reused reads it
// through the host. A slot is freed only under its write lock: the
// destructor marks every slot empty and waits (up to 10 s) for a reader
// still copying from one; a slot still read then is left to the process's
// exit. A reader killed while copying releases its lock with its
// descriptors; a publisher that dies takes its memfd and (on a GPU) its
// device memory with it, and its readers find its table gone.
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
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "agent_runtime/device_api.h"
#include "common/status.h"
#include "comms/weight_stream.h"

namespace agentrt {

// The slot table's layout, shared by the publisher's and readers' processes:
// a random nonce (RandomHex64) at 0, slot i's version at kSlotVersionsAt + 8 i
// (0: none), slot i's lock at byte kSlotLocksAt + i.
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
// stream's device, exactly the tensor's size; with `dtype` or `shape` set,
// also of that dtype label and shape (a bfloat16 version read into float16
// buffers of the same size is refused, not reinterpreted).
struct DeviceWeightTarget {
  DeviceWeightTarget(std::string name_in, void* data_in, size_t bytes_in, std::string dtype_in = "",
                     std::vector<int64_t> shape_in = {})
      : name(std::move(name_in)),
        data(data_in),
        bytes(bytes_in),
        dtype(std::move(dtype_in)),
        shape(std::move(shape_in)) {}
  std::string name;
  void* data = nullptr;
  size_t bytes = 0;
  std::string dtype;           // "": not checked
  std::vector<int64_t> shape;  // checked when dtype is set
};

// The device topic's message, one per version: where the version lies in
// its publisher's device slot, or that it has none (slot -1). A JSON object;
// Encode and Decode are each other's inverse.
struct DeviceWeightRecord {
  int64_t version = 0;
  int64_t step = 0;
  std::string node;   // the publisher's boot id
  int64_t pid = 0;    // the publisher's process
  int fd = -1;        // its slot table (memfd), opened as /proc/<pid>/fd/<fd>
  std::string nonce;  // the table's first bytes
  int slot = -1;      // the slot's lock byte and version entry; -1: no slot
  int slots = 0;      // the publisher's slot count
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
  int64_t versions_not_shared = 0;  // every slot held by readers, or no slot made: host only
  int64_t slot_failures = 0;        // a slot could not be made (last_slot_error)
  int64_t versions_by_ipc = 0;      // read device to device from a slot
  int64_t versions_staged = 0;      // read through the host and a pinned buffer
};

class DeviceWeightStream {
 public:
  // `stream` outlives this; `device` is the ordinal the tensors live on.
  DeviceWeightStream(WeightStream& stream, device::Api& api, int device,
                     DeviceWeightOptions options = {});
  // Frees the slots (each once no reader copies from it, waiting up to 10 s),
  // the pinned buffers, the stream and the event.
  ~DeviceWeightStream();
  DeviceWeightStream(const DeviceWeightStream&) = delete;
  DeviceWeightStream& operator=(const DeviceWeightStream&) = delete;

  // Publishes a version of the tensors (device memory of `device`, read
  // after the work enqueued on `after` before the call); returns its number
  // once the host copy is stored. Blocks for the two copies and the host
  // version's Publish, never for readers. A slot that cannot be made (device
  // memory, the memfd) is said in last_slot_error(); versions are then
  // published to the host only, without trying again.
  Result<int64_t> Publish(const std::vector<DeviceWeightTensor>& tensors, int64_t step,
                          std::chrono::milliseconds timeout = kWeightsPublishTimeout,
                          device::Stream after = nullptr);

  // Copies version `version` (0: the newest) into `targets`, one per tensor
  // of the version, by name and of its size (InvalidArgument otherwise, and
  // nothing copied), after the work enqueued on `after` before the call;
  // returns the version read, the copies complete. NotFound as
  // WeightStream::At.
  Result<int64_t> ReadInto(int64_t version, const std::vector<DeviceWeightTarget>& targets,
                           std::chrono::milliseconds timeout, device::Stream after = nullptr);

  DeviceWeightStats stats() const { return stats_; }
  // Why the last ReadInto went through the host ("" after one by IPC).
  const std::string& last_staged_reason() const { return staged_reason_; }
  const Status& last_slot_error() const { return slot_error_; }

 private:
  struct Slot {
    void* data = nullptr;
    size_t bytes = 0;
    device::IpcMemHandle handle;
  };

  // The side stream and event on first use; then the side stream waits for
  // the work enqueued on `after`.
  Status Prepare(device::Stream after);
  // A slot of at least `bytes` whose write lock this holds (nullptr: every
  // slot is held by readers).
  Result<Slot*> LockFreeSlot(size_t bytes, int* index);
  void UnlockSlot(int index, int64_t version);
  // The record of `version` (waiting for it up to `timeout`, at most 1 s);
  // NotFound naming why there is none.
  Result<DeviceWeightRecord> FindRecord(int64_t version, std::chrono::milliseconds timeout);
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
  device::Stream side_ = nullptr;
  device::Event after_event_ = nullptr;
  // Publisher.
  int table_fd_ = -1;
  std::string nonce_;
  std::vector<Slot> slots_;
  int next_slot_ = 0;
  Status slot_error_;  // not OK: no slot is made any more
  std::pair<void*, size_t> publish_pinned_{nullptr, 0};
  // Reader.
  std::pair<void*, size_t> read_pinned_{nullptr, 0};
  DeviceWeightStats stats_;
  std::string staged_reason_;
};

}  // namespace agentrt
