#include "agent_runtime/group.h"

#include <cstring>

#include "agent_runtime/device_api.h"
#include "agent_runtime/group_internal.h"
#include "agent_runtime/mpi_group.h"
#include "agent_runtime/nccl_group.h"
#include "common/enum_names.h"
#include "plan/config.h"

namespace agentrt {

size_t DataTypeSize(DataType type) {
  switch (type) {
    case DataType::kFloat32:
      return 4;
    case DataType::kBFloat16:
    case DataType::kFloat16:
      return 2;
    case DataType::kInt64:
      return 8;
  }
  return 0;
}

constexpr EnumName<DataType> kDataTypeNames[] = {{DataType::kFloat32, "float32"},
                                                 {DataType::kBFloat16, "bfloat16"},
                                                 {DataType::kFloat16, "float16"},
                                                 {DataType::kInt64, "int64"}};

std::string_view DataTypeName(DataType type) { return NameIn(kDataTypeNames, type); }

constexpr EnumName<ReduceOp> kReduceOpNames[] = {
    {ReduceOp::kSum, "sum"}, {ReduceOp::kAvg, "avg"}, {ReduceOp::kMax, "max"}};

std::string_view ReduceOpName(ReduceOp op) { return NameIn(kReduceOpNames, op); }

constexpr EnumName<CollectiveOp> kCollectiveOpNames[] = {
    {CollectiveOp::kAllReduce, "all_reduce"},
    {CollectiveOp::kReduceScatter, "reduce_scatter"},
    {CollectiveOp::kAllGather, "all_gather"},
    {CollectiveOp::kBroadcast, "broadcast"},
    {CollectiveOp::kBarrier, "barrier"}};

std::string_view CollectiveOpName(CollectiveOp op) { return NameIn(kCollectiveOpNames, op); }

namespace internal {

std::string GroupWhere(std::string_view agent, int rank, std::string_view backend) {
  std::string s = "agent ";
  s += agent.empty() ? std::string_view("<unnamed>") : agent;
  s += " rank " + std::to_string(rank) + " (" + std::string(backend) + ")";
  return s;
}

std::string FormatTimeout(Timeout t) {
  const auto ms = t.count();
  if (ms % 1000 == 0) return std::to_string(ms / 1000) + " s";
  return std::to_string(ms) + " ms";
}

Status BeginCall(bool broken, std::string_view where, std::string_view op, const Status& arg_status,
                 std::string_view why_broken) {
  if (broken) {
    return Aborted(std::string(where) + ": " + std::string(op) + " refused: " +
                   std::string(why_broken) + "; exit so the supervisor restarts the agent");
  }
  return arg_status.ok() ? arg_status : arg_status.WithContext(where);
}

Status CheckBuffer(const void* buf, size_t count, std::string_view what, std::string_view op) {
  if (count > 0 && buf == nullptr) {
    return InvalidArgument(std::string(op) + ": " + std::string(what) + " is null but count is " +
                           std::to_string(count));
  }
  return Status::Ok();
}

Status CheckRoot(int root, int size, std::string_view op) {
  if (root < 0 || root >= size) {
    return InvalidArgument(std::string(op) + ": root " + std::to_string(root) +
                           " is outside the group of " + std::to_string(size) + " ranks");
  }
  return Status::Ok();
}

}  // namespace internal

namespace {

// One rank: every collective is the identity (or a copy between buffers).
class SingleRankGroup final : public Group {
 public:
  explicit SingleRankGroup(std::string agent) : agent_(std::move(agent)) {}

  int rank() const override { return 0; }
  int size() const override { return 1; }
  std::string_view backend() const override { return "single"; }
  bool device_buffers() const override { return false; }

  Status AllReduce(void* buf, size_t count, DataType, ReduceOp, Timeout) override {
    return Where(internal::CheckBuffer(buf, count, "buffer", "allreduce"));
  }
  Status ReduceScatter(const void* send, void* recv, size_t recv_count, DataType type, ReduceOp,
                       Timeout) override {
    AGENTRT_RETURN_IF_ERROR(
        Where(internal::CheckBuffer(send, recv_count, "send", "reducescatter")));
    AGENTRT_RETURN_IF_ERROR(
        Where(internal::CheckBuffer(recv, recv_count, "recv", "reducescatter")));
    if (send != recv && recv_count > 0) std::memmove(recv, send, recv_count * DataTypeSize(type));
    return Status::Ok();
  }
  Status AllGather(const void* send, void* recv, size_t send_count, DataType type,
                   Timeout) override {
    AGENTRT_RETURN_IF_ERROR(Where(internal::CheckBuffer(send, send_count, "send", "allgather")));
    AGENTRT_RETURN_IF_ERROR(Where(internal::CheckBuffer(recv, send_count, "recv", "allgather")));
    if (send != recv && send_count > 0) std::memmove(recv, send, send_count * DataTypeSize(type));
    return Status::Ok();
  }
  Status Broadcast(void* buf, size_t count, DataType, int root, Timeout) override {
    AGENTRT_RETURN_IF_ERROR(Where(internal::CheckBuffer(buf, count, "buffer", "broadcast")));
    return Where(internal::CheckRoot(root, 1, "broadcast"));
  }
  Status Barrier(Timeout) override { return Status::Ok(); }

 private:
  Status Where(const Status& s) const {
    return s.ok() ? s : s.WithContext(internal::GroupWhere(agent_, 0, "single"));
  }
  std::string agent_;
};

}  // namespace

std::unique_ptr<Group> MakeSingleRankGroup(std::string agent) {
  return std::make_unique<SingleRankGroup>(std::move(agent));
}

Result<std::unique_ptr<Group>> MakeGroup(const GroupOptions& options) {
  const GroupBackend backend =
      ResolveGroupBackend(options.backend, options.visible_gpus, options.world_size);
  const std::string where = internal::GroupWhere(options.agent, options.rank, "group");
  switch (backend) {
    case GroupBackend::kSingle:
      if (options.world_size != 1) {
        return InvalidArgument(where + ": the single-rank backend was chosen but WORLD_SIZE is " +
                               std::to_string(options.world_size) +
                               "; use the mpi or nccl backend for more than one rank");
      }
      return MakeSingleRankGroup(options.agent);
    case GroupBackend::kMpi:
      return MakeMpiGroup(options);
    case GroupBackend::kNccl: {
      device::Api* api = options.device_api;
      if (api == nullptr) {
        if (!device::DriverPresent()) {
          return FailedPrecondition(where +
                                    ": the nccl backend needs a GPU but this node has no NVIDIA "
                                    "driver (libcuda.so.1); run the agent where its GPUs are, or "
                                    "give it backend: mpi (or single) to train on the host");
        }
        Result<device::Api*> loaded = device::LoadDeviceApi();
        if (!loaded.ok()) return loaded.status().WithContext(where + ": the nccl backend");
        api = *loaded;
      }
      return internal::MakeNcclGroup(options, api);
    }
    case GroupBackend::kAuto:
      break;
  }
  return Internal(where + ": unknown group backend");
}

}  // namespace agentrt
