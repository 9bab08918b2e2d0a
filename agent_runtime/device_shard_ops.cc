// ShardedAdam's device memory and math: internal::ShardOps over device::Api,
// on the group's own device whichever device the calling thread has current.
#include <string>

#include "agent_runtime/device_api.h"
#include "agent_runtime/sharded_adam_ops.h"

namespace agentrt::internal {
namespace {

using device::CopyKind;

class DeviceShardOps final : public ShardOps {
 public:
  DeviceShardOps(device::Api* api, int device)
      : api_(api), device_(device), where_("ShardedAdam (device " + std::to_string(device) + ")") {}

  Status Init() {
    device::DeviceGuard guard(api_, device_);
    AGENTRT_RETURN_IF_ERROR(guard.status().WithContext(where_));
    Result<device::Stream> stream = api_->CreateStream();
    if (!stream.ok()) return stream.status().WithContext(where_);
    stream_ = *stream;
    Result<void*> norm = api_->Malloc(sizeof(double));
    if (!norm.ok()) return norm.status().WithContext(where_);
    norm_ = static_cast<double*>(*norm);
    return Status::Ok();
  }

  ~DeviceShardOps() override {
    device::DeviceGuard guard(api_, device_);
    api_->Free(norm_);
    api_->DestroyStream(stream_);
  }

  Result<float*> Alloc(size_t n) override {
    if (n == 0) return static_cast<float*>(nullptr);
    device::DeviceGuard guard(api_, device_);
    AGENTRT_RETURN_IF_ERROR(guard.status().WithContext(where_));
    Result<void*> p = api_->Malloc(n * sizeof(float));
    if (!p.ok()) return p.status().WithContext(where_);
    AGENTRT_RETURN_IF_ERROR(Finish(api_->MemsetAsync(*p, 0, n * sizeof(float), stream_)));
    return static_cast<float*>(*p);
  }
  void Free(float* p) override {
    device::DeviceGuard guard(api_, device_);
    api_->Free(p);
  }
  device::Api* api() const override { return api_; }
  int device() const override { return device_; }
  void* stream() const override { return stream_; }
  Status Copy(float* dst, const float* src, size_t n) override {
    if (n == 0 || dst == src) return Status::Ok();
    return Transfer(dst, src, n, CopyKind::kDeviceToDevice);
  }
  Status ToHost(void* dst, const float* src, size_t n) override {
    return Transfer(dst, src, n, CopyKind::kDeviceToHost);
  }
  Status FromHost(float* dst, const void* src, size_t n) override {
    return Transfer(dst, src, n, CopyKind::kHostToDevice);
  }
  Result<double> SquaredNorm(const float* x, size_t n) override {
    device::DeviceGuard guard(api_, device_);
    AGENTRT_RETURN_IF_ERROR(guard.status().WithContext(where_));
    AGENTRT_RETURN_IF_ERROR(Check(api_->MemsetAsync(norm_, 0, sizeof(double), stream_)));
    AGENTRT_RETURN_IF_ERROR(Check(api_->LaunchSquaredNorm(x, n, norm_, stream_)));
    double out = 0;
    AGENTRT_RETURN_IF_ERROR(
        Check(api_->CopyAsync(&out, norm_, sizeof(double), CopyKind::kDeviceToHost, stream_)));
    AGENTRT_RETURN_IF_ERROR(Finish(Status::Ok()));
    return out;
  }
  Status Update(float* params, const float* grads, float* m, float* v, size_t n,
                const AdamWScalars& s) override {
    device::DeviceGuard guard(api_, device_);
    AGENTRT_RETURN_IF_ERROR(guard.status().WithContext(where_));
    AGENTRT_RETURN_IF_ERROR(Check(api_->LaunchAdamW(params, grads, m, v, n, s, stream_)));
    return Finish(Status::Ok());
  }

 private:
  Status Check(const Status& s) const { return s.ok() ? s : s.WithContext(where_); }
  // Waits for this object's stream after `s` (the work enqueued so far).
  Status Finish(const Status& s) const {
    AGENTRT_RETURN_IF_ERROR(Check(s));
    return Check(api_->SynchronizeStream(stream_));
  }
  // Every copy, pageable host memory included, is ordered on this object's
  // stream and complete when the call returns.
  Status Transfer(void* dst, const void* src, size_t n, CopyKind kind) {
    if (n == 0) return Status::Ok();
    device::DeviceGuard guard(api_, device_);
    AGENTRT_RETURN_IF_ERROR(guard.status().WithContext(where_));
    return Finish(api_->CopyAsync(dst, src, n * sizeof(float), kind, stream_));
  }

  device::Api* api_;
  int device_;
  std::string where_;
  device::Stream stream_ = nullptr;
  double* norm_ = nullptr;
};

}  // namespace

Result<std::unique_ptr<ShardOps>> MakeDeviceShardOps(device::Api* api, int device) {
  auto ops = std::make_unique<DeviceShardOps>(api, device);
  AGENTRT_RETURN_IF_ERROR(ops->Init());
  return std::unique_ptr<ShardOps>(std::move(ops));
}

}  // namespace agentrt::internal
