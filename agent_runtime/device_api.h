// agentrt::device::Api — every CUDA runtime and NCCL call agentrt's GPU code
// makes, behind one small interface, so that the logic around them (stream
// ordering, polling and back-off, abort and deadlines, rendezvous, device
// choice) is the same code on a GPU and in the unit tests, which pass a fake
// that runs on the host (tests/agent_runtime/fake_device.h).
//
// The real implementation lives in its own shared library, libagentrt_cuda.so
// (agent_runtime/cuda/), built where CUDA and NCCL are found and linked against
// the shared cudart and NCCL. Nothing else in agentrt links either: the library
// is loaded by LoadDeviceApi() the first time a device group, the GPU inventory
// or the GPU preflight needs it, so every program and libagentrt_c.so start on
// a node without CUDA, and only GPU agents need libnccl.so.2 and
// libcudart.so.13.
//
// No CUDA or NCCL type appears here: handles are opaque pointers, errors come
// back as Status (translated in one place, keeping the call's name).
#pragma once

#include <array>
#include <cstddef>
#include <string>

#include "agent_runtime/adamw.h"
#include "agent_runtime/group.h"
#include "common/status.h"

namespace agentrt::device {

using Stream = void*;  // cudaStream_t; nullptr is the legacy default stream
using Event = void*;   // cudaEvent_t
using Comm = void*;    // ncclComm_t

struct UniqueId {  // ncclUniqueId
  std::array<char, 128> bytes{};
};

enum class CopyKind { kHostToDevice, kDeviceToHost, kDeviceToDevice };

struct IpcMemHandle {  // cudaIpcMemHandle_t
  std::array<char, 64> bytes{};
};

// Whether asynchronous work has finished: a stream drained, a non-blocking
// communicator left ncclInProgress, an enqueue went through.
enum class Progress { kDone, kPending };

// Thread-safety: every method may be called from any thread. Device calls act
// on the calling thread's current device (SetDevice), as the CUDA runtime does.
// Every call returns at once unless it says it blocks.
class Api {
 public:
  virtual ~Api() = default;

  // Devices this process sees. 0 when the driver reports no device
  // (cudaErrorNoDevice, e.g. CUDA_VISIBLE_DEVICES=""); any other failure
  // (an old driver, a broken install) is an error carrying CUDA's text.
  virtual Result<int> DeviceCount() = 0;
  virtual Result<int> CurrentDevice() = 0;
  virtual Status SetDevice(int device) = 0;
  virtual Result<bool> CanAccessPeer(int device, int peer) = 0;

  // A non-blocking stream (never synchronises with the legacy stream) on the
  // current device.
  virtual Result<Stream> CreateStream() = 0;
  virtual void DestroyStream(Stream stream) = 0;
  // An event without timing, for ordering only.
  virtual Result<Event> CreateEvent() = 0;
  virtual void DestroyEvent(Event event) = 0;
  virtual Status RecordEvent(Event event, Stream stream) = 0;
  // Work enqueued on `stream` after this call waits for `event`'s work.
  virtual Status StreamWaitEvent(Stream stream, Event event) = 0;
  // cudaStreamQuery: kDone when everything enqueued on `stream` has finished.
  virtual Result<Progress> QueryStream(Stream stream) = 0;
  // Blocks until `stream` drains.
  virtual Status SynchronizeStream(Stream stream) = 0;

  // Device memory on the current device (not zeroed).
  virtual Result<void*> Malloc(size_t bytes) = 0;
  virtual void Free(void* ptr) = 0;
  // Page-locked host memory (cudaHostAlloc): device-to-host copies into it
  // run asynchronously, off the calling thread. Usable by every device.
  virtual Result<void*> HostAlloc(size_t bytes) = 0;
  virtual void HostFree(void* ptr) = 0;
  virtual Status MemsetAsync(void* ptr, int value, size_t bytes, Stream stream) = 0;
  // Ordered on `stream`; host memory may be pageable (the copy returns once
  // the host bytes are staged; synchronise the stream before reading a
  // device-to-host result).
  virtual Status CopyAsync(void* dst, const void* src, size_t bytes, CopyKind kind,
                           Stream stream) = 0;

