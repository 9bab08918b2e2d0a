// `agentctl export RUN_DIR --csv FILE | --tensorboard DIR` — a run's metrics
// (RUN_DIR/metrics.jsonl) as one CSV table for a notebook: agent, rank, step,
// run_time, time, then one column per metric name (the union over agents;
// empty where an agent did not report it; strings quoted as RFC 4180 says; `-`
// writes to stdout), or as TensorBoard event files, one folder per agent
// (dashboard/tensorboard.h): `tensorboard --logdir DIR`.
#include <fmt/format.h>

#include <cstdio>
#include <iostream>
#include <iterator>
#include <map>
#include <memory>
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

// `s` as one CSV field: quoted (quotes doubled) when it holds a separator.
void AppendCsvText(std::string& out, std::string_view s) {
  if (s.find_first_of(",\"\n\r") == std::string_view::npos) {
    out += s;
    return;
  }
  out += '"';
  for (char c : s) {
    if (c == '"') out += '"';
    out += c;
  }
  out += '"';
}

void AppendCsvValue(std::string& out, const agentrt::MetricValueView& v) {
  using Kind = agentrt::MetricValueView::Kind;
  if (v.kind == Kind::kInteger) {
    fmt::format_to(std::back_inserter(out), "{}", v.integer);
  } else if (v.kind == Kind::kNumber) {
    fmt::format_to(std::back_inserter(out), "{}", v.number);
  } else {
    AppendCsvText(out, v.text);
  }
}

// The CSV table of metrics.jsonl: a first pass for the columns (the union of
// metric names), a second for the rows, without a record per line.
agentrt::Status WriteCsv(const std::string& metrics_path, const std::string& csv, size_t* rows_out,
                         size_t* names_out) {
  std::set<std::string, std::less<>> names;
  AGENTRT_RETURN_IF_ERROR(
      agentrt::ForEachMetricsLine(metrics_path, [&](const agentrt::MetricsLineView& line) {
        for (const auto& m : line.metrics) {
          if (names.find(m.name) == names.end()) names.emplace(m.name);
        }
      }));
  std::string out = "agent,rank,step,run_time,time";
  for (const auto& n : names) {
    out += ',';
    AppendCsvText(out, n);
  }
  out += '\n';
  size_t rows = 0;
  AGENTRT_RETURN_IF_ERROR(
      agentrt::ForEachMetricsLine(metrics_path, [&](const agentrt::MetricsLineView& line) {
        AppendCsvText(out, line.agent);
        fmt::format_to(std::back_inserter(out), ",{},{},{},{}", line.rank, line.step, line.run_time,
                       line.time);
        for (const auto& n : names) {
          out += ',';
          for (const auto& m : line.metrics) {
            if (m.name != n) continue;
            AppendCsvValue(out, m);
            break;
          }
        }
        out += '\n';
        ++rows;
      }));
  *rows_out = rows;
  *names_out = names.size();
  if (csv == "-") {
    std::fwrite(out.data(), 1, out.size(), stdout);
    return agentrt::Status::Ok();
  }
  return agentrt::WriteFileAtomic(csv, out);
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
    const std::string metrics_path = agentrt::RunDir(opts->run_dir).MetricsPath();
    if (!opts->tensorboard.empty()) {
      auto read = agentrt::ReadMetricsFile(metrics_path);
      if (!read.ok()) Fail("export", read.status());
      auto written = agentrt::WriteTensorBoard(*read, opts->tensorboard);
      if (!written.ok()) Fail("export", written.status());
      std::fprintf(stderr,
                   "agentctl export: %zu events, %zu scalars of %zu agents -> %s "
                   "(tensorboard --logdir %s)\n",
                   written->events, written->scalars, written->agents, opts->tensorboard.c_str(),
                   opts->tensorboard.c_str());
      return;
    }
    size_t rows = 0, names = 0;
    if (auto s = WriteCsv(metrics_path, opts->csv, &rows, &names); !s.ok()) Fail("export", s);
    if (opts->csv != "-") {
      std::fprintf(stderr, "agentctl export: %zu rows, %zu metrics -> %s\n", rows, names,
                   opts->csv.c_str());
    }
  });
}

}  // namespace agentctl
