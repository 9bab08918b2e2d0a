// agentrt-exec-rank --log-dir DIR -- /abs/program args...  (see scheduler/process_exec_rank.h)
#include "scheduler/process_exec_rank.h"

int main(int argc, char** argv) { return agentrt::ExecRankMain(argc, argv); }
