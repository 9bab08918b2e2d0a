#include "agent_runtime/mpi_group.h"

#include <mpi.h>

#include <atomic>
#include <chrono>
#include <climits>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "agent_runtime/group_half.h"
#include "agent_runtime/group_internal.h"
#include "common/enum_names.h"

namespace agentrt {
namespace {

// Set once any collective has timed out: MPI_Finalize would wait for it forever.
std::atomic<bool> g_mpi_poisoned{false};

MPI_Op g_bf16_sum = MPI_OP_NULL;
MPI_Op g_bf16_max = MPI_OP_NULL;
MPI_Op g_f16_sum = MPI_OP_NULL;
MPI_Op g_f16_max = MPI_OP_NULL;

template <float (*ToF)(uint16_t), uint16_t (*FromF)(float), bool kMax>
void HalfReduce(void* in, void* inout, int* len, MPI_Datatype*) {
  const auto* a = static_cast<const uint16_t*>(in);
  auto* b = static_cast<uint16_t*>(inout);
  for (int i = 0; i < *len; ++i) {
    const float x = ToF(a[i]);
    const float y = ToF(b[i]);
    b[i] = FromF(kMax ? (x > y ? x : y) : x + y);
  }
}

std::string MpiErrorString(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(code, text, &len) != MPI_SUCCESS) return "MPI error " + std::to_string(code);
  return std::string(text, static_cast<size_t>(len));
}

// Translates an MPI return code into a Status that keeps the call site.
#define AGENTRT_MPI_CHECK(call, where)                                           \
  do {                                                                           \
    const int _agentrt_mpi_rc = (call);                                          \
    if (_agentrt_mpi_rc != MPI_SUCCESS) {                                        \
      return Internal(std::string(where) +                                       \
                      ": " #call " failed: " + MpiErrorString(_agentrt_mpi_rc)); \
    }                                                                            \
  } while (false)

void FinalizeMpiAtExit() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized || g_mpi_poisoned.load()) return;
  for (MPI_Op* op : {&g_bf16_sum, &g_bf16_max, &g_f16_sum, &g_f16_max}) {
    if (*op != MPI_OP_NULL) MPI_Op_free(op);
  }
  MPI_Finalize();
}

Status InitMpiOnce() {
  static std::once_flag once;
  static Status status;
  std::call_once(once, [] {
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (!initialized) {
      // Open MPI's non-blocking allreduce (libnbc) picks a binomial reduce +
      // broadcast for every in-place call and for any world under 4 ranks:
      // about half the bandwidth of the blocking MPI_Allreduce at large sizes.
      // Reduce-scatter + all-gather (Rabenseifner) is what the blocking path
      // uses there. A value the user set in the environment wins.
      ::setenv("OMPI_MCA_coll_libnbc_iallreduce_algorithm", "3", /*overwrite=*/0);
      int provided = 0;
      const int rc = MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided);
      if (rc != MPI_SUCCESS) {
        status = Unavailable("MPI_Init_thread failed: " + MpiErrorString(rc) +
                             "; start the agent's ranks with mpirun or srun --mpi=pmix");
        return;
      }
      std::atexit(FinalizeMpiAtExit);
    }
    MPI_Op_create(&HalfReduce<internal::BF16ToFloat, internal::FloatToBF16, false>, 1, &g_bf16_sum);
    MPI_Op_create(&HalfReduce<internal::BF16ToFloat, internal::FloatToBF16, true>, 1, &g_bf16_max);
    MPI_Op_create(&HalfReduce<internal::F16ToFloat, internal::FloatToF16, false>, 1, &g_f16_sum);
    MPI_Op_create(&HalfReduce<internal::F16ToFloat, internal::FloatToF16, true>, 1, &g_f16_max);
  });
  return status;
}

