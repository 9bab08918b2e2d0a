#include "agent_runtime/nccl_group.h"

#include <algorithm>
#include <string>
#include <thread>

#include "agent_runtime/group_internal.h"
#include "agent_runtime/tcp_store.h"

namespace agentrt::internal {
namespace {

using Clock = std::chrono::steady_clock;
using device::Progress;

Timeout Remaining(Clock::time_point deadline) {
  return std::max(Timeout(0), std::chrono::duration_cast<Timeout>(deadline - Clock::now()));
}

// ncclCommAbort can wait until the communicator's kernels leave the device,
// which may sit behind the caller's own work: it runs on a thread of its own
// so that the caller gets its answer at once. The communicator is never
// touched again by the group.
void AbortDetached(device::Api* api, device::Comm comm) {
  if (comm == nullptr) return;
  std::thread([api, comm] { api->CommAbort(comm); }).detach();
}

class NcclGroup final : public Group {
 public:
  NcclGroup(const GroupOptions& o, device::Api* api, int device, PollBackoff backoff)
      : agent_(o.agent),
        rank_(o.rank),
        size_(o.world_size),
        device_(device),
        api_(api),
        backoff_(backoff),
        where_(GroupWhere(agent_, rank_, "nccl")) {}

  ~NcclGroup() override {
    device::DeviceGuard guard(api_, device_);
    if (comm_ != nullptr) {
      Status finalized = api_->CommFinalize(comm_);
      if (finalized.ok()) {
        finalized = WaitComm(Clock::now() + std::chrono::seconds(30), "finalize");
      }
      if (finalized.ok()) {
        api_->CommDestroy(comm_);
      } else {
        AbortDetached(api_, comm_);
      }
    }
    // cudaFree waits for the whole device, which hangs behind a collective
    // that never finished: an aborted group leaves its 4-byte scratch behind.
    if (!broken_) api_->Free(scratch_);
    api_->DestroyEvent(ready_);
    api_->DestroyStream(stream_);
  }

  Status Init(Clock::time_point deadline, const device::UniqueId& id, Timeout init_timeout) {
    device::DeviceGuard guard(api_, device_);
    AGENTRT_RETURN_IF_ERROR(guard.status().WithContext(where_));
    AGENTRT_ASSIGN_OR_RETURN(stream_, Context(api_->CreateStream()));
    AGENTRT_ASSIGN_OR_RETURN(ready_, Context(api_->CreateEvent()));
    AGENTRT_ASSIGN_OR_RETURN(void* scratch, Context(api_->Malloc(sizeof(float))));
    scratch_ = scratch;
    AGENTRT_RETURN_IF_ERROR(api_->MemsetAsync(scratch_, 0, sizeof(float), stream_));
    AGENTRT_ASSIGN_OR_RETURN(comm_, Context(api_->CommInitRank(size_, id, rank_)));
    const Status ready = WaitComm(deadline, "ncclCommInitRank");
    if (ready.code() == StatusCode::kDeadlineExceeded) {
      return Abort(DeadlineExceeded(where_ + ": ncclCommInitRank did not complete within " +
                                    FormatTimeout(init_timeout) +
                                    " (rendezvous and init together); did every rank of the "
                                    "agent start?"));
    }
    if (!ready.ok()) return Abort(ready);
    return Status::Ok();
  }

  void set_store(std::unique_ptr<TcpStore> store) { store_ = std::move(store); }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string_view backend() const override { return "nccl"; }
  bool device_buffers() const override { return true; }
  void* native_stream() const override { return stream_; }
  void set_caller_stream(void* stream) override { caller_stream_ = stream; }
  DeviceBinding device_binding() const override { return {api_, device_}; }

  Status AllReduce(void* buf, size_t count, DataType type, ReduceOp op, Timeout timeout) override {
    AGENTRT_RETURN_IF_ERROR(Begin("allreduce", CheckBuffer(buf, count, "buffer", "allreduce")));
    return Run("allreduce", count, type, timeout,
               [&] { return api_->AllReduce(buf, buf, count, type, op, comm_, stream_); });
  }

  Status ReduceScatter(const void* send, void* recv, size_t recv_count, DataType type, ReduceOp op,
                       Timeout timeout) override {
    AGENTRT_RETURN_IF_ERROR(
        Begin("reducescatter", CheckBuffer(send, recv_count, "send", "reducescatter")));
    AGENTRT_RETURN_IF_ERROR(
        Begin("reducescatter", CheckBuffer(recv, recv_count, "recv", "reducescatter")));
    return Run("reducescatter", recv_count, type, timeout, [&] {
      return api_->ReduceScatter(send, recv, recv_count, type, op, comm_, stream_);
    });
  }

