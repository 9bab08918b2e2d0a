// agentrt::Group — an agent's own data-parallel group: the collectives its ranks
// use to train together. One Group never spans two agents: each agent has its
// own communicator and its own rendezvous port (MASTER_ADDR:MASTER_PORT).
//
// Backends (created by MakeGroup from the agent's assignment):
//   nccl   device buffers, GPUs of this agent (agent_runtime/cuda/)
//   mpi    host buffers, one MPI world per agent (mpirun / srun --mpi=pmix)
//   single one rank, no communication library at all
//
// Device buffers (nccl) and streams: a collective reads its inputs only after
// all work the caller enqueued, before the call, on the caller's stream has
// finished. That stream is the legacy default stream unless
// set_caller_stream() names another (PyTorch: the current stream's
// `cuda_stream`): the group records an event on it and makes its own stream
// wait for the event, so the caller need not synchronise first. When a call
// returns OK its results are complete (the group's stream has drained), so
// any later work on any stream may read them. Host groups ignore streams.
//
// Thread-safety: a Group is used by one thread at a time. Every call blocks
// until the collective completes on this rank or `timeout` passes; a timed-out
// collective returns DeadlineExceeded naming the agent, rank and op, and leaves
// the Group unusable (every later call fails with Aborted): the rank should
// exit non-zero so the supervisor restarts the whole agent. All ranks must call
// the same collectives in the same order with the same counts.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "common/group_backend.h"
#include "common/status.h"

namespace agentrt {

namespace device {
class Api;
}  // namespace device

enum class DataType { kFloat32, kBFloat16, kFloat16, kInt64 };
enum class ReduceOp { kSum, kAvg, kMax };

// The collectives of a Group (the flight recorder and bandwidth formulas name them).
enum class CollectiveOp : uint8_t { kAllReduce, kReduceScatter, kAllGather, kBroadcast, kBarrier };

size_t DataTypeSize(DataType type);
std::string_view DataTypeName(DataType type);
std::string_view ReduceOpName(ReduceOp op);
// "all_reduce", "reduce_scatter", "all_gather", "broadcast", "barrier".
std::string_view CollectiveOpName(CollectiveOp op);

using Timeout = std::chrono::milliseconds;
inline constexpr Timeout kDefaultCollectiveTimeout = std::chrono::minutes(10);

class Group {
 public:
  virtual ~Group() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  // "nccl", "mpi" or "single".
  virtual std::string_view backend() const = 0;
  // True when buffers passed to this group live in device (GPU) memory.
  virtual bool device_buffers() const = 0;

  // Device groups: the stream the collectives run on (a cudaStream_t); work
  // enqueued on it runs in order with them. nullptr for host groups.
  virtual void* native_stream() const { return nullptr; }
  // Device groups: the stream whose work produces the buffers passed to the
  // collectives (a cudaStream_t; nullptr: the legacy default stream).
  virtual void set_caller_stream(void* /*stream*/) {}
  // Device groups: the CUDA/NCCL calls and the device (an index among the
  // GPUs this process sees) the group's buffers live on; host groups: null.
  struct DeviceBinding {
    device::Api* api = nullptr;
    int device = -1;
  };
  virtual DeviceBinding device_binding() const { return {}; }

  // In place: every rank ends with op over all ranks' `buf[0..count)`.
  virtual Status AllReduce(void* buf, size_t count, DataType type, ReduceOp op,
                           Timeout timeout = kDefaultCollectiveTimeout) = 0;
  // `send` holds size()*recv_count elements; rank r receives op over all ranks'
  // block r (elements [r*recv_count, (r+1)*recv_count)) into `recv`. `send`
  // and `recv` must not overlap.
  virtual Status ReduceScatter(const void* send, void* recv, size_t recv_count, DataType type,
                               ReduceOp op, Timeout timeout = kDefaultCollectiveTimeout) = 0;
  // Every rank contributes `send_count` elements; `recv` holds size()*send_count,
  // rank r's block at [r*send_count, (r+1)*send_count). In place when
  // send == recv + rank()*send_count (each rank's block already holds its data).
  virtual Status AllGather(const void* send, void* recv, size_t send_count, DataType type,
                           Timeout timeout = kDefaultCollectiveTimeout) = 0;
  // In place: every rank ends with root's `buf[0..count)`.
  virtual Status Broadcast(void* buf, size_t count, DataType type, int root,
                           Timeout timeout = kDefaultCollectiveTimeout) = 0;
  virtual Status Barrier(Timeout timeout = kDefaultCollectiveTimeout) = 0;
};

struct GroupOptions {
  GroupBackend backend = GroupBackend::kAuto;
  // For error messages: "agent predator-0 rank 1: allreduce timed out after 30 s".
  std::string agent;
  int rank = 0;
  int world_size = 1;
  int local_rank = -1;      // LOCAL_RANK: index of this rank's GPU among those visible; -1: rank
  int visible_gpus = 0;     // entries of CUDA_VISIBLE_DEVICES (indices, UUIDs or MIG names)
  int restart_count = 0;    // AGENTRT_RESTART_COUNT: part of the NCCL rendezvous key
  std::string master_addr;  // MASTER_ADDR (NCCL rendezvous store)
  int master_port = 0;      // MASTER_PORT
  // Bounds the whole start-up: rendezvous connect, unique-id exchange and
  // communicator initialisation together.
  Timeout init_timeout = std::chrono::minutes(2);
  // nccl: the CUDA/NCCL calls; nullptr loads libagentrt_cuda.so (tests pass a fake).
  device::Api* device_api = nullptr;
};

// kAuto: the plan's rule, ResolveGroupBackend (plan/config.h), over
// visible_gpus and world_size.
//
// nccl: see agent_runtime/nccl_group.h (device choice, rendezvous through a
// TcpStore on master_port, non-blocking communicator, abort on timeout).
// mpi: see agent_runtime/mpi_group.h (the ranks must be started by mpirun/srun).
// Blocks until every rank has joined or init_timeout passes.
Result<std::unique_ptr<Group>> MakeGroup(const GroupOptions& options);

// A one-rank group that needs no communication library.
std::unique_ptr<Group> MakeSingleRankGroup(std::string agent = {});

}  // namespace agentrt
