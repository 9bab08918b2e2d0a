#include "agent_runtime/cuda/nccl_group.h"

#include <atomic>
#include <chrono>
#include <cstring>
#include <string>
#include <thread>

#include "agent_runtime/cuda/cuda_check.h"
#include "agent_runtime/group_internal.h"
#include "agent_runtime/tcp_store.h"

namespace agentrt {
namespace {

using Clock = std::chrono::steady_clock;

ncclDataType_t ToNccl(DataType type) {
  switch (type) {
    case DataType::kFloat32:
      return ncclFloat32;
    case DataType::kBFloat16:
      return ncclBfloat16;
    case DataType::kFloat16:
      return ncclFloat16;
    case DataType::kInt64:
      return ncclInt64;
  }
  return ncclFloat32;
}

ncclRedOp_t ToNccl(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return ncclSum;
    case ReduceOp::kAvg:
      return ncclAvg;
    case ReduceOp::kMax:
      return ncclMax;
  }
  return ncclSum;
}

std::string FormatTimeout(Timeout t) {
  if (t.count() % 1000 == 0) return std::to_string(t.count() / 1000) + " s";
  return std::to_string(t.count()) + " ms";
}

// Polls a non-blocking communicator until it leaves ncclInProgress or the deadline passes.
ncclResult_t WaitComm(ncclComm_t comm, Clock::time_point deadline, bool* timed_out) {
  *timed_out = false;
  for (;;) {
    ncclResult_t state = ncclSuccess;
    const ncclResult_t r = ncclCommGetAsyncError(comm, &state);
    if (r != ncclSuccess) return r;
    if (state != ncclInProgress) return state;
    if (Clock::now() >= deadline) {
      *timed_out = true;
      return ncclInProgress;
    }
    std::this_thread::yield();
  }
}

class NcclGroup final : public Group {
 public:
  NcclGroup(std::string agent, int rank, int size, int device)
      : agent_(std::move(agent)),
        rank_(rank),
        size_(size),
        device_(device),
        where_(internal::GroupWhere(agent_, rank_, "nccl")) {}

  ~NcclGroup() override {
    cudaSetDevice(device_);
    // An aborted communicator (broken_) is already gone: comm_ is null then.
    if (comm_ != nullptr) {
      bool timed_out = false;
      ncclResult_t r = ncclCommFinalize(comm_);
      if (r == ncclSuccess || r == ncclInProgress) {
        r = WaitComm(comm_, Clock::now() + std::chrono::seconds(30), &timed_out);
      }
      if (timed_out || r != ncclSuccess) {
        ncclCommAbort(comm_);
      } else {
        ncclCommDestroy(comm_);
      }
    }
    if (scratch_ != nullptr) cudaFree(scratch_);
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }

