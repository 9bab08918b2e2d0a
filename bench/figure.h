// What every benchmark shares: the one JSON line it prints per figure,
// {"bench","metric","value","unit","anchor","anchor_value","ratio"} (ratio =
// value / anchor_value, 0 when the anchor is 0), and the small helpers they
// all needed (Median, SelfPath, SpawnLogged). scripts/bench.sh collects these
// lines.
#pragma once

#include <signal.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

namespace agentrt::bench {

// `x` to 6 significant digits, so a figure line reads as a measurement.
inline double Significant(double x) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.6g", x);
  return std::strtod(buf, nullptr);
}

inline std::string FigureJson(std::string_view bench, std::string_view metric, double value,
                              std::string_view unit, std::string_view anchor, double anchor_value) {
  nlohmann::ordered_json j;
  j["bench"] = bench;
  j["metric"] = metric;
  j["value"] = Significant(value);
  j["unit"] = unit;
  j["anchor"] = anchor;
  j["anchor_value"] = Significant(anchor_value);
  j["ratio"] = Significant(anchor_value != 0 ? value / anchor_value : 0.0);
  return j.dump();
}

// Prints the figure's line on stdout at once (a benchmark that dies later keeps it).
inline void PrintFigure(std::string_view bench, std::string_view metric, double value,
                        std::string_view unit, std::string_view anchor, double anchor_value) {
  std::printf("%s\n", FigureJson(bench, metric, value, unit, anchor, anchor_value).c_str());
  std::fflush(stdout);
}

inline double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n == 0 ? 0.0 : (n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]));
}

// This program's path (to run itself as a worker), empty when /proc says nothing.
inline std::string SelfPath() {
  char buf[4096];
  const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0) return {};
  buf[n] = '\0';
  return buf;
}

// Starts argv (argv[0] a path) in its own process group, stdout and stderr
// appended to `log`; the child gets SIGTERM if this benchmark dies first, so a
// failed benchmark leaves no run behind. Returns its pid (-1: fork failed).
inline pid_t SpawnLogged(const std::vector<std::string>& argv, const std::string& log) {
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::setpgid(0, 0);
    ::prctl(PR_SET_PDEATHSIG, SIGTERM);
    std::FILE* f = std::freopen(log.c_str(), "a", stdout);
    if (f != nullptr) ::dup2(::fileno(stdout), 2);
    ::execv(args[0], args.data());
    ::_exit(127);
  }
  return pid;
}

}  // namespace agentrt::bench
