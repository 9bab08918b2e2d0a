// The NCCL backend of agentrt::Group (device buffers). Created through
// MakeGroup; this header gives tests and device code the group's stream.
#pragma once

#include <cuda_runtime.h>

#include "agent_runtime/group.h"

namespace agentrt::cuda {

// The stream the group's collectives run on, or nullptr when `group` is not an
// NCCL group. Work enqueued on it runs in order with the collectives.
cudaStream_t NcclGroupStream(Group& group);

}  // namespace agentrt::cuda