MPI_Datatype ToMpi(DataType type) {
  // bfloat16 and float16 travel as 16-bit words, reduced by the user ops above.
  const EnumPair<DataType, MPI_Datatype> types[] = {{DataType::kFloat32, MPI_FLOAT},
                                                    {DataType::kInt64, MPI_INT64_T},
                                                    {DataType::kBFloat16, MPI_UINT16_T},
                                                    {DataType::kFloat16, MPI_UINT16_T}};
  return MappedIn(types, type, MPI_DATATYPE_NULL);
}

MPI_Op ToMpi(ReduceOp op, DataType type) {
  const bool max = op == ReduceOp::kMax;  // avg is a sum followed by a local division
  switch (type) {
    case DataType::kBFloat16:
      return max ? g_bf16_max : g_bf16_sum;
    case DataType::kFloat16:
      return max ? g_f16_max : g_f16_sum;
    default:
      return max ? MPI_MAX : MPI_SUM;
  }
}

// Divides count elements by n (the avg of ReduceOp::kAvg after a sum).
void DivideInPlace(void* buf, size_t count, DataType type, int n) {
  switch (type) {
    case DataType::kFloat32: {
      auto* p = static_cast<float*>(buf);
      const float d = static_cast<float>(n);
      for (size_t i = 0; i < count; ++i) p[i] /= d;
      break;
    }
    case DataType::kInt64: {
      auto* p = static_cast<int64_t*>(buf);
      for (size_t i = 0; i < count; ++i) p[i] /= n;
      break;
    }
    case DataType::kBFloat16: {
      auto* p = static_cast<uint16_t*>(buf);
      for (size_t i = 0; i < count; ++i) {
        p[i] = internal::FloatToBF16(internal::BF16ToFloat(p[i]) / static_cast<float>(n));
      }
      break;
    }
    case DataType::kFloat16: {
      auto* p = static_cast<uint16_t*>(buf);
      for (size_t i = 0; i < count; ++i) {
        p[i] = internal::FloatToF16(internal::F16ToFloat(p[i]) / static_cast<float>(n));
      }
      break;
    }
  }
}

// Tag of ReduceScatter's point-to-point messages (on the group's own communicator).
constexpr int kReduceScatterTag = 0x5253;
constexpr int kAllReduceTag = 0x4152;
// Up to this size an allreduce on 2^k ranks takes the recursive-doubling path:
// below the shared-memory transport's eager limit (4 KiB), where one exchange
// per round is all it costs. Above it, Open MPI's own schedule measured better.
constexpr size_t kSmallAllReduceBytes = size_t{2} << 10;

class MpiGroup final : public Group {
 public:
  MpiGroup(std::string agent, MPI_Comm comm, int rank, int size)
      : agent_(std::move(agent)),
        comm_(comm),
        rank_(rank),
        size_(size),
        where_(internal::GroupWhere(agent_, rank_, "mpi")) {}

  ~MpiGroup() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    // A communicator with a collective still pending cannot be freed, nor the
    // scratch a pending receive may still write to: both are left to exit.
    if (!finalized && !broken_) MPI_Comm_free(&comm_);
    // NOLINTNEXTLINE(bugprone-unhandled-exception-at-new): deliberately leaked, see above
    if (broken_) new std::vector<char>(std::move(scratch_));
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string_view backend() const override { return "mpi"; }
  bool device_buffers() const override { return false; }

