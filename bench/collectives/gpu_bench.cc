// The GPU figures of bench_collectives. On one process and one GPU an
// all-reduce moves no data, so its figure is the Group's per-call overhead
// over a raw ncclAllReduce + cudaStreamSynchronize (named "_overhead", never a
// bandwidth); a bus bandwidth needs ranks on two or more GPUs (agentctl check
// measures it across an agent's own ranks). The AdamW kernel's memory
// bandwidth is compared with a device-to-device copy in the same run. Every
// CUDA/NCCL status is checked; everything allocated is freed.
#include <cuda_runtime.h>
#include <nccl.h>

#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "agent_runtime/adamw.h"
#include "agent_runtime/device_api.h"
#include "agent_runtime/group.h"
#include "bench.h"

namespace agentrt::bench {
namespace {

// The failure, or "" when every call went through.
std::string Check(cudaError_t e, const char* what) {
  return e == cudaSuccess ? "" : std::string(what) + ": " + cudaGetErrorString(e);
}
std::string Check(ncclResult_t r, const char* what) {
  return r == ncclSuccess ? "" : std::string(what) + ": " + ncclGetErrorString(r);
}
#define BENCH_TRY(call)                                             \
  do {                                                              \
    if (std::string e = Check((call), #call); !e.empty()) return e; \
  } while (false)

// Device buffers freed when the scope ends.
struct DeviceBuffers {
  std::vector<void*> ptrs;
  ~DeviceBuffers() {
    for (void* p : ptrs) cudaFree(p);
  }
  std::string Alloc(size_t bytes, void** out) {
    BENCH_TRY(cudaMalloc(out, bytes));
    ptrs.push_back(*out);
    BENCH_TRY(cudaMemset(*out, 0, bytes));
    return "";
  }
};

// Milliseconds per call of `fn` (enqueued on `stream`), median of `samples` runs of `iters` calls.
template <typename Fn>
std::string TimeStream(cudaStream_t stream, int samples, int iters, Fn fn, double* ms_out) {
  cudaEvent_t a = nullptr;
  cudaEvent_t b = nullptr;
  BENCH_TRY(cudaEventCreate(&a));
  BENCH_TRY(cudaEventCreate(&b));
  std::vector<double> ms;
  std::string err = fn();
  if (err.empty()) err = Check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  for (int s = 0; s < samples && err.empty(); ++s) {
    err = Check(cudaEventRecord(a, stream), "cudaEventRecord");
    for (int i = 0; i < iters && err.empty(); ++i) err = fn();
    if (err.empty()) err = Check(cudaEventRecord(b, stream), "cudaEventRecord");
    if (err.empty()) err = Check(cudaEventSynchronize(b), "cudaEventSynchronize");
    float t = 0;
    if (err.empty()) err = Check(cudaEventElapsedTime(&t, a, b), "cudaEventElapsedTime");
    ms.push_back(static_cast<double>(t) / iters);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  if (err.empty()) *ms_out = Median(ms);
  return err;
}

std::string GroupOverhead(cudaStream_t stream, std::vector<std::string>* figures) {
  GroupOptions o;
  o.backend = GroupBackend::kNccl;
  o.agent = "bench-nccl";
  o.visible_gpus = 1;
  auto group = MakeGroup(o);
  if (!group.ok()) return group.status().ToString();
  ncclComm_t raw = nullptr;
  int dev = 0;
  BENCH_TRY(ncclCommInitAll(&raw, 1, &dev));
  std::unique_ptr<ncclComm, decltype(&ncclCommDestroy)> owned(raw, &ncclCommDestroy);
  DeviceBuffers buffers;
  for (size_t bytes : {size_t{1} << 20, size_t{64} << 20}) {
    const size_t count = bytes / sizeof(float);
    void* buf = nullptr;
    if (std::string e = buffers.Alloc(bytes, &buf); !e.empty()) return e;
    const int iters = bytes >= (size_t{64} << 20) ? 20 : 200;
    std::vector<double> t_raw;
    std::vector<double> t_group;
    for (int s = 0; s < 5; ++s) {
      auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < iters; ++i) {
        BENCH_TRY(ncclAllReduce(buf, buf, count, ncclFloat32, ncclSum, raw, stream));
        BENCH_TRY(cudaStreamSynchronize(stream));
      }
      t_raw.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() /
                      iters);
      t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < iters; ++i) {
        const Status st = (*group)->AllReduce(buf, count, DataType::kFloat32, ReduceOp::kSum);
        if (!st.ok()) return st.ToString();
      }
      t_group.push_back(
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / iters);
    }
    const double us_raw = Median(t_raw) * 1e6;
    const double us_group = Median(t_group) * 1e6;
    std::fprintf(stderr, "allreduce nccl 1 rank %s (overhead only): raw %.1f us, group %.1f us\n",
                 SizeName(bytes).c_str(), us_raw, us_group);
    figures->push_back(FigureJson("allreduce_nccl_1rank_" + SizeName(bytes) + "_overhead", us_group,
                                  "us", "raw ncclAllReduce + cudaStreamSynchronize", us_raw));
  }
  return "";
}

std::string AdamWBandwidth(cudaStream_t stream, std::vector<std::string>* figures) {
  Result<device::Api*> api = device::LoadDeviceApi();
  if (!api.ok()) return api.status().ToString();
  DeviceBuffers buffers;
  // AdamW kernel: 28 bytes moved per element (read p, g, m, v; write p, m, v).
  const size_t n = size_t{64} << 20;
  void* p[4] = {};
  for (void*& x : p) {
    if (std::string e = buffers.Alloc(n * sizeof(float), &x); !e.empty()) return e;
  }
  AdamWOptions ao;
  const AdamWScalars sc = MakeAdamWScalars(ao, 1, 1.0f);
  double ms_adam = 0;
  std::string err = TimeStream(
      stream, 5, 10,
      [&]() -> std::string {
        const Status s = (*api)->LaunchAdamW(
            static_cast<float*>(p[0]), static_cast<const float*>(p[1]), static_cast<float*>(p[2]),
            static_cast<float*>(p[3]), n, sc, stream);
        return s.ok() ? "" : s.ToString();
      },
      &ms_adam);
  if (!err.empty()) return err;
  const double adam_gbps = 28.0 * static_cast<double>(n) / (ms_adam * 1e-3) / 1e9;
  // Copy: 1 GiB device to device; read + write counted.
  const size_t copy_bytes = size_t{1} << 30;
  void* src = nullptr;
  void* dst = nullptr;
  if (std::string e = buffers.Alloc(copy_bytes, &src); !e.empty()) return e;
  if (std::string e = buffers.Alloc(copy_bytes, &dst); !e.empty()) return e;
  double ms_copy = 0;
  err = TimeStream(
      stream, 5, 5,
      [&] {
        return Check(cudaMemcpyAsync(dst, src, copy_bytes, cudaMemcpyDeviceToDevice, stream),
                     "cudaMemcpyAsync");
      },
      &ms_copy);
  if (!err.empty()) return err;
  const double copy_gbps = 2.0 * static_cast<double>(copy_bytes) / (ms_copy * 1e-3) / 1e9;
  std::fprintf(stderr, "adamw kernel %.1f GB/s (%.3f ms for 64M params), device copy %.1f GB/s\n",
               adam_gbps, ms_adam, copy_gbps);
  figures->push_back(FigureJson("adamw_kernel_bandwidth_64M", adam_gbps, "GB/s",
                                "device-to-device cudaMemcpyAsync", copy_gbps));
  return "";
}

}  // namespace

GpuBenchOutcome RunGpuBench(std::vector<std::string>* figures) {
  if (!device::DriverPresent())
    return {false, "no NVIDIA driver (libcuda.so.1): GPU figures skipped"};
  int devices = 0;
  if (std::string e = Check(cudaGetDeviceCount(&devices), "cudaGetDeviceCount"); !e.empty())
    return {true, e};
  if (devices == 0) return {false, "the driver reports no GPU: GPU figures skipped"};
  if (std::string e = Check(cudaSetDevice(0), "cudaSetDevice"); !e.empty()) return {true, e};
  cudaStream_t stream = nullptr;
  if (std::string e = Check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking),
                            "cudaStreamCreateWithFlags");
      !e.empty()) {
    return {true, e};
  }
  std::string err = GroupOverhead(stream, figures);
  if (err.empty()) err = AdamWBandwidth(stream, figures);
  cudaStreamDestroy(stream);
  if (devices < 2) {
    std::fprintf(stderr, "bench_collectives: 1 GPU: no NCCL bandwidth figure (needs 2 or more)\n");
  }
  return {true, err};
}

}  // namespace agentrt::bench
