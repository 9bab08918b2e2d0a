// The NCCL backend and ShardedAdam's CUDA kernel on one GPU (label gpu), with
// the real libagentrt_cuda.so. On a machine without an NVIDIA driver the
// program reports "skipped" to CTest; with a driver, any CUDA error fails.
#include <cuda_runtime.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <thread>
#include <vector>

#include "agent_runtime/adamw.h"
#include "agent_runtime/device_api.h"
#include "agent_runtime/group.h"
#include "agent_runtime/group_half.h"
#include "agent_runtime/sharded_adam.h"
#include "tests/agent_runtime/free_port.h"
#include "tests/agent_runtime/group_test_util.h"

namespace agentrt {
namespace testing {
cudaError_t LaunchSpinUntil(volatile int* device_flag, cudaStream_t stream);
}  // namespace testing

namespace {

// Without a device the whole program reports "skipped" to CTest (exit 77,
// SKIP_RETURN_CODE in group.cmake) instead of passing cases that ran nothing.
constexpr int kSkipped = 77;

void RequireDeviceOrSkip() {
  if (!device::DriverPresent()) {
    std::printf("skipped: no NVIDIA driver (libcuda.so.1) on this machine\n");
    std::fflush(stdout);
    std::_Exit(kSkipped);
  }
  // A driver but no usable device is a failure with CUDA's own words.
  int n = 0;
  const cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess || n == 0) {
    std::printf("FAILED: the NVIDIA driver is present but %s\n",
                err != cudaSuccess ? cudaGetErrorString(err) : "it reports no GPU");
    std::fflush(stdout);
    std::_Exit(1);
  }
}

device::Api* RealApi() {
  auto api = device::LoadDeviceApi();
  if (!api.ok()) FAIL(api.status().ToString());
  return *api;
}

std::unique_ptr<Group> NcclGroup(const char* agent) {
  GroupOptions o;
  o.agent = agent;
  o.visible_gpus = 1;  // kAuto must pick nccl, for one rank too
  auto g = MakeGroup(o);
  if (!g.ok()) FAIL(g.status().ToString());
  return std::move(g).value();
}

template <typename T>
struct DeviceBuffer {
  explicit DeviceBuffer(size_t n) : count(n) {
    REQUIRE(cudaMalloc(&ptr, n * sizeof(T)) == cudaSuccess);
  }
  ~DeviceBuffer() { cudaFree(ptr); }
  // Pageable host memory, copied on the stream the collectives order after
  // (the legacy default stream), then waited for.
  void Upload(const std::vector<T>& h) {
    REQUIRE(cudaMemcpyAsync(ptr, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice, nullptr) ==
            cudaSuccess);
    REQUIRE(cudaStreamSynchronize(nullptr) == cudaSuccess);
  }
  std::vector<T> Download() const {
    std::vector<T> h(count);
    REQUIRE(cudaMemcpy(h.data(), ptr, count * sizeof(T), cudaMemcpyDeviceToHost) == cudaSuccess);
    return h;
  }
  T* ptr = nullptr;
  size_t count;
};

TEST_CASE("nccl group on one rank runs every op on device buffers") {
  RequireDeviceOrSkip();
  auto g = NcclGroup("gpu-test");
  CHECK(g->backend() == "nccl");
  CHECK(g->device_buffers());
  CHECK(g->size() == 1);
  const size_t n = 4097;
  std::vector<float> h(n);
  for (size_t i = 0; i < n; ++i) h[i] = static_cast<float>(i) * 0.5f;
  DeviceBuffer<float> f(n);
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax}) {
    f.Upload(h);
    REQUIRE(g->AllReduce(f.ptr, n, DataType::kFloat32, op).ok());
    CHECK(f.Download() == h);
  }
  std::vector<int64_t> hi(n);
  for (size_t i = 0; i < n; ++i) hi[i] = (int64_t{1} << 40) + static_cast<int64_t>(i);
  DeviceBuffer<int64_t> i64(n);
  i64.Upload(hi);
  REQUIRE(g->AllReduce(i64.ptr, n, DataType::kInt64, ReduceOp::kSum).ok());
  CHECK(i64.Download() == hi);
  std::vector<uint16_t> hb(n);
  for (size_t i = 0; i < n; ++i) hb[i] = internal::FloatToBF16(static_cast<float>(i % 100));
  DeviceBuffer<uint16_t> b16(n);
  b16.Upload(hb);
  REQUIRE(g->AllReduce(b16.ptr, n, DataType::kBFloat16, ReduceOp::kSum).ok());
  CHECK(b16.Download() == hb);
  REQUIRE(g->AllReduce(b16.ptr, n, DataType::kFloat16, ReduceOp::kMax).ok());

  DeviceBuffer<float> out(n);
  f.Upload(h);
  REQUIRE(g->ReduceScatter(f.ptr, out.ptr, n, DataType::kFloat32, ReduceOp::kSum).ok());
  CHECK(out.Download() == h);
  REQUIRE(g->AllGather(f.ptr, out.ptr, n, DataType::kFloat32).ok());
  CHECK(out.Download() == h);
  REQUIRE(g->AllGather(f.ptr, f.ptr, n, DataType::kFloat32).ok());  // in place
  REQUIRE(g->Broadcast(f.ptr, n, DataType::kFloat32, 0).ok());
  CHECK(f.Download() == h);
  CHECK(g->Broadcast(f.ptr, n, DataType::kFloat32, 1).code() == StatusCode::kInvalidArgument);
  REQUIRE(g->Barrier().ok());
}

