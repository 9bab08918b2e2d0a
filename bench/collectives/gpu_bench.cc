// The GPU figures of bench_collectives (only when a CUDA device is present):
// Group (NCCL, 1 rank) against a raw ncclAllReduce, and the AdamW kernel's
// achieved memory bandwidth against a device-to-device copy in the same run.
#include <cuda_runtime.h>
#include <nccl.h>

#include <chrono>
#include <cstdio>
#include <memory>
#include <vector>

#include "agent_runtime/adamw.h"
#include "agent_runtime/cuda/adamw_kernel.h"
#include "agent_runtime/cuda/nccl_group.h"
#include "agent_runtime/group.h"
#include "bench.h"

namespace agentrt::bench {
namespace {

bool CudaOk(cudaError_t e, const char* what) {
  if (e != cudaSuccess)
    std::fprintf(stderr, "bench_collectives: %s: %s\n", what, cudaGetErrorString(e));
  return e == cudaSuccess;
}

// Milliseconds per call of `fn` (enqueued on `stream`), median of `samples` runs of `iters` calls.
template <typename Fn>
double TimeStream(cudaStream_t stream, int samples, int iters, Fn fn) {
  cudaEvent_t a;
  cudaEvent_t b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  std::vector<double> ms;
  fn();
  cudaStreamSynchronize(stream);
  for (int s = 0; s < samples; ++s) {
    cudaEventRecord(a, stream);
    for (int i = 0; i < iters; ++i) fn();
    cudaEventRecord(b, stream);
    cudaEventSynchronize(b);
    float t = 0;
    cudaEventElapsedTime(&t, a, b);
    ms.push_back(static_cast<double>(t) / iters);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return Median(ms);
}

}  // namespace

bool RunGpuBench(std::vector<std::string>* figures) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) return false;
  if (!CudaOk(cudaSetDevice(0), "cudaSetDevice")) return false;

  // Group (NCCL, 1 rank) vs raw NCCL: both wait for every call to finish, as the Group does.
  GroupOptions o;
  o.backend = GroupBackend::kNccl;
  o.agent = "bench-nccl";
  o.has_gpus = true;
  auto group = MakeGroup(o);
  if (!group.ok()) {
    std::fprintf(stderr, "bench_collectives: %s\n", group.status().ToString().c_str());
    return false;
  }
  ncclComm_t raw;
  int dev = 0;
  if (ncclCommInitAll(&raw, 1, &dev) != ncclSuccess) return false;
  cudaStream_t stream;
  cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
  for (size_t bytes : {size_t{1} << 20, size_t{64} << 20}) {
    const size_t count = bytes / sizeof(float);
    float* buf = nullptr;
    if (!CudaOk(cudaMalloc(&buf, bytes), "cudaMalloc")) return false;
    cudaMemset(buf, 0, bytes);
    const int iters = bytes >= (size_t{64} << 20) ? 20 : 200;
    std::vector<double> t_raw;
    std::vector<double> t_group;
    for (int s = 0; s < 5; ++s) {
      auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < iters; ++i) {
        ncclAllReduce(buf, buf, count, ncclFloat32, ncclSum, raw, stream);
        cudaStreamSynchronize(stream);
      }
      t_raw.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() /
                      iters);
      t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < iters; ++i) {
        (void)(*group)->AllReduce(buf, count, DataType::kFloat32, ReduceOp::kSum);
      }
      t_group.push_back(
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / iters);
    }
    const double us_raw = Median(t_raw) * 1e6;
    const double us_group = Median(t_group) * 1e6;
    std::fprintf(stderr, "allreduce nccl 1 rank %s: raw %.1f us, group %.1f us\n",
                 SizeName(bytes).c_str(), us_raw, us_group);
    figures->push_back(FigureJson("allreduce_nccl_1rank_" + SizeName(bytes) + "_time", us_group,
                                  "us", "raw_ncclAllReduce", us_raw));
    cudaFree(buf);
  }
  ncclCommDestroy(raw);

  // AdamW kernel: 28 bytes moved per element (read p, g, m, v; write p, m, v).
  const size_t n = size_t{64} << 20;
  float* p = nullptr;
  float* g = nullptr;
  float* m = nullptr;
  float* v = nullptr;
  for (float** x : {&p, &g, &m, &v}) {
    if (!CudaOk(cudaMalloc(x, n * sizeof(float)), "cudaMalloc")) return false;
    cudaMemset(*x, 0, n * sizeof(float));
  }
  AdamWOptions ao;
  const AdamWScalars sc = MakeAdamWScalars(ao, 1, 1.0f);
  const double ms_adam =
      TimeStream(stream, 5, 10, [&] { cuda::LaunchAdamW(p, g, m, v, n, sc, stream); });
  const double adam_gbps = 28.0 * static_cast<double>(n) / (ms_adam * 1e-3) / 1e9;
  // Copy: 1 GiB device to device; read + write counted.
  const size_t copy_bytes = size_t{1} << 30;
  void* src = nullptr;
  void* dst = nullptr;
  if (!CudaOk(cudaMalloc(&src, copy_bytes), "cudaMalloc") ||
      !CudaOk(cudaMalloc(&dst, copy_bytes), "cudaMalloc")) {
    return false;
  }
  const double ms_copy = TimeStream(stream, 5, 5, [&] {
    cudaMemcpyAsync(dst, src, copy_bytes, cudaMemcpyDeviceToDevice, stream);
  });
  const double copy_gbps = 2.0 * static_cast<double>(copy_bytes) / (ms_copy * 1e-3) / 1e9;
  std::fprintf(stderr, "adamw kernel %.1f GB/s (%.3f ms for 64M params), device copy %.1f GB/s\n",
               adam_gbps, ms_adam, copy_gbps);
  figures->push_back(FigureJson("adamw_kernel_bandwidth_64M", adam_gbps, "GB/s",
                                "device_copy_bandwidth", copy_gbps));
  for (void* x : {static_cast<void*>(p), static_cast<void*>(g), static_cast<void*>(m),
                  static_cast<void*>(v), src, dst}) {
    cudaFree(x);
  }
  cudaStreamDestroy(stream);
  return true;
}

}  // namespace agentrt::bench