  Status AllGather(const void* send, void* recv, size_t send_count, DataType type,
                   Timeout timeout) override {
    AGENTRT_RETURN_IF_ERROR(Begin("allgather", CheckBuffer(send, send_count, "send", "allgather")));
    AGENTRT_RETURN_IF_ERROR(Begin("allgather", CheckBuffer(recv, send_count, "recv", "allgather")));
    return Run("allgather", send_count, type, timeout,
               [&] { return api_->AllGather(send, recv, send_count, type, comm_, stream_); });
  }

  Status Broadcast(void* buf, size_t count, DataType type, int root, Timeout timeout) override {
    AGENTRT_RETURN_IF_ERROR(Begin("broadcast", CheckBuffer(buf, count, "buffer", "broadcast")));
    AGENTRT_RETURN_IF_ERROR(Begin("broadcast", CheckRoot(root, size_, "broadcast")));
    return Run("broadcast", count, type, timeout,
               [&] { return api_->Broadcast(buf, count, type, root, comm_, stream_); });
  }

  Status Barrier(Timeout timeout) override {
    AGENTRT_RETURN_IF_ERROR(Begin("barrier", Status::Ok()));
    return Run("barrier", 1, DataType::kFloat32, timeout, [&] {
      return api_->AllReduce(scratch_, scratch_, 1, DataType::kFloat32, ReduceOp::kSum, comm_,
                             stream_);
    });
  }

 private:
  template <typename T>
  Result<T> Context(Result<T> r) const {
    if (!r.ok()) return r.status().WithContext(where_);
    return r;
  }

  Status Begin(std::string_view op, const Status& arg_status) const {
    return internal::BeginCall(
        broken_, where_, op, arg_status,
        "an earlier collective failed or timed out and the communicator was aborted");
  }

  Status Abort(Status why) {
    AbortDetached(api_, comm_);
    comm_ = nullptr;
    broken_ = true;
    return why;
  }

  void Pause(uint32_t poll) const {
    const auto sleep = backoff_.SleepAfter(poll);
    if (sleep.count() > 0) {
      std::this_thread::sleep_for(sleep);
    } else {
      std::this_thread::yield();
    }
  }

  // Polls the communicator until it leaves ncclInProgress: Ok, its error, or
  // DeadlineExceeded.
  Status WaitComm(Clock::time_point deadline, std::string_view what) const {
    for (uint32_t poll = 0;; ++poll) {
      Result<Progress> p = api_->CommProgress(comm_);
      if (!p.ok()) return Internal(where_ + ": " + std::string(what) + ": " + p.status().message());
      if (*p == Progress::kDone) return Status::Ok();
      if (Clock::now() >= deadline) return DeadlineExceeded(where_ + ": " + std::string(what));
      Pause(poll);
    }
  }

  // Orders the collective after the caller's work, enqueues it and waits for
  // the group's stream to drain, within `timeout`.
  template <typename Enqueue>
  Status Run(std::string_view op, size_t count, DataType type, Timeout timeout, Enqueue enqueue) {
    const auto deadline = Clock::now() + timeout;
    // Built only on failure: the success path allocates nothing.
    auto what = [&] {
      return std::string(op) + " of " + std::to_string(count) + " " +
             std::string(DataTypeName(type));
    };
    device::DeviceGuard guard(api_, device_);
    if (!guard.status().ok()) return guard.status().WithContext(where_ + ": " + what());
    if (Status s = api_->RecordEvent(ready_, caller_stream_); !s.ok()) {
      return s.WithContext(where_ + ": " + what() + ": ordering after the caller's stream");
    }
    if (Status s = api_->StreamWaitEvent(stream_, ready_); !s.ok()) {
      return s.WithContext(where_ + ": " + what() + ": ordering after the caller's stream");
    }
    Result<Progress> enqueued = enqueue();
    if (!enqueued.ok()) {
      return Abort(Internal(where_ + ": " + what() + " failed: " + enqueued.status().message() +
                            "; communicator aborted"));
    }
    if (*enqueued == Progress::kPending) {
      const Status s = WaitComm(deadline, "enqueue");
      if (s.code() == StatusCode::kDeadlineExceeded) {
        return Abort(DeadlineExceeded(where_ + ": " + what() + " could not be enqueued within " +
                                      FormatTimeout(timeout) + "; communicator aborted"));
      }
      if (!s.ok()) return Abort(Internal(s.message() + "; communicator aborted"));
    }
    for (uint32_t poll = 0;; ++poll) {
      Result<Progress> q = api_->QueryStream(stream_);
      if (!q.ok()) {
        return Abort(Internal(where_ + ": " + what() + ": " + q.status().message() +
                              "; communicator aborted"));
      }
      if (*q == Progress::kDone) return Status::Ok();
      // A peer's failure shows on the communicator, not the stream.
      if (poll >= backoff_.spin_polls || (poll & 15u) == 0) {
        Result<Progress> c = api_->CommProgress(comm_);
        if (!c.ok()) {
          return Abort(Internal(where_ + ": " + what() + ": NCCL async error: " +
                                c.status().message() + "; communicator aborted"));
        }
        if (Clock::now() >= deadline) {
          return Abort(DeadlineExceeded(where_ + ": " + what() + " timed out after " +
                                        FormatTimeout(timeout) + " (of " + std::to_string(size_) +
                                        " ranks); communicator aborted"));
        }
      }
      Pause(poll);
    }
  }