TEST_CASE("nccl collective that never completes returns at its timeout, the abort detached") {
  RequireDeviceOrSkip();
  auto g = NcclGroup("stuck-gpu");
  auto stream = static_cast<cudaStream_t>(g->native_stream());
  REQUIRE(stream != nullptr);
  int* host_flag = nullptr;
  REQUIRE(cudaHostAlloc(&host_flag, sizeof(int), cudaHostAllocMapped) == cudaSuccess);
  *host_flag = 0;
  int* device_flag = nullptr;
  REQUIRE(cudaHostGetDevicePointer(&device_flag, host_flag, 0) == cudaSuccess);
  REQUIRE(testing::LaunchSpinUntil(device_flag, stream) == cudaSuccess);

  // Failsafe: should the call wait for the abort (which waits for the
  // spinner), release the spinner late enough that the timing check catches it.
  std::atomic<bool> returned{false};
  std::atomic<bool> failsafe_fired{false};
  std::thread failsafe([&] {
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(12);
    while (!returned.load() && std::chrono::steady_clock::now() < until) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    if (!returned.load()) failsafe_fired = true;
    *reinterpret_cast<volatile int*>(host_flag) = 1;
  });

  DeviceBuffer<float> buf(1024);
  const auto t0 = std::chrono::steady_clock::now();
  Status s =
      g->AllReduce(buf.ptr, 1024, DataType::kFloat32, ReduceOp::kSum, std::chrono::seconds(2));
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  returned = true;
  failsafe.join();
  INFO("took " << took << " s; failsafe fired: " << failsafe_fired.load() << "; " << s.ToString());
  CHECK(s.code() == StatusCode::kDeadlineExceeded);
  CHECK_THAT(s.message(),
             Catch::Contains(
                 "agent stuck-gpu rank 0 (nccl): allreduce of 1024 float32 timed out after 2 s") &&
                 Catch::Contains("aborted"));
  CHECK(took >= 1.9);
  CHECK(took < 4.0);
  CHECK_FALSE(failsafe_fired.load());
  // The group is unusable afterwards, and says so.
  CHECK(g->Barrier().code() == StatusCode::kAborted);
  cudaDeviceSynchronize();
  cudaFreeHost(host_flag);
}

