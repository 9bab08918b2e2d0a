// agentrt-exec-rank: the rank wrapper mpirun and srun start in front of every
// rank of an agent (see plan/rank_exec.h).
#include "plan/rank_exec.h"

int main(int argc, char** argv) { return agentrt::ExecRankMain(argc, argv); }
