// agent-worker: see tools/agent-worker/worker.h.
#include "tools/agent-worker/worker.h"

int main() { return agentrt::worker::WorkerMain(); }
