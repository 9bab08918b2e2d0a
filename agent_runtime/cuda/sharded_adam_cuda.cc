// ShardedAdam's device memory and math: the CUDA side of internal::ShardOps.
#include <cuda_runtime.h>

#include <string>

#include "agent_runtime/cuda/adamw_kernel.h"
#include "agent_runtime/cuda/cuda_check.h"
#include "agent_runtime/sharded_adam_ops.h"

namespace agentrt::internal {
namespace {

const std::string kWhere = "ShardedAdam (cuda)";

class CudaShardOps final : public ShardOps {
 public:
  CudaShardOps() {
    init_ = cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking);
    if (init_ == cudaSuccess) init_ = cudaMalloc(&norm_, sizeof(double));
  }
  ~CudaShardOps() override {
    if (norm_ != nullptr) cudaFree(norm_);
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }

  Result<float*> Alloc(size_t n) override {
    AGENTRT_CUDA_CHECK(init_, kWhere);
    if (n == 0) return static_cast<float*>(nullptr);
    void* p = nullptr;
    const cudaError_t err = cudaMalloc(&p, n * sizeof(float));
    if (err != cudaSuccess) {
      return ResourceExhausted(kWhere + ": cudaMalloc of " + std::to_string(n * sizeof(float)) +
                               " bytes failed: " + cudaGetErrorString(err));
    }
    AGENTRT_CUDA_CHECK(cudaMemset(p, 0, n * sizeof(float)), kWhere);
    return static_cast<float*>(p);
  }
  void Free(float* p) override { cudaFree(p); }
  Status Copy(float* dst, const float* src, size_t n) override {
    if (n == 0 || dst == src) return Status::Ok();
    AGENTRT_CUDA_CHECK(
        cudaMemcpyAsync(dst, src, n * sizeof(float), cudaMemcpyDeviceToDevice, stream_), kWhere);
    AGENTRT_CUDA_CHECK(cudaStreamSynchronize(stream_), kWhere);
    return Status::Ok();
  }
  Status ToHost(void* dst, const float* src, size_t n) override {
    if (n == 0) return Status::Ok();
    AGENTRT_CUDA_CHECK(cudaMemcpy(dst, src, n * sizeof(float), cudaMemcpyDeviceToHost), kWhere);
    return Status::Ok();
  }
  Status FromHost(float* dst, const void* src, size_t n) override {
    if (n == 0) return Status::Ok();
    AGENTRT_CUDA_CHECK(cudaMemcpy(dst, src, n * sizeof(float), cudaMemcpyHostToDevice), kWhere);
    return Status::Ok();
  }
  Result<double> SquaredNorm(const float* x, size_t n) override {
    AGENTRT_CUDA_CHECK(init_, kWhere);
    AGENTRT_CUDA_CHECK(cudaMemsetAsync(norm_, 0, sizeof(double), stream_), kWhere);
    AGENTRT_CUDA_CHECK(cuda::LaunchSquaredNorm(x, n, norm_, stream_), kWhere);
    double out = 0;
    AGENTRT_CUDA_CHECK(
        cudaMemcpyAsync(&out, norm_, sizeof(double), cudaMemcpyDeviceToHost, stream_), kWhere);
    AGENTRT_CUDA_CHECK(cudaStreamSynchronize(stream_), kWhere);
    return out;
  }
  Status Update(float* params, const float* grads, float* m, float* v, size_t n,
                const AdamWScalars& s) override {
    AGENTRT_CUDA_CHECK(cuda::LaunchAdamW(params, grads, m, v, n, s, stream_), kWhere);
    AGENTRT_CUDA_CHECK(cudaStreamSynchronize(stream_), kWhere);
    return Status::Ok();
  }

 private:
  cudaError_t init_ = cudaSuccess;
  cudaStream_t stream_ = nullptr;
  double* norm_ = nullptr;
};

}  // namespace

std::unique_ptr<ShardOps> MakeCudaShardOps() { return std::make_unique<CudaShardOps>(); }

}  // namespace agentrt::internal