  Status AllReduce(void* buf, size_t count, DataType type, ReduceOp op, Timeout timeout) override {
    constexpr std::string_view kOp = "allreduce";
    AGENTRT_RETURN_IF_ERROR(Begin(kOp, internal::CheckBuffer(buf, count, "buffer", kOp)));
    const auto deadline = Clock::now() + timeout;
    const size_t elem = DataTypeSize(type);
    const bool power_of_two = (size_ & (size_ - 1)) == 0;
    if (size_ > 1 && power_of_two && count * elem <= kSmallAllReduceBytes) {
      AGENTRT_RETURN_IF_ERROR(SmallAllReduce(buf, count, type, op, deadline, timeout));
    } else {
      for (size_t done = 0; done < count;) {
        const int n = Chunk(count - done);
        void* p = static_cast<char*>(buf) + done * elem;
        MPI_Request req;
        AGENTRT_MPI_CHECK(
            MPI_Iallreduce(MPI_IN_PLACE, p, n, ToMpi(type), ToMpi(op, type), comm_, &req), where_);
        AGENTRT_RETURN_IF_ERROR(Wait(&req, deadline, timeout, kOp, count, type));
        done += static_cast<size_t>(n);
      }
    }
    if (op == ReduceOp::kAvg) DivideInPlace(buf, count, type, size_);
    return Status::Ok();
  }

  Status ReduceScatter(const void* send, void* recv, size_t recv_count, DataType type, ReduceOp op,
                       Timeout timeout) override {
    constexpr std::string_view kOp = "reducescatter";
    AGENTRT_RETURN_IF_ERROR(BeginBlocks(kOp, send, recv, recv_count));
    const size_t elem = DataTypeSize(type);
    const size_t bytes = recv_count * elem;
    if (size_ == 1 || recv_count == 0) {
      if (send != recv && bytes > 0) std::memmove(recv, send, bytes);
      return Status::Ok();
    }
    // Open MPI's MPI_Ireduce_scatter_block reduces everything to rank 0 and
    // scatters from there; a ring moves (N-1)/N of the data per rank instead.
    // At step k rank r sends its partial sum of block (r-k-1) mod N to the
    // right and receives the left's partial sum of block (r-k-2) mod N, adding
    // its own part; after N-1 steps it holds block r. Partial sums alternate
    // between `recv` and one scratch block (grown once, then reused) so that
    // the last one lands in `recv`.
    if (size_ > 2 && scratch_.size() < bytes) scratch_.resize(bytes);
    const auto deadline = Clock::now() + timeout;
    const int n = static_cast<int>(recv_count);
    const MPI_Datatype dt = ToMpi(type);
    const MPI_Op mop = ToMpi(op, type);
    const int right = (rank_ + 1) % size_;
    const int left = (rank_ + size_ - 1) % size_;
    const char* own = static_cast<const char*>(send);
    auto block_at = [&](int k_back) {  // block (rank - k_back) mod N
      return own + static_cast<size_t>((rank_ - k_back % size_ + size_) % size_) * bytes;
    };
    const void* outgoing = block_at(1);
    for (int k = 0; k < size_ - 1; ++k) {
      void* incoming = (size_ - 2 - k) % 2 == 0 ? recv : static_cast<void*>(scratch_.data());
      MPI_Request reqs[2];
      AGENTRT_MPI_CHECK(MPI_Irecv(incoming, n, dt, left, kReduceScatterTag, comm_, &reqs[0]),
                        where_);
      AGENTRT_MPI_CHECK(MPI_Isend(outgoing, n, dt, right, kReduceScatterTag, comm_, &reqs[1]),
                        where_);
      AGENTRT_RETURN_IF_ERROR(Wait(reqs, 2, deadline, timeout, kOp, recv_count, type,
                                   /*cancel_receive=*/true));
      AGENTRT_MPI_CHECK(MPI_Reduce_local(block_at(k + 2), incoming, n, dt, mop), where_);
      outgoing = incoming;
    }
    if (op == ReduceOp::kAvg) DivideInPlace(recv, recv_count, type, size_);
    return Status::Ok();
  }

  Status AllGather(const void* send, void* recv, size_t send_count, DataType type,
                   Timeout timeout) override {
    constexpr std::string_view kOp = "allgather";
    AGENTRT_RETURN_IF_ERROR(BeginBlocks(kOp, send, recv, send_count));
    const bool in_place = send == static_cast<const char*>(recv) +
                                      static_cast<size_t>(rank_) * send_count * DataTypeSize(type);
    MPI_Request req;
    AGENTRT_MPI_CHECK(
        MPI_Iallgather(in_place ? MPI_IN_PLACE : send, static_cast<int>(send_count), ToMpi(type),
                       recv, static_cast<int>(send_count), ToMpi(type), comm_, &req),
        where_);
    return Wait(&req, Clock::now() + timeout, timeout, kOp, send_count, type);
  }

