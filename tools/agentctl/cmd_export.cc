// `agentctl export RUN_DIR --csv FILE | --tensorboard DIR` — a run's metrics
// (RUN_DIR/metrics.jsonl) as one CSV table for a notebook: agent, rank, step,
// run_time, time, then one column per metric name (the union over agents;
// empty where an agent did not report it; strings quoted as RFC 4180 says; `-`
// writes to stdout), or as TensorBoard event files, one folder per agent
// (dashboard/tensorboard.h): `tensorboard --logdir DIR`.
#include <fmt/format.h>

#include <cstdio>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "common/file_util.h"
#include "dashboard/tensorboard.h"
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
    const std::string path = agentrt::RunDir(opts->run_dir).MetricsPath();
    std::ifstream in(path);
    if (!in) Fail("export", agentrt::NotFound(path + " does not exist: is it a run directory?"));
    std::vector<nlohmann::json> rows;
    std::set<std::string> names;
    std::string line;
    for (int number = 1; std::getline(in, line); ++number) {
      if (line.empty()) continue;
      auto j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
      if (!j.is_object()) {
        // A run killed mid-write leaves at most its last line torn.
        if (in.peek() == EOF) break;
        Fail("export", agentrt::DataLoss(fmt::format("{}:{}: not a JSON object", path, number)));
      }
      if (j.contains("metrics") && j["metrics"].is_object()) {
        for (const auto& [k, v] : j["metrics"].items()) names.insert(k);
      }
      rows.push_back(std::move(j));
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
    for (const auto& j : rows) {
      out += fmt::format("{},{},{},{},{}", CsvField(j.value("agent", nlohmann::json())),
                         CsvField(j.value("rank", nlohmann::json())),
                         CsvField(j.value("step", nlohmann::json())),
                         CsvField(j.value("run_time", nlohmann::json())),
                         CsvField(j.value("time", nlohmann::json())));
      const nlohmann::json& m = j.contains("metrics") ? j["metrics"] : nlohmann::json::object();
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
