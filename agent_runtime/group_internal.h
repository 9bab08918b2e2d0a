// Pieces shared by the Group backends (not part of the public API): argument
// checks that every backend applies the same way, and the backend factories.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "agent_runtime/group.h"
#include "common/status.h"

namespace agentrt::internal {

// "agent predator-0 rank 1 (mpi)" — the prefix of every Group error message.
std::string GroupWhere(std::string_view agent, int rank, std::string_view backend);

// "30 s" for whole seconds, else "250 ms": how timeouts read in every message.
std::string FormatTimeout(Timeout t);

// Checks a collective's buffers and root: non-null when count > 0, a valid root.
Status CheckBuffer(const void* buf, size_t count, std::string_view what, std::string_view op);
Status CheckRoot(int root, int size, std::string_view op);

// Where every call of a backend starts: a broken group refuses `op`, saying
// `why_broken`; an argument error (`arg_status`) gets the group's `where`.
Status BeginCall(bool broken, std::string_view where, std::string_view op, const Status& arg_status,
                 std::string_view why_broken);

}  // namespace agentrt::internal
