// agentctl check agents.yaml: know before you train. Every agent runs
// agentrt-preflight (tools/agentrt-preflight) on exactly its own partition, as
// a run of its own (the same planner, launcher and supervisor as `agentctl
// run`, so what is checked is what a run would get): a collective sweep through
// its Group with nccl-tests' algbw/busbw, busbw as a share of its link class's
// expected bandwidth (cluster.links), its port block, the bus, its checkpoint
// directory's write bandwidth and the clock skew between its ranks. Prints one
// row per agent (or --json) and exits 0 when every agent passed; an efficiency
// below preflight.min_efficiency is a warning, an error with --strict.
#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <set>
#include <string>

#include "common/file_util.h"
#include "plan/plan.h"
#include "plan/records.h"
#include "plan/run_dir.h"
#include "scheduler/process.h"
#include "scheduler/status.h"
#include "tools/agentctl/commands.h"

namespace agentctl {
namespace {

// The link an agent's collectives cross, and what it should reach (GB/s).
std::pair<std::string, double> LinkOf(const agentrt::AgentPlan& a, const agentrt::LinkConfig& l) {
  if (a.placement.size() > 1) return {"network", l.network_gbps};
  if (a.gpus == 0) return {"shm", l.shm_gbps};
  // One node: taken as one NVLink domain, where the planner keeps a sub-node
  // agent. (A whole node of several domains is reported as nvlink too: the
  // plan does not carry the domains, so pcie_gbps is not used yet.)
  return {"nvlink", l.nvlink_gbps};
}

// What agentrt-preflight reported for `a`, or why there is nothing.
agentrt::PreflightReport ReportOf(const agentrt::AgentPlan& a, const agentrt::RunDir& dir,
                                  const agentrt::Result<agentrt::RunStatus>& status) {
  agentrt::Result<agentrt::PreflightReport> read = agentrt::NotFound("no result");
  const std::string path = agentrt::PreflightFile(dir.Resolve(a.workdir));
  if (auto text = agentrt::ReadWholeFile(path, 16 << 20); text.ok()) {
    read = agentrt::PreflightReport::FromJson(nlohmann::json::parse(*text, nullptr, false));
    if (!read.ok()) read = agentrt::DataLoss(path + ": " + read.status().message());
  }
  if (read.ok()) return std::move(read).value();
  agentrt::PreflightReport none;
  none.agent = a.name;
  none.ranks = a.ranks;
  const agentrt::AgentStatus* s = status.ok() ? status->FindAgent(a.name) : nullptr;
  none.errors.push_back("the check did not complete: " +
                        (s != nullptr && !s->reason.empty() ? s->reason : read.status().message()) +
                        "; see " + dir.LogDir(a.name));
  return none;
}

// One agent's row of the report: its preflight result judged against its
// link and checkpoint needs, with a verdict.
nlohmann::json Judge(const agentrt::AgentPlan& a, const agentrt::PreflightReport& result,
                     const std::pair<std::string, double>& link, const agentrt::Config& config,
                     bool strict) {
  nlohmann::json row = result.ToJson();
  row["nodes"] = a.NodeList();
  row["link"] = link.first;
  row["expected_gbps"] = link.second;
  row["warnings"] = nlohmann::json::array();
  row["efficiency"] = result.largest_bytes > 0
                          ? nlohmann::json(result.largest_busbw_gbps / link.second)
                          : nlohmann::json(nullptr);
  if (row["efficiency"].is_number() &&
      row["efficiency"].get<double>() < config.preflight.min_efficiency) {
    row["warnings"].push_back(fmt::format(
        "all_reduce busbw {:.2f} GB/s is {:.0f}% of the {} link's expected {} GB/s (below "
        "{:.0f}%)",
        result.largest_busbw_gbps, 100 * row["efficiency"].get<double>(), link.first, link.second,
        100 * config.preflight.min_efficiency));
  }
  if (result.checkpoint && config.preflight.checkpoint_bytes > 0) {
    const double need = config.preflight.checkpoint_bytes / 1e6 / a.checkpoint.interval_s;
    const double have = result.checkpoint->write_mb_s;
    row["checkpoint"]["needed_mb_s"] = need;
    if (have >= 0 && have < need) {
      row["errors"].push_back(fmt::format(
          "its checkpoint directory writes {:.0f} MB/s; {} bytes every {} s need {:.0f} MB/s", have,
          config.preflight.checkpoint_bytes, a.checkpoint.interval_s, need));
    }
  }
  const bool failed = !row["errors"].empty() || (strict && !row["warnings"].empty());
  row["verdict"] = failed ? "fail" : (row["warnings"].empty() ? "ok" : "warn");
  return row;
}

// The report as a table, then every error and warning.
std::string RenderReport(const nlohmann::json& report, const agentrt::Plan& plan,
                         const agentrt::RunDir& dir) {
  size_t name_w = 5;
  for (const auto& a : plan.agents) name_w = std::max(name_w, a.name.size());
  std::string out = fmt::format(
      "{:<{}}  {:>5}  {:<12}  {:<7}  {:>12}  {:>9}  {:>5}  {:>9}  {:>7}  {}\n", "AGENT", name_w,
      "RANKS", "NODES", "LINK", "BUSBW GB/s", "EXPECTED", "EFF", "CKPT MB/s", "SKEW ms", "VERDICT");
  for (const auto& row : report["agents"]) {
    const bool swept = row.value("largest_bytes", 0) > 0;
    const double e = row.contains("efficiency") && row["efficiency"].is_number()
                         ? 100 * row["efficiency"].get<double>()
                         : -1;
    const auto eff = e < 0    ? std::string("-")
                     : e < 10 ? fmt::format("{:.1f}%", e)
                              : fmt::format("{:.0f}%", e);
    const double ckpt =
        row.contains("checkpoint") ? row["checkpoint"].value("write_mb_s", -1.0) : -1.0;
    out += fmt::format(
        "{:<{}}  {:>5}  {:<12}  {:<7}  {:>12}  {:>9}  {:>5}  {:>9}  {:>7}  {}\n",
        row.value("agent", ""), name_w, row.value("ranks", 0), row.value("nodes", ""),
        row.value("link", ""),
        swept ? fmt::format("{:.2f}", row.value("largest_busbw_gbps", 0.0)) : std::string("-"),
        row.value("expected_gbps", 0.0), eff,
        ckpt >= 0 ? fmt::format("{:.0f}", ckpt) : std::string("-"),
        fmt::format("{:.2f}", row.value("clock_skew_ms", 0.0)), row.value("verdict", ""));
  }
  for (const auto& row : report["agents"]) {
    for (const auto& e : row["errors"])
      out += fmt::format("error: {}: {}\n", row.value("agent", ""), e.get<std::string>());
    for (const auto& w : row["warnings"])
      out += fmt::format("warning: {}: {}\n", row.value("agent", ""), w.get<std::string>());
  }
  out +=
      fmt::format("busbw: nccl-tests' bus bandwidth of the largest all_reduce ({}); details: {}\n",
                  "algbw x 2(n-1)/n", agentrt::PreflightFile(dir.WorkDir("<agent>")));
  return out;
}

}  // namespace

int Check(agentrt::Config& config, const CheckOptions& options, std::string_view command) {
  // A run of its own, next to the real ones, named for what it is.
  config.run.name = config.run.name.substr(0, 57) + "-check";
  const bool on_slurm = options.backend == "slurm";
  if (!on_slurm && options.backend != "local") {
    Fail(command, agentrt::InvalidArgument("unknown backend '" + options.backend +
                                           "'; use --backend local or --backend slurm"));
  }
  agentrt::PreparedRun prepared =
      on_slurm ? PrepareOnSlurm(config, options.file, options.cluster, command)
               : PrepareLocal(config, options.file, options.cluster, command);
  const std::string preflight = agentrt::SelfExecutableDir() + "/agentrt-preflight";
  std::map<std::string, std::pair<std::string, double>> links;
  for (agentrt::AgentPlan& a : prepared.plan.agents) {
    links[a.name] = LinkOf(a, config.cluster.links);
    a.command = {preflight, "--max-bytes", std::to_string(config.preflight.max_bytes),
                 "--ckpt-probe-bytes", std::to_string(config.preflight.checkpoint_probe_bytes)};
    a.restart.max_restarts = 0;  // a check that fails says so; it is not retried
    a.restart.progress_timeout_s = 0;
    a.group.collective_timeout_s = 60;  // a check that hangs fails within a minute
  }
  const agentrt::Plan plan = prepared.plan;
  const agentrt::RunDir dir = prepared.dir;
  if (on_slurm) {
    // One allocation on the agents' own nodes, every agent a job step there.
    // Its exit code is not the check's: the per-agent results in status.json are.
    SubmitAndFollow(prepared, config.slurm, /*quiet=*/true);
  } else {
    DriveLocal(std::move(prepared), /*quiet=*/true);
  }
  const auto status = agentrt::ReadRunStatusFile(dir.StatusPath());
  nlohmann::json report = {{"run_dir", dir.path()}, {"agents", nlohmann::json::array()}};
  bool all_passed = true;
  for (const agentrt::AgentPlan& a : plan.agents) {
    nlohmann::json row = Judge(a, ReportOf(a, dir, status), links[a.name], config, options.strict);
    all_passed = all_passed && row["verdict"] != "fail";
    report["agents"].push_back(std::move(row));
  }
  report["passed"] = all_passed;
  std::fputs(
      options.json ? (report.dump(1) + "\n").c_str() : RenderReport(report, plan, dir).c_str(),
      stdout);
  return all_passed ? 0 : kExitError;
}

void RegisterCheck(CLI::App& app) {
  auto opts = std::make_shared<CheckOptions>();
  auto overrides = std::make_shared<std::vector<std::string>>();
  CLI::App* cmd = app.add_subcommand(
      "check",
      "Preflight: every agent's collectives, ports, bus, checkpoint dir and clocks, on "
      "exactly its own partition; exit 0 when all pass");
  cmd->add_option("file", opts->file, "agents.yaml")->required();
  cmd->add_option("--cluster", opts->cluster,
                  "inventory YAML with a cluster: block (e.g. fake GPUs)");
  cmd->add_option("--set", *overrides, "override a setting: key.path=value (repeatable)");
  cmd->add_flag("--strict", opts->strict, "an efficiency warning fails the check too");
  cmd->add_flag("--json", opts->json, "one JSON report instead of the table");
  cmd->add_option("--backend", opts->backend,
                  "local, or slurm: one allocation on the agents' nodes, every agent a job step");
  cmd->callback([opts, overrides] {
    auto config = agentrt::LoadConfigFile(opts->file, ConfigLoadOptions(*overrides));
    if (!config.ok()) Fail("check", config.status());
    Exit(Check(*config, *opts, "check"));
  });
}

}  // namespace agentctl
