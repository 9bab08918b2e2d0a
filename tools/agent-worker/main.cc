// agent-worker: see tools/agent-worker/worker.h.
#include <cstdlib>

#include "tools/agent-worker/worker.h"

int main() {
  // MPI groups poll their collectives (agent_runtime/mpi_group.h); on a machine
  // with more ranks than cores a spinning rank steals the CPU its peer needs to
  // arrive. Open MPI reads this before MPI_Init: yield while idle (measured: a
  // 2-rank agent on a busy 2-core machine ran 10x faster). A value from the
  // agent's env: in agents.yaml wins.
  setenv("OMPI_MCA_mpi_yield_when_idle", "1", /*overwrite=*/0);
  return agentrt::worker::WorkerMain();
}
