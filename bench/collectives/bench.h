// Shared pieces of bench_collectives: the figure line every benchmark prints.
#pragma once

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "bench/figure.h"

namespace agentrt::bench {

// One figure of this benchmark's (bench/figure.h's line).
inline std::string FigureJson(const std::string& metric, double value, const std::string& unit,
                              const std::string& anchor, double anchor_value) {
  return FigureJson("collectives", metric, value, unit, anchor, anchor_value);
}

inline std::string SizeName(size_t bytes) {
  if (bytes >= (size_t{1} << 20)) return std::to_string(bytes >> 20) + "MiB";
  return std::to_string(bytes >> 10) + "KiB";
}

// Worker entry points (run inside an mpirun world); print figure lines on rank 0.
int RunAllReduceBench(int argc, char** argv);
int RunAdamBench(int argc, char** argv);
// In-process GPU figures. `ran` is false only when there is no GPU to use
// (no NVIDIA driver, or none reported; `error` says which); with `ran`,
// `error` is any failure, with its text.
struct GpuBenchOutcome {
  bool ran = false;
  std::string error;
};
GpuBenchOutcome RunGpuBench(std::vector<std::string>* figures);

}  // namespace agentrt::bench
