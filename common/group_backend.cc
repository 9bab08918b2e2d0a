#include "common/group_backend.h"

#include <string>

namespace agentrt {

std::string_view GroupBackendName(GroupBackend backend) {
  switch (backend) {
    case GroupBackend::kAuto:
      return "auto";
    case GroupBackend::kSingle:
      return "single";
    case GroupBackend::kMpi:
      return "mpi";
    case GroupBackend::kNccl:
      return "nccl";
  }
  return "unknown";
}

Result<GroupBackend> ParseGroupBackend(std::string_view name) {
  if (name == "auto" || name.empty()) return GroupBackend::kAuto;
  if (name == "single") return GroupBackend::kSingle;
  if (name == "mpi") return GroupBackend::kMpi;
  if (name == "nccl") return GroupBackend::kNccl;
  return InvalidArgument("unknown group backend '" + std::string(name) +
                         "'; expected auto, nccl, mpi or single");
}

}  // namespace agentrt
