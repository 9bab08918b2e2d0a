// The NCCL backend of agentrt::Group (device buffers), written against
// device::Api so that its host logic runs the same over the real CUDA/NCCL
// library and over the unit tests' fake. Not part of the public API: create
// groups with MakeGroup.
//
// Life of a group (every step bounded by one deadline, init_timeout, measured
// from the call):
//   1. the device: LOCAL_RANK indexes the GPUs this process sees
//      (CUDA_VISIBLE_DEVICES); more local ranks than GPUs is refused, since
//      NCCL refuses two ranks on one GPU ("Duplicate GPU detected");
//   2. rendezvous: rank 0 makes the ncclUniqueId and serves it through a
//      TcpStore on MASTER_PORT under RendezvousKey(), a key every rank derives
//      alike from the agent, world size and restart count;
//   3. a non-blocking communicator, polled until ready.
// A collective records an event on the caller's stream, makes the group's
// stream wait for it, enqueues, then polls until the group's stream drains:
// back-to-back for a few polls, then sleeping with exponential back-off. On
// a deadline or an error the communicator is aborted on a detached thread
// (ncclCommAbort can wait behind other work on the device) and the call
// returns at once; the group then refuses every call with Aborted.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "agent_runtime/device_api.h"
#include "agent_runtime/group.h"

namespace agentrt::internal {

// How a wait on the device polls: `spin_polls` queries back to back, then a
// sleep after each query that doubles from `first_sleep` up to `max_sleep`.
struct PollBackoff {
  uint32_t spin_polls = 64;
  std::chrono::microseconds first_sleep{10};
  std::chrono::microseconds max_sleep{1000};

  // The sleep after the poll numbered `poll` (0-based): zero while spinning.
  std::chrono::microseconds SleepAfter(uint32_t poll) const;
};

// "agentrt/nccl/<agent>/<world_size>/<restart_count>".
std::string RendezvousKey(const GroupOptions& options);

// `api` must outlive the group and any abort it starts (the real one lives as
// long as the process).
Result<std::unique_ptr<Group>> MakeNcclGroup(const GroupOptions& options, device::Api* api,
                                             PollBackoff backoff = {});

}  // namespace agentrt::internal
