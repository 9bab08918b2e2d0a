// agentrt::Group — an agent's own data-parallel group: the collectives its ranks
// use to train together. One Group never spans two agents: each agent has its
// own communicator and its own rendezvous port (MASTER_ADDR:MASTER_PORT).
//
// Backends (created by MakeGroup from the agent's assignment):
//   nccl   device buffers, GPUs of this agent (agent_runtime/cuda/)
//   mpi    host buffers, one MPI world per agent (mpirun / srun --mpi=pmix)
//   single one rank, no communication library at all
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
  int local_rank = -1;      // LOCAL_RANK: picks this rank's GPU (nccl); -1: use rank
  bool has_gpus = false;    // CUDA_VISIBLE_DEVICES names at least one GPU
  std::string master_addr;  // MASTER_ADDR (NCCL rendezvous store)
  int master_port = 0;      // MASTER_PORT
  Timeout init_timeout = std::chrono::minutes(2);
};

// kAuto: GPUs -> nccl; CPU with world_size > 1 -> mpi; otherwise single.
//
// nccl: rank 0 creates the ncclUniqueId and serves it through a TcpStore bound
// on master_port (every rank must be given the same master_addr:master_port,
// this agent's own); the communicator is created non-blocking, and a
// collective that exceeds its timeout is aborted with ncclCommAbort.
// mpi: see agent_runtime/mpi_group.h (the ranks must be started by mpirun/srun).
// Blocks until every rank has joined or init_timeout passes.
Result<std::unique_ptr<Group>> MakeGroup(const GroupOptions& options);

// A one-rank group that needs no communication library.
std::unique_ptr<Group> MakeSingleRankGroup(std::string agent = {});

}  // namespace agentrt