  Status Broadcast(void* buf, size_t count, DataType type, int root, Timeout timeout) override {
    constexpr std::string_view kOp = "broadcast";
    AGENTRT_RETURN_IF_ERROR(Begin(kOp, internal::CheckBuffer(buf, count, "buffer", kOp)));
    AGENTRT_RETURN_IF_ERROR(Begin(kOp, internal::CheckRoot(root, size_, kOp)));
    const auto deadline = Clock::now() + timeout;
    const size_t elem = DataTypeSize(type);
    for (size_t done = 0; done < count;) {
      const int n = Chunk(count - done);
      MPI_Request req;
      AGENTRT_MPI_CHECK(
          MPI_Ibcast(static_cast<char*>(buf) + done * elem, n, ToMpi(type), root, comm_, &req),
          where_);
      AGENTRT_RETURN_IF_ERROR(Wait(&req, deadline, timeout, kOp, count, type));
      done += static_cast<size_t>(n);
    }
    return Status::Ok();
  }

  Status Barrier(Timeout timeout) override {
    AGENTRT_RETURN_IF_ERROR(Begin("barrier", Status::Ok()));
    MPI_Request req;
    AGENTRT_MPI_CHECK(MPI_Ibarrier(comm_, &req), where_);
    return Wait(&req, Clock::now() + timeout, timeout, "barrier", 0, DataType::kFloat32);
  }

 private:
  using Clock = std::chrono::steady_clock;

  static int Chunk(size_t remaining) {
    return remaining > static_cast<size_t>(INT_MAX) ? INT_MAX : static_cast<int>(remaining);
  }

  Status CheckIntCount(size_t total, std::string_view op) const {
    if (total > static_cast<size_t>(INT_MAX)) {
      return InvalidArgument(std::string(op) + ": " + std::to_string(total) +
                             " elements in all exceed MPI's int count; split the call");
    }
    return Status::Ok();
  }

  // Small messages on 2^k ranks: recursive doubling, log2(N) rounds of one
  // exchange each (libnbc's schedule costs several rounds and an allocation per
  // call). Each rank combines the same two operands per round (the ops are
  // commutative), so every rank ends with bit-identical values.
  Status SmallAllReduce(void* buf, size_t count, DataType type, ReduceOp op,
                        Clock::time_point deadline, Timeout timeout) {
    const size_t bytes = count * DataTypeSize(type);
    if (scratch_.size() < bytes) scratch_.resize(bytes);
    const int n = static_cast<int>(count);
    const MPI_Datatype dt = ToMpi(type);
    const MPI_Op mop = ToMpi(op, type);
    for (int mask = 1; mask < size_; mask <<= 1) {
      const int peer = rank_ ^ mask;
      MPI_Request reqs[2];
      AGENTRT_MPI_CHECK(MPI_Irecv(scratch_.data(), n, dt, peer, kAllReduceTag, comm_, &reqs[0]),
                        where_);
      AGENTRT_MPI_CHECK(MPI_Isend(buf, n, dt, peer, kAllReduceTag, comm_, &reqs[1]), where_);
      AGENTRT_RETURN_IF_ERROR(
          Wait(reqs, 2, deadline, timeout, "allreduce", count, type, /*cancel_receive=*/true));
      AGENTRT_MPI_CHECK(MPI_Reduce_local(scratch_.data(), buf, n, dt, mop), where_);
    }
    return Status::Ok();
  }