  Status Init(const GroupOptions& o, const ncclUniqueId& id) {
    AGENTRT_CUDA_CHECK(cudaSetDevice(device_), where_);
    AGENTRT_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), where_);
    AGENTRT_CUDA_CHECK(cudaMalloc(&scratch_, sizeof(float)), where_);
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;  // lets the calling thread watch the deadline and abort
    AGENTRT_NCCL_CHECK(ncclCommInitRankConfig(&comm_, size_, id, rank_, &config), where_);
    bool timed_out = false;
    const ncclResult_t r = WaitComm(comm_, Clock::now() + o.init_timeout, &timed_out);
    if (timed_out) {
      ncclCommAbort(comm_);
      comm_ = nullptr;
      return DeadlineExceeded(where_ + ": ncclCommInitRank did not complete within " +
                              FormatTimeout(o.init_timeout) +
                              "; did every rank of the agent start?");
    }
    if (r != ncclSuccess) {
      ncclCommAbort(comm_);
      comm_ = nullptr;
      return Internal(where_ + ": ncclCommInitRank failed: " + ncclGetErrorString(r));
    }
    return Status::Ok();
  }

  void set_store(std::unique_ptr<TcpStore> store) { store_ = std::move(store); }
  cudaStream_t stream() const { return stream_; }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string_view backend() const override { return "nccl"; }
  bool device_buffers() const override { return true; }

  Status AllReduce(void* buf, size_t count, DataType type, ReduceOp op, Timeout timeout) override {
    AGENTRT_RETURN_IF_ERROR(
        Begin("allreduce", internal::CheckBuffer(buf, count, "buffer", "allreduce")));
    return Run("allreduce", count, type, timeout, [&] {
      return ncclAllReduce(buf, buf, count, ToNccl(type), ToNccl(op), comm_, stream_);
    });
  }

  Status ReduceScatter(const void* send, void* recv, size_t recv_count, DataType type, ReduceOp op,
                       Timeout timeout) override {
    AGENTRT_RETURN_IF_ERROR(
        Begin("reducescatter", internal::CheckBuffer(send, recv_count, "send", "reducescatter")));
    AGENTRT_RETURN_IF_ERROR(
        Begin("reducescatter", internal::CheckBuffer(recv, recv_count, "recv", "reducescatter")));
    return Run("reducescatter", recv_count, type, timeout, [&] {
      return ncclReduceScatter(send, recv, recv_count, ToNccl(type), ToNccl(op), comm_, stream_);
    });
  }

  Status AllGather(const void* send, void* recv, size_t send_count, DataType type,
                   Timeout timeout) override {
    AGENTRT_RETURN_IF_ERROR(
        Begin("allgather", internal::CheckBuffer(send, send_count, "send", "allgather")));
    AGENTRT_RETURN_IF_ERROR(
        Begin("allgather", internal::CheckBuffer(recv, send_count, "recv", "allgather")));
    return Run("allgather", send_count, type, timeout,
               [&] { return ncclAllGather(send, recv, send_count, ToNccl(type), comm_, stream_); });
  }

  Status Broadcast(void* buf, size_t count, DataType type, int root, Timeout timeout) override {
    AGENTRT_RETURN_IF_ERROR(
        Begin("broadcast", internal::CheckBuffer(buf, count, "buffer", "broadcast")));
    AGENTRT_RETURN_IF_ERROR(Begin("broadcast", internal::CheckRoot(root, size_, "broadcast")));
    return Run("broadcast", count, type, timeout,
               [&] { return ncclBroadcast(buf, buf, count, ToNccl(type), root, comm_, stream_); });
  }

  Status Barrier(Timeout timeout) override {
    AGENTRT_RETURN_IF_ERROR(Begin("barrier", Status::Ok()));
    return Run("barrier", 1, DataType::kFloat32, timeout, [&] {
      return ncclAllReduce(scratch_, scratch_, 1, ncclFloat32, ncclSum, comm_, stream_);
    });
  }

 private:
  Status Begin(std::string_view op, const Status& arg_status) const {
    if (broken_) {
      return Aborted(where_ + ": " + std::string(op) +
                     " refused: an earlier collective failed or timed out and the communicator "
                     "was aborted; exit so the supervisor restarts the agent");
    }
    return arg_status.ok() ? arg_status : arg_status.WithContext(where_);
  }

  // Enqueues the collective and watches it: the stream must drain and the
  // communicator stay healthy before the deadline, else the communicator is
  // aborted (ncclCommAbort also releases the kernels waiting on peers).
  template <typename Enqueue>
  Status Run(std::string_view op, size_t count, DataType type, Timeout timeout, Enqueue enqueue) {
    const auto deadline = Clock::now() + timeout;
    auto fail = [&](Status s) {
      ncclCommAbort(comm_);
      comm_ = nullptr;
      broken_ = true;
      return s;
    };
    // Built only on failure: the success path allocates nothing.
    auto what = [&] {
      return std::string(op) + " of " + std::to_string(count) + " " +
             std::string(DataTypeName(type));
    };
    ncclResult_t r = enqueue();
    if (r == ncclInProgress) {
      bool timed_out = false;
      r = WaitComm(comm_, deadline, &timed_out);
      if (timed_out) {
        return fail(DeadlineExceeded(where_ + ": " + what() + " could not be enqueued within " +
                                     FormatTimeout(timeout) + "; communicator aborted"));
      }
    }
    if (r != ncclSuccess) {
      return fail(Internal(where_ + ": " + what() + " failed: " + ncclGetErrorString(r) +
                           "; communicator aborted"));
    }
    for (uint32_t polls = 0;; ++polls) {
      const cudaError_t q = cudaStreamQuery(stream_);
      if (q == cudaSuccess) return Status::Ok();
      if (q != cudaErrorNotReady) {
        return fail(Internal(where_ + ": " + what() + ": CUDA error " + cudaGetErrorName(q) + " (" +
                             cudaGetErrorString(q) + "); communicator aborted"));
      }
      if ((polls & 255u) == 0) {
        ncclResult_t state = ncclSuccess;
        ncclCommGetAsyncError(comm_, &state);
        if (state != ncclSuccess && state != ncclInProgress) {
          return fail(Internal(where_ + ": " + what() + ": NCCL async error: " +
                               ncclGetErrorString(state) + "; communicator aborted"));
        }
        if (Clock::now() >= deadline) {
          return fail(DeadlineExceeded(where_ + ": " + what() + " timed out after " +
                                       FormatTimeout(timeout) + " (of " + std::to_string(size_) +
                                       " ranks); communicator aborted"));
        }
      }
    }
  }

  std::string agent_;
  int rank_;
  int size_;
  int device_;
  std::string where_;
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  float* scratch_ = nullptr;
  bool broken_ = false;
  std::unique_ptr<TcpStore> store_;  // rank 0 serves the rendezvous while the group lives
};

