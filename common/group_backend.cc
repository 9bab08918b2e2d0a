#include "common/group_backend.h"

#include <string>

#include "common/enum_names.h"

namespace agentrt {
namespace {

constexpr EnumName<GroupBackend> kGroupBackendNames[] = {{GroupBackend::kAuto, "auto"},
                                                         {GroupBackend::kSingle, "single"},
                                                         {GroupBackend::kMpi, "mpi"},
                                                         {GroupBackend::kNccl, "nccl"}};

}  // namespace

std::string_view GroupBackendName(GroupBackend backend) {
  return NameIn(kGroupBackendNames, backend);
}

Result<GroupBackend> ParseGroupBackend(std::string_view name) {
  if (name.empty()) return GroupBackend::kAuto;
  if (auto backend = ValueIn(kGroupBackendNames, name)) return *backend;
  return InvalidArgument("unknown group backend '" + std::string(name) +
                         "'; expected auto, nccl, mpi or single");
}

}  // namespace agentrt
