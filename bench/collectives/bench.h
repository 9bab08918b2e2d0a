// Shared pieces of bench_collectives: the figure line every benchmark prints.
#pragma once

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

namespace agentrt::bench {

// One figure: {"bench","metric","value","unit","anchor","anchor_value","ratio"}.
inline std::string FigureJson(const std::string& metric, double value, const std::string& unit,
                              const std::string& anchor, double anchor_value) {
  char buf[512];
  std::snprintf(buf, sizeof(buf),
                "{\"bench\":\"collectives\",\"metric\":\"%s\",\"value\":%.6g,\"unit\":\"%s\","
                "\"anchor\":\"%s\",\"anchor_value\":%.6g,\"ratio\":%.4f}",
                metric.c_str(), value, unit.c_str(), anchor.c_str(), anchor_value,
                anchor_value != 0 ? value / anchor_value : 0.0);
  return buf;
}

inline double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n == 0 ? 0.0 : (n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]));
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