std::atomic<int> g_group_generation{0};

}  // namespace

namespace cuda {
cudaStream_t NcclGroupStream(Group& group) {
  auto* nccl = dynamic_cast<NcclGroup*>(&group);
  return nccl != nullptr ? nccl->stream() : nullptr;
}
}  // namespace cuda

namespace internal {

Result<std::unique_ptr<Group>> MakeNcclGroup(const GroupOptions& o) {
  const std::string where = GroupWhere(o.agent, o.rank, "nccl");
  if (o.world_size < 1 || o.rank < 0 || o.rank >= o.world_size) {
    return InvalidArgument(where + ": rank " + std::to_string(o.rank) + " is not in a world of " +
                           std::to_string(o.world_size));
  }
  int devices = 0;
  const cudaError_t derr = cudaGetDeviceCount(&devices);
  if (derr != cudaSuccess || devices == 0) {
    return FailedPrecondition(where + ": no CUDA device is visible (" +
                              std::string(cudaGetErrorString(derr)) +
                              "); check CUDA_VISIBLE_DEVICES or choose the mpi backend");
  }
  const int local = o.local_rank >= 0 ? o.local_rank : o.rank;
  const int device = local % devices;

  ncclUniqueId id;
  std::unique_ptr<TcpStore> store;
  if (o.world_size == 1) {
    AGENTRT_NCCL_CHECK(ncclGetUniqueId(&id), where);
  } else {
    if (o.master_addr.empty() || o.master_port <= 0) {
      return InvalidArgument(
          where + ": MASTER_ADDR/MASTER_PORT are not set; the NCCL rendezvous needs them");
    }
    TcpStoreOptions so;
    so.host = o.master_addr;
    so.port = o.master_port;
    so.is_server = o.rank == 0;
    so.rank = o.rank;
    so.world_size = o.world_size;
    so.agent = o.agent;
    so.connect_timeout = o.init_timeout;
    AGENTRT_ASSIGN_OR_RETURN(store, TcpStore::Create(so));
    const std::string key = "agentrt/nccl/unique_id/" + std::to_string(g_group_generation++);
    if (o.rank == 0) {
      AGENTRT_NCCL_CHECK(ncclGetUniqueId(&id), where);
      AGENTRT_RETURN_IF_ERROR(
          store->Set(key, std::string_view(id.internal, sizeof(id.internal)), o.init_timeout));
    } else {
      AGENTRT_ASSIGN_OR_RETURN(std::string bytes, store->Get(key, o.init_timeout));
      if (bytes.size() != sizeof(id.internal)) {
        return Internal(where + ": the rendezvous store returned a " +
                        std::to_string(bytes.size()) + "-byte ncclUniqueId; expected " +
                        std::to_string(sizeof(id.internal)));
      }
      std::memcpy(id.internal, bytes.data(), sizeof(id.internal));
    }
  }
  auto group = std::make_unique<NcclGroup>(o.agent, o.rank, o.world_size, device);
  AGENTRT_RETURN_IF_ERROR(group->Init(o, id));
  group->set_store(std::move(store));
  return std::unique_ptr<Group>(std::move(group));
}

}  // namespace internal
}  // namespace agentrt
