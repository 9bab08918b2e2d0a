// bench_collectives: launches its MPI worlds itself (mpirun -np 2 and 4 of this
// program in worker mode), collects their figure lines, adds the GPU figures
// when a device is present, and prints every figure last, one JSON per line.
//
//   bench_collectives                 the default, short run
//   AGENTRT_BENCH_FULL=1 ...          more repetitions at every size
//   bench_collectives --gpu-only      only the GPU figures (for a short device session)
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "bench.h"
#include "bench/figure.h"

namespace {

using agentrt::bench::SelfPath;

// Runs one mpirun world; its human-readable lines go to stderr, figure lines are collected.
bool RunWorld(int np, const std::string& mode, std::vector<std::string>* figures) {
  std::string cmd = std::string(AGENTRT_MPIEXEC) + " --oversubscribe --allow-run-as-root -np " +
                    std::to_string(np) + " '" + SelfPath() + "' --worker " + mode + " 2>&1";
  std::fprintf(stderr, "bench_collectives: %s\n", cmd.c_str());
  FILE* p = ::popen(cmd.c_str(), "r");
  if (p == nullptr) return false;
  char line[4096];
  while (std::fgets(line, sizeof(line), p) != nullptr) {
    if (line[0] == '{') {
      std::string s(line);
      while (!s.empty() && (s.back() == '\n' || s.back() == '\r')) s.pop_back();
      figures->push_back(s);
    } else {
      std::fputs(line, stderr);
    }
  }
  const int rc = ::pclose(p);
  if (rc != 0)
    std::fprintf(stderr, "bench_collectives: mpirun -np %d %s exited with %d\n", np, mode.c_str(),
                 rc);
  return rc == 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc >= 3 && std::strcmp(argv[1], "--worker") == 0) {
    if (std::strcmp(argv[2], "allreduce") == 0)
      return agentrt::bench::RunAllReduceBench(argc, argv);
    if (std::strcmp(argv[2], "adam") == 0) return agentrt::bench::RunAdamBench(argc, argv);
    std::fprintf(stderr, "bench_collectives: unknown worker mode %s\n", argv[2]);
    return 2;
  }
  // Oversubscription is expected on small machines (4 ranks on 2 cores).
  ::setenv("OMPI_MCA_rmaps_base_oversubscribe", "1", 0);
  const bool gpu_only = argc >= 2 && std::strcmp(argv[1], "--gpu-only") == 0;
  std::vector<std::string> figures;
  bool ok = true;
  if (!gpu_only) {
    ok &= RunWorld(2, "allreduce", &figures);
    ok &= RunWorld(4, "allreduce", &figures);
    ok &= RunWorld(2, "adam", &figures);
  }
#if defined(AGENTRT_HAVE_CUDA)
  const agentrt::bench::GpuBenchOutcome gpu = agentrt::bench::RunGpuBench(&figures);
  if (!gpu.ran) {
    std::fprintf(stderr, "bench_collectives: %s\n", gpu.error.c_str());
  } else if (!gpu.error.empty()) {
    std::fprintf(stderr, "bench_collectives: GPU figures failed: %s\n", gpu.error.c_str());
    ok = false;
  }
#endif
  std::fflush(stderr);
  for (const std::string& f : figures) std::printf("%s\n", f.c_str());
  return ok ? 0 : 1;
}