  // CUDA IPC: another process of this node maps device memory this one
  // allocated (Malloc). The handle names the allocation `ptr` starts; it is
  // opened on the calling thread's current device (with peer access when the
  // memory is on another device), never in the process that allocated it
  // (cudaIpcOpenMemHandle refuses that), and closed with IpcCloseMemHandle.
  virtual Result<IpcMemHandle> IpcGetMemHandle(void* ptr) = 0;
  virtual Result<void*> IpcOpenMemHandle(const IpcMemHandle& handle) = 0;
  virtual Status IpcCloseMemHandle(void* ptr) = 0;

  // ShardedAdam's kernels (float32, asynchronous on `stream`):
  // the update of agentrt::AdamWUpdate element for element, and the sum of
  // squares of x[0..n) added to the device double *out.
  virtual Status LaunchAdamW(float* params, const float* grads, float* m, float* v, size_t n,
                             const AdamWScalars& s, Stream stream) = 0;
  virtual Status LaunchSquaredNorm(const float* x, size_t n, double* out, Stream stream) = 0;

  // NCCL, always on non-blocking communicators (config.blocking = 0) so that
  // the caller can watch its deadline.
  virtual Result<UniqueId> GetUniqueId() = 0;
  // Starts ncclCommInitRankConfig on the current device; poll CommProgress.
  virtual Result<Comm> CommInitRank(int world_size, const UniqueId& id, int rank) = 0;
  // ncclCommGetAsyncError: kPending while ncclInProgress, an error for any
  // failure (carrying NCCL's text), else kDone.
  virtual Result<Progress> CommProgress(Comm comm) = 0;
  virtual Status CommFinalize(Comm comm) = 0;
  virtual void CommDestroy(Comm comm) = 0;
  // May block until the communicator's kernels leave the device, which can
  // wait behind other work on it: call it off the caller's thread when the
  // caller must not wait (see NcclGroup's abort).
  virtual void CommAbort(Comm comm) = 0;

  // Collectives, enqueued on `stream`. kPending: the non-blocking enqueue is
  // still in progress (poll CommProgress before the stream).
  virtual Result<Progress> AllReduce(const void* send, void* recv, size_t count, DataType type,
                                     ReduceOp op, Comm comm, Stream stream) = 0;
  virtual Result<Progress> ReduceScatter(const void* send, void* recv, size_t recv_count,
                                         DataType type, ReduceOp op, Comm comm, Stream stream) = 0;
  virtual Result<Progress> AllGather(const void* send, void* recv, size_t send_count, DataType type,
                                     Comm comm, Stream stream) = 0;
  virtual Result<Progress> Broadcast(void* buf, size_t count, DataType type, int root, Comm comm,
                                     Stream stream) = 0;
};

// True when this machine has an NVIDIA driver (libcuda.so.1 loads). Without
// one there is no GPU to use and agentrt reports 0 GPUs; with one, any failure
// to use the GPUs is an error that says why.
bool DriverPresent();

// The process's real Api: libagentrt_cuda.so, loaded once (thread-safe) from
// the folder of the binary or library that holds agentrt (and ../lib beside
// it), else through the dynamic linker's path. Fails, saying what is missing
// (libnccl.so.2, libcudart.so.13, the library itself, or a build without
// CUDA), and what to do.
Result<Api*> LoadDeviceApi();

// Makes `device` the calling thread's current device and restores the one it
// had when the guard ends: device calls made in between act on `device`.
class DeviceGuard {
 public:
  DeviceGuard(Api* api, int device);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;
  const Status& status() const { return status_; }

 private:
  Api* api_;
  int previous_ = -1;
  bool changed_ = false;  // the guard set `device`: it restores `previous_`
  Status status_;
};

}  // namespace agentrt::device
