// The MPI backend of agentrt::Group (host buffers), for tests and tools that
// need it directly; everything else goes through MakeGroup.
//
// One MPI world per agent: the agent's ranks are started by `mpirun` (locally)
// or `srun --mpi=pmix` (SLURM). MPI is initialised once per process
// (MPI_Init_thread, MPI_THREAD_SERIALIZED) the first time a group is made and
// finalised at process exit; each Group works on its own MPI_Comm_dup of
// MPI_COMM_WORLD. Collectives are non-blocking MPI calls polled against the
// call's deadline, so a hung peer gives DeadlineExceeded instead of a hang.
// After a timeout the process skips MPI_Finalize (a pending collective can
// never complete), so mpirun/srun see the rank fail and end the world.
#pragma once

#include <memory>

#include "agent_runtime/group.h"
#include "common/status.h"

namespace agentrt {

// Fails when MPI's world size or rank disagrees with options.world_size /
// options.rank (when options.world_size > 1: WORLD_SIZE and mpirun -np must agree).
Result<std::unique_ptr<Group>> MakeMpiGroup(const GroupOptions& options);

}  // namespace agentrt