TEST_CASE("nccl group whose peer never joins gives up at init_timeout, naming the agent") {
  RequireDeviceOrSkip();
  GroupOptions o;
  o.agent = "lonely-gpu";
  o.visible_gpus = 1;
  o.rank = 0;
  o.world_size = 2;  // rank 1 never starts
  o.master_addr = "127.0.0.1";
  o.master_port = testing::FreeTestPort();
  o.init_timeout = std::chrono::seconds(3);
  const auto t0 = std::chrono::steady_clock::now();
  auto g = MakeGroup(o);
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  REQUIRE_FALSE(g.ok());
  INFO(g.status().ToString() << " after " << took << " s");
  CHECK(g.status().code() == StatusCode::kDeadlineExceeded);
  CHECK_THAT(g.status().message(), Catch::Contains("agent lonely-gpu rank 0 (nccl)"));
  CHECK(took < 3.0 + 5.0);
}

TEST_CASE("ShardedAdam's CUDA kernel matches the CPU result") {
  RequireDeviceOrSkip();
  auto device_group = NcclGroup("adam-gpu");
  auto host_group = MakeSingleRankGroup("adam-cpu");
  for (size_t n : {size_t{1} << 16, size_t{100003}}) {
    AdamWOptions o;
    o.lr = 1e-2f;
    o.weight_decay = 0.05f;
    o.max_grad_norm = 3.0f;
    ShardedAdam gpu(*device_group, n, o);
    ShardedAdam cpu(*host_group, n, o);
    std::vector<float> p = RandomVector(n, 5, 1.0f);
    DeviceBuffer<float> dp(n);
    DeviceBuffer<float> dg(n);
    dp.Upload(p);
    for (int step = 0; step < 10; ++step) {
      std::vector<float> grad = RandomVector(n, 50 + static_cast<uint32_t>(step), 0.2f);
      dg.Upload(grad);
      float gpu_norm = 0;
      float cpu_norm = 0;
      REQUIRE(gpu.Step(dp.ptr, dg.ptr, &gpu_norm).ok());
      REQUIRE(cpu.Step(p.data(), grad.data(), &cpu_norm).ok());
      CHECK(gpu_norm == Approx(cpu_norm).epsilon(1e-5));
    }
    const std::vector<float> got = dp.Download();
    for (size_t i = 0; i < n; ++i) REQUIRE(got[i] == Approx(p[i]).epsilon(1e-5).margin(1e-6));
    // Device state round-trips too.
    const std::vector<uint8_t> saved = gpu.SaveState();
    REQUIRE_FALSE(saved.empty());
    ShardedAdam restored(*device_group, n, o);
    REQUIRE(restored.LoadState(saved).ok());
    CHECK(restored.SaveState() == saved);
  }
}

TEST_CASE("AdamW kernel equals the host update, aligned and unaligned") {
  RequireDeviceOrSkip();
  const size_t n = 10001;
  std::vector<float> p = RandomVector(n + 1, 1, 1.0f);
  std::vector<float> g = RandomVector(n + 1, 2, 1.0f);
  std::vector<float> m = RandomVector(n + 1, 3, 0.1f);
  std::vector<float> v(n + 1, 0.01f);
  AdamWOptions o;
  o.weight_decay = 0.1f;
  const AdamWScalars s = MakeAdamWScalars(o, 3, 0.7f);
  for (size_t offset : {size_t{0}, size_t{1}}) {
    DeviceBuffer<float> dp(n + 1), dg(n + 1), dm(n + 1), dv(n + 1);
    dp.Upload(p);
    dg.Upload(g);
    dm.Upload(m);
    dv.Upload(v);
    REQUIRE(RealApi()
                ->LaunchAdamW(dp.ptr + offset, dg.ptr + offset, dm.ptr + offset, dv.ptr + offset, n,
                              s, nullptr)
                .ok());
    REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
    std::vector<float> hp = p, hm = m, hv = v;
    AdamWUpdate(hp.data() + offset, g.data() + offset, hm.data() + offset, hv.data() + offset, n,
                s);
    const std::vector<float> got = dp.Download();
    for (size_t i = 0; i < n + 1; ++i) REQUIRE(got[i] == Approx(hp[i]).epsilon(1e-6).margin(1e-7));
  }
}

}  // namespace
}  // namespace agentrt
