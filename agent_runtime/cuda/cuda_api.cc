// The real device::Api: the CUDA runtime (shared cudart) and NCCL. Built into
// libagentrt_cuda.so only, which agentrt loads with dlopen when it first needs
// a GPU (agent_runtime/device_api.h says why).
#include <cuda_runtime.h>
#include <nccl.h>

#include <cstring>
#include <string>

#include "agent_runtime/cuda/adamw_kernel.h"
#include "agent_runtime/cuda/cuda_check.h"
#include "agent_runtime/device_api.h"
#include "common/enum_names.h"

namespace agentrt::device {
namespace {

const std::string kWhere = "cuda";

constexpr EnumPair<DataType, ncclDataType_t> kNcclTypes[] = {{DataType::kFloat32, ncclFloat32},
                                                             {DataType::kBFloat16, ncclBfloat16},
                                                             {DataType::kFloat16, ncclFloat16},
                                                             {DataType::kInt64, ncclInt64}};
constexpr EnumPair<ReduceOp, ncclRedOp_t> kNcclOps[] = {
    {ReduceOp::kSum, ncclSum}, {ReduceOp::kAvg, ncclAvg}, {ReduceOp::kMax, ncclMax}};
constexpr EnumPair<CopyKind, cudaMemcpyKind> kCudaCopies[] = {
    {CopyKind::kHostToDevice, cudaMemcpyHostToDevice},
    {CopyKind::kDeviceToHost, cudaMemcpyDeviceToHost},
    {CopyKind::kDeviceToDevice, cudaMemcpyDeviceToDevice}};

ncclDataType_t ToNccl(DataType type) { return MappedIn(kNcclTypes, type, ncclFloat32); }
ncclRedOp_t ToNccl(ReduceOp op) { return MappedIn(kNcclOps, op, ncclSum); }
cudaMemcpyKind ToCuda(CopyKind kind) { return MappedIn(kCudaCopies, kind, cudaMemcpyDefault); }

cudaStream_t S(Stream s) { return static_cast<cudaStream_t>(s); }
ncclComm_t C(Comm c) { return static_cast<ncclComm_t>(c); }

// An enqueue on a non-blocking communicator: in progress, done, or failed.
Result<Progress> Enqueued(ncclResult_t r, const char* call) {
  if (r == ncclInProgress) return Progress::kPending;
  if (r != ncclSuccess) return cuda::NcclStatus(r, call, __FILE__, __LINE__, kWhere);
  return Progress::kDone;
}

class CudaApi final : public Api {
 public:
  Result<int> DeviceCount() override {
    int n = 0;
    const cudaError_t err = cudaGetDeviceCount(&n);
    if (err == cudaErrorNoDevice) {
      (void)cudaGetLastError();  // clear the sticky error
      return 0;
    }
    AGENTRT_CUDA_CHECK(err, kWhere);
    return n;
  }
  Result<int> CurrentDevice() override {
    int d = 0;
    AGENTRT_CUDA_CHECK(cudaGetDevice(&d), kWhere);
    return d;
  }
  Status SetDevice(int device) override {
    AGENTRT_CUDA_CHECK(cudaSetDevice(device), kWhere + " device " + std::to_string(device));
    return Status::Ok();
  }
  Result<bool> CanAccessPeer(int device, int peer) override {
    int can = 0;
    AGENTRT_CUDA_CHECK(cudaDeviceCanAccessPeer(&can, device, peer), kWhere);
    return can != 0;
  }