  // Begin for a collective over one block per rank: both buffers present, and
  // all ranks' blocks together countable by MPI.
  Status BeginBlocks(std::string_view op, const void* send, const void* recv,
                     size_t block_count) const {
    AGENTRT_RETURN_IF_ERROR(Begin(op, internal::CheckBuffer(send, block_count, "send", op)));
    AGENTRT_RETURN_IF_ERROR(Begin(op, internal::CheckBuffer(recv, block_count, "recv", op)));
    return Begin(op, CheckIntCount(block_count * static_cast<size_t>(size_), op));
  }

  // Every call starts here: a broken group refuses, an argument error gets context.
  Status Begin(std::string_view op, const Status& arg_status) const {
    return internal::BeginCall(broken_, where_, op, arg_status,
                               "an earlier collective timed out and this group is unusable");
  }

  // Polls the request until it completes or the deadline passes. Reading the
  // clock only every 64 polls keeps the wait loop as cheap as MPI's own.
  Status Wait(MPI_Request* req, Clock::time_point deadline, Timeout timeout, std::string_view op,
              size_t count, DataType type) {
    return Wait(req, 1, deadline, timeout, op, count, type);
  }
  // With cancel_receive, reqs[0] is a point-to-point receive that is cancelled
  // on timeout, so a late message cannot land in a buffer the caller reuses.
  Status Wait(MPI_Request* reqs, int num_reqs, Clock::time_point deadline, Timeout timeout,
              std::string_view op, size_t count, DataType type, bool cancel_receive = false) {
    int flag = 0;
    for (uint32_t polls = 0;; ++polls) {
      const int rc = MPI_Testall(num_reqs, reqs, &flag, MPI_STATUSES_IGNORE);
      if (rc != MPI_SUCCESS) {
        return Internal(where_ + ": " + std::string(op) + " failed: " + MpiErrorString(rc));
      }
      if (flag) return Status::Ok();
      if ((polls & 63u) == 0 && Clock::now() >= deadline) break;
    }
    if (cancel_receive && reqs[0] != MPI_REQUEST_NULL) {
      MPI_Cancel(&reqs[0]);
      int done = 0;
      MPI_Test(&reqs[0], &done, MPI_STATUS_IGNORE);
    }
    broken_ = true;
    g_mpi_poisoned = true;
    return DeadlineExceeded(where_ + ": " + std::string(op) + " of " + std::to_string(count) + " " +
                            std::string(DataTypeName(type)) + " timed out after " +
                            internal::FormatTimeout(timeout) + " (of " + std::to_string(size_) +
                            " ranks, one did not join); the group is now unusable");
  }

  std::string agent_;
  MPI_Comm comm_;
  int rank_;
  int size_;
  std::string where_;
  bool broken_ = false;
  // Grown once, then reused: ReduceScatter's second partial-sum block (N > 2)
  // and the peer's data in SmallAllReduce.
  std::vector<char> scratch_;
};

}  // namespace

Result<std::unique_ptr<Group>> MakeMpiGroup(const GroupOptions& options) {
  const std::string where = internal::GroupWhere(options.agent, options.rank, "mpi");
  Status init = InitMpiOnce();
  if (!init.ok()) return init.WithContext(where);
  MPI_Comm comm;
  AGENTRT_MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &comm), where);
  AGENTRT_MPI_CHECK(MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN), where);
  int rank = 0;
  int size = 0;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  if (options.world_size > 1 && (size != options.world_size || rank != options.rank)) {
    MPI_Comm_free(&comm);
    return FailedPrecondition(where + ": MPI says rank " + std::to_string(rank) + " of " +
                              std::to_string(size) + " but RANK/WORLD_SIZE say " +
                              std::to_string(options.rank) + " of " +
                              std::to_string(options.world_size) +
                              "; start exactly WORLD_SIZE ranks (mpirun -np / srun -n)");
  }
  return std::unique_ptr<Group>(std::make_unique<MpiGroup>(options.agent, comm, rank, size));
}

}  // namespace agentrt
