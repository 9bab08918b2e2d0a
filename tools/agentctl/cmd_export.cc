// `agentctl export RUN_DIR --csv FILE | --tensorboard DIR` — a run's metrics
// (RUN_DIR/metrics.jsonl) as one CSV table for a notebook: agent, rank, step,
// run_time, time, then one column per metric name (the union over agents;
// empty where an agent did not report it; strings quoted as RFC 4180 says; `-`
// writes to stdout), or as TensorBoard event files, one folder per agent
// (dashboard/tensorboard.h): `tensorboard --logdir DIR`.
#include <fmt/format.h>

#include <cstdio>
#include <iostream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "common/file_util.h"
#include "dashboard/tensorboard.h"
#include "plan/records.h"
#include "plan/run_dir.h"
#include "tools/agentctl/commands.h"

namespace agentctl {
namespace {

std::string CsvField(const nlohmann::json& v) {
  if (v.is_null()) return "";
  if (v.is_number_integer()) return std::to_string(v.get<int64_t>());
  if (v.is_number()) return fmt::format("{}", v.get<double>());
  std::string s = v.is_string() ? v.get<std::string>() : v.dump();
  if (s.find_first_of(",\"\n\r") == std::string::npos) return s;
  std::string out = "\"";
  for (char c : s) {
    if (c == '"') out.push_back('"');
    out.push_back(c);
  }
  return out + "\"";
}

}  // namespace

void RegisterExport(CLI::App& app) {
  struct Options {
    std::string run_dir;
    std::string csv;
    std::string tensorboard;
  };
  auto opts = std::make_shared<Options>();
  CLI::App* cmd =
      app.add_subcommand("export", "Write a run's metrics for a notebook (CSV) or TensorBoard");
  cmd->add_option("run_dir", opts->run_dir, "the run directory")->required();
  auto* csv = cmd->add_option("--csv", opts->csv, "the CSV file to write (- for stdout)");
  auto* tb = cmd->add_option("--tensorboard", opts->tensorboard,
                             "a folder for TensorBoard event files, one sub-folder per agent");
  csv->excludes(tb);
  cmd->callback([opts] {
    if (opts->csv.empty() && opts->tensorboard.empty())
      Fail("export",
           agentrt::InvalidArgument("say what to write: --csv FILE or --tensorboard DIR"));
    auto read = agentrt::ReadMetricsFile(agentrt::RunDir(opts->run_dir).MetricsPath());
    if (!read.ok()) Fail("export", read.status());
    const std::vector<agentrt::MetricsRecord>& rows = *read;
    std::set<std::string> names;
    for (const auto& r : rows) {
      for (const auto& [k, v] : r.metrics.items()) names.insert(k);
    }
    if (!opts->tensorboard.empty()) {
      auto written = agentrt::WriteTensorBoard(rows, opts->tensorboard);
      if (!written.ok()) Fail("export", written.status());
      std::fprintf(stderr,
                   "agentctl export: %zu events, %zu scalars of %zu agents -> %s "
                   "(tensorboard --logdir %s)\n",
                   written->events, written->scalars, written->agents, opts->tensorboard.c_str(),
                   opts->tensorboard.c_str());
      return;
    }
    std::string out = "agent,rank,step,run_time,time";
    for (const auto& n : names) out += "," + CsvField(n);
    out += "\n";
    for (const auto& r : rows) {
      out += fmt::format("{},{},{},{},{}", CsvField(r.agent), CsvField(r.rank), CsvField(r.step),
                         CsvField(r.run_time), CsvField(r.time));
      const nlohmann::json& m = r.metrics;
      for (const auto& n : names) out += "," + CsvField(m.contains(n) ? m[n] : nlohmann::json());
      out += "\n";
    }
    if (opts->csv == "-") {
      std::fwrite(out.data(), 1, out.size(), stdout);
      return;
    }
    if (auto s = agentrt::WriteFileAtomic(opts->csv, out); !s.ok()) Fail("export", s);
    std::fprintf(stderr, "agentctl export: %zu rows, %zu metrics -> %s\n", rows.size(),
                 names.size(), opts->csv.c_str());
  });
}

}  // namespace agentctl