  std::string agent_;
  int rank_;
  int size_;
  int device_;
  device::Api* api_;
  PollBackoff backoff_;
  std::string where_;
  device::Comm comm_ = nullptr;
  device::Stream stream_ = nullptr;
  device::Stream caller_stream_ = nullptr;  // the legacy default stream
  device::Event ready_ = nullptr;
  void* scratch_ = nullptr;
  bool broken_ = false;
  std::unique_ptr<TcpStore> store_;  // rank 0 serves the rendezvous while the group lives
};

}  // namespace

std::chrono::microseconds PollBackoff::SleepAfter(uint32_t poll) const {
  if (poll < spin_polls) return std::chrono::microseconds(0);
  const uint32_t doublings = std::min<uint32_t>(poll - spin_polls, 20);
  return std::min(max_sleep, first_sleep * (int64_t{1} << doublings));
}

std::string RendezvousKey(const GroupOptions& o) {
  return "agentrt/nccl/" + o.agent + "/" + std::to_string(o.world_size) + "/" +
         std::to_string(o.restart_count);
}

Result<std::unique_ptr<Group>> MakeNcclGroup(const GroupOptions& o, device::Api* api,
                                             PollBackoff backoff) {
  const auto deadline = Clock::now() + o.init_timeout;
  const std::string where = GroupWhere(o.agent, o.rank, "nccl");
  if (o.world_size < 1 || o.rank < 0 || o.rank >= o.world_size) {
    return InvalidArgument(where + ": rank " + std::to_string(o.rank) + " is not in a world of " +
                           std::to_string(o.world_size));
  }
  Result<int> devices = api->DeviceCount();
  if (!devices.ok()) return devices.status().WithContext(where + ": counting CUDA devices");
  if (*devices == 0) {
    return FailedPrecondition(where +
                              ": no CUDA device is visible; check CUDA_VISIBLE_DEVICES, or give "
                              "the agent backend: mpi to train on the host");
  }
  const int local = o.local_rank >= 0 ? o.local_rank : o.rank;
  if (local >= *devices) {
    return FailedPrecondition(
        where + ": local rank " + std::to_string(local) + " needs a GPU of its own but this rank " +
        "sees " + std::to_string(*devices) +
        " GPU(s); NCCL refuses two ranks on one GPU (\"Duplicate GPU detected\"): give the agent "
        "as many GPUs as ranks on each node");
  }

  device::UniqueId id;
  std::unique_ptr<TcpStore> store;
  if (o.world_size == 1) {
    AGENTRT_ASSIGN_OR_RETURN(id, api->GetUniqueId());
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
    so.connect_timeout = Remaining(deadline);
    AGENTRT_ASSIGN_OR_RETURN(store, TcpStore::Create(so));
    const std::string key = RendezvousKey(o);
    if (o.rank == 0) {
      Result<device::UniqueId> made = api->GetUniqueId();
      if (!made.ok()) return made.status().WithContext(where);
      id = *made;
      AGENTRT_RETURN_IF_ERROR(
          store->Set(key, std::string_view(id.bytes.data(), id.bytes.size()), Remaining(deadline)));
    } else {
      AGENTRT_ASSIGN_OR_RETURN(std::string bytes, store->Get(key, Remaining(deadline)));
      if (bytes.size() != id.bytes.size()) {
        return Internal(where + ": the rendezvous store returned a " +
                        std::to_string(bytes.size()) + "-byte ncclUniqueId; expected " +
                        std::to_string(id.bytes.size()));
      }
      std::copy(bytes.begin(), bytes.end(), id.bytes.begin());
    }
  }
  auto group = std::make_unique<NcclGroup>(o, api, local, backoff);
  AGENTRT_RETURN_IF_ERROR(group->Init(deadline, id, o.init_timeout));
  group->set_store(std::move(store));
  return std::unique_ptr<Group>(std::move(group));
}

}  // namespace agentrt::internal
