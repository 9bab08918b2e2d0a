// How an agent's ranks talk to each other. Shared by the config model
// (plan/config.h: `group_backend:` in agents.yaml, resolved in the plan)
// and the runtime (agent_runtime/group.h: MakeGroup), so it lives here once.
#pragma once

#include <string_view>

#include "common/status.h"

namespace agentrt {

enum class GroupBackend { kAuto, kSingle, kMpi, kNccl };

// "auto", "single", "mpi", "nccl".
std::string_view GroupBackendName(GroupBackend backend);
// Parses the names above (an empty name is "auto").
Result<GroupBackend> ParseGroupBackend(std::string_view name);

}  // namespace agentrt
