// The memory and math ShardedAdam needs, for host or device buffers (not part
// of the public API). The host version lives in sharded_adam.cc; the device one
// in device_shard_ops.cc, over device::Api. No CUDA types appear here.
#pragma once

#include <cstddef>
#include <memory>

#include "agent_runtime/adamw.h"
#include "common/status.h"

namespace agentrt::device {
class Api;
}  // namespace agentrt::device

namespace agentrt::internal {

class ShardOps {
 public:
  virtual ~ShardOps() = default;
  // Zero-filled buffer of n floats, or a Status naming the size that failed.
  virtual Result<float*> Alloc(size_t n) = 0;
  virtual void Free(float* p) = 0;
  // Copies between buffers of this kind (regions may overlap).
  virtual Status Copy(float* dst, const float* src, size_t n) = 0;
  // Copies between this kind of memory and the host.
  virtual Status ToHost(void* host_dst, const float* src, size_t n) = 0;
  virtual Status FromHost(float* dst, const void* host_src, size_t n) = 0;
  virtual Result<double> SquaredNorm(const float* x, size_t n) = 0;
  // Runs AdamW on n elements and returns once they are updated.
  virtual Status Update(float* params, const float* grads, float* m, float* v, size_t n,
                        const AdamWScalars& s) = 0;
  // Device buffers: the API, the device and the stream their work runs on
  // (a checkpoint stages them from there); host buffers: null.
  virtual device::Api* api() const { return nullptr; }
  virtual int device() const { return -1; }
  virtual void* stream() const { return nullptr; }
};

std::unique_ptr<ShardOps> MakeHostShardOps();
// Device buffers on `device` (an index among the visible GPUs), whatever
// device the calling thread has current; copies and kernels on a stream of
// its own, complete when each call returns.
Result<std::unique_ptr<ShardOps>> MakeDeviceShardOps(device::Api* api, int device);

}  // namespace agentrt::internal