  Result<Stream> CreateStream() override {
    cudaStream_t s = nullptr;
    AGENTRT_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), kWhere);
    return static_cast<Stream>(s);
  }
  void DestroyStream(Stream stream) override {
    if (stream != nullptr) cudaStreamDestroy(S(stream));
  }
  Result<Event> CreateEvent() override {
    cudaEvent_t e = nullptr;
    AGENTRT_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), kWhere);
    return static_cast<Event>(e);
  }
  void DestroyEvent(Event event) override {
    if (event != nullptr) cudaEventDestroy(static_cast<cudaEvent_t>(event));
  }
  Status RecordEvent(Event event, Stream stream) override {
    AGENTRT_CUDA_CHECK(cudaEventRecord(static_cast<cudaEvent_t>(event), S(stream)), kWhere);
    return Status::Ok();
  }
  Status StreamWaitEvent(Stream stream, Event event) override {
    AGENTRT_CUDA_CHECK(cudaStreamWaitEvent(S(stream), static_cast<cudaEvent_t>(event), 0), kWhere);
    return Status::Ok();
  }
  Result<Progress> QueryStream(Stream stream) override {
    const cudaError_t q = cudaStreamQuery(S(stream));
    if (q == cudaErrorNotReady) return Progress::kPending;
    AGENTRT_CUDA_CHECK(q, kWhere);
    return Progress::kDone;
  }
  Status SynchronizeStream(Stream stream) override {
    AGENTRT_CUDA_CHECK(cudaStreamSynchronize(S(stream)), kWhere);
    return Status::Ok();
  }

  Result<void*> Malloc(size_t bytes) override {
    void* p = nullptr;
    const cudaError_t err = cudaMalloc(&p, bytes);
    if (err != cudaSuccess) {
      return ResourceExhausted("cudaMalloc of " + std::to_string(bytes) +
                               " bytes failed: " + cudaGetErrorString(err));
    }
    return p;
  }
  void Free(void* ptr) override {
    if (ptr != nullptr) cudaFree(ptr);
  }
  Result<void*> HostAlloc(size_t bytes) override {
    void* p = nullptr;
    const cudaError_t err = cudaHostAlloc(&p, bytes, cudaHostAllocPortable);
    if (err != cudaSuccess) {
      return ResourceExhausted("cudaHostAlloc of " + std::to_string(bytes) +
                               " pinned bytes failed: " + cudaGetErrorString(err));
    }
    return p;
  }
  void HostFree(void* ptr) override {
    if (ptr != nullptr) cudaFreeHost(ptr);
  }
  Status MemsetAsync(void* ptr, int value, size_t bytes, Stream stream) override {
    AGENTRT_CUDA_CHECK(cudaMemsetAsync(ptr, value, bytes, S(stream)), kWhere);
    return Status::Ok();
  }
  Status CopyAsync(void* dst, const void* src, size_t bytes, CopyKind kind,
                   Stream stream) override {
    AGENTRT_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, ToCuda(kind), S(stream)), kWhere);
    return Status::Ok();
  }

  Result<IpcMemHandle> IpcGetMemHandle(void* ptr) override {
    cudaIpcMemHandle_t h;
    AGENTRT_CUDA_CHECK(cudaIpcGetMemHandle(&h, ptr), kWhere);
    IpcMemHandle out;
    static_assert(sizeof(h.reserved) == sizeof(out.bytes));
    std::memcpy(out.bytes.data(), h.reserved, sizeof(h.reserved));
    return out;
  }
  Result<void*> IpcOpenMemHandle(const IpcMemHandle& handle) override {
    cudaIpcMemHandle_t h;
    std::memcpy(h.reserved, handle.bytes.data(), sizeof(h.reserved));
    void* p = nullptr;
    AGENTRT_CUDA_CHECK(cudaIpcOpenMemHandle(&p, h, cudaIpcMemLazyEnablePeerAccess), kWhere);
    return p;
  }
  Status IpcCloseMemHandle(void* ptr) override {
    AGENTRT_CUDA_CHECK(cudaIpcCloseMemHandle(ptr), kWhere);
    return Status::Ok();
  }

  Status LaunchAdamW(float* params, const float* grads, float* m, float* v, size_t n,
                     const AdamWScalars& s, Stream stream) override {
    AGENTRT_CUDA_CHECK(cuda::LaunchAdamW(params, grads, m, v, n, s, S(stream)), kWhere);
    return Status::Ok();
  }
  Status LaunchSquaredNorm(const float* x, size_t n, double* out, Stream stream) override {
    AGENTRT_CUDA_CHECK(cuda::LaunchSquaredNorm(x, n, out, S(stream)), kWhere);
    return Status::Ok();
  }

  Result<UniqueId> GetUniqueId() override {
    ncclUniqueId id;
    AGENTRT_NCCL_CHECK(ncclGetUniqueId(&id), kWhere);
    UniqueId out;
    static_assert(sizeof(id.internal) == sizeof(out.bytes));
    std::memcpy(out.bytes.data(), id.internal, sizeof(id.internal));
    return out;
  }
  Result<Comm> CommInitRank(int world_size, const UniqueId& id, int rank) override {
    ncclUniqueId nid;
    std::memcpy(nid.internal, id.bytes.data(), sizeof(nid.internal));
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    ncclComm_t comm = nullptr;
    AGENTRT_NCCL_CHECK(ncclCommInitRankConfig(&comm, world_size, nid, rank, &config), kWhere);
    return static_cast<Comm>(comm);
  }
  Result<Progress> CommProgress(Comm comm) override {
    ncclResult_t state = ncclSuccess;
    AGENTRT_NCCL_CHECK(ncclCommGetAsyncError(C(comm), &state), kWhere);
    if (state == ncclInProgress) return Progress::kPending;
    if (state != ncclSuccess) return Internal(std::string("NCCL: ") + ncclGetErrorString(state));
    return Progress::kDone;
  }
  Status CommFinalize(Comm comm) override {
    AGENTRT_NCCL_CHECK(ncclCommFinalize(C(comm)), kWhere);
    return Status::Ok();
  }
  void CommDestroy(Comm comm) override { ncclCommDestroy(C(comm)); }
  void CommAbort(Comm comm) override { ncclCommAbort(C(comm)); }

  Result<Progress> AllReduce(const void* send, void* recv, size_t count, DataType type, ReduceOp op,
                             Comm comm, Stream stream) override {
    return Enqueued(ncclAllReduce(send, recv, count, ToNccl(type), ToNccl(op), C(comm), S(stream)),
                    "ncclAllReduce");
  }
  Result<Progress> ReduceScatter(const void* send, void* recv, size_t recv_count, DataType type,
                                 ReduceOp op, Comm comm, Stream stream) override {
    return Enqueued(
        ncclReduceScatter(send, recv, recv_count, ToNccl(type), ToNccl(op), C(comm), S(stream)),
        "ncclReduceScatter");
  }
  Result<Progress> AllGather(const void* send, void* recv, size_t send_count, DataType type,
                             Comm comm, Stream stream) override {
    return Enqueued(ncclAllGather(send, recv, send_count, ToNccl(type), C(comm), S(stream)),
                    "ncclAllGather");
  }
  Result<Progress> Broadcast(void* buf, size_t count, DataType type, int root, Comm comm,
                             Stream stream) override {
    return Enqueued(ncclBroadcast(buf, buf, count, ToNccl(type), root, C(comm), S(stream)),
                    "ncclBroadcast");
  }
};

}  // namespace
}  // namespace agentrt::device

extern "C" __attribute__((visibility("default"))) agentrt::device::Api* agentrt_device_api_v3() {
  static agentrt::device::CudaApi api;
  return &api;
}
