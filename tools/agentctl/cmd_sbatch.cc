// `agentctl sbatch FILE -o DIR` — the plan as sbatch scripts (one job array per
// resource shape, the bus as its own job) for users who submit by hand; and
// `agentctl array-task`, what each rank of those array tasks runs. See
// slurm/sbatch_writer.h and slurm/array_task.h.
#include <fmt/format.h>
#include <unistd.h>

#include <climits>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "scheduler/inventory.h"
#include "scheduler/loader.h"
#include "scheduler/planner.h"
#include "slurm/array_task.h"
#include "slurm/command_runner.h"
#include "slurm/sbatch_writer.h"
#include "slurm/slurm_client.h"
#include "tools/agentctl/commands.h"

namespace agentctl {
namespace {

namespace fs = std::filesystem;

// This agentctl's own path: the scripts call it on the compute nodes.
std::string SelfPath() {
  char buf[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
  return n > 0 ? std::string(buf, static_cast<size_t>(n)) : std::string("agentctl");
}

void Print(const std::string& text) { std::fputs(text.c_str(), stdout); }

}  // namespace

namespace {

// `agentctl sbatch`'s flags.
struct SbatchCommand {
  std::string file;
  std::string out_dir;
  std::string cluster;
  std::string bus_path;
  std::vector<std::string> overrides;
  int cpus_per_rank = 1;
  double bus_wait_s = 300;
  bool submit = false;
};

// Plans, writes the run directory's scripts, and submits them with --submit.
void Sbatch(const SbatchCommand& opts) {
  const agentrt::LoadOptions load = ConfigLoadOptions(opts.overrides);
  agentrt::Result<agentrt::Config> config = agentrt::LoadConfigFile(opts.file, load);
  if (!config.ok()) Fail("sbatch", config.status());

  auto runner = agentrt::slurm::MakeProcessRunner();
  agentrt::slurm::SlurmClient slurm(*runner);
  agentrt::InventoryRequest request;
  request.config_file = opts.file;
  request.cluster_file = opts.cluster;
  request.fallback = agentrt::InventoryRequest::Fallback::kSlurm;
  agentrt::Result<agentrt::Inventory> inventory =
      agentrt::ResolveInventory(*config, request, [&slurm] { return slurm.ShowNodesText(); });
  if (!inventory.ok()) Fail("sbatch", inventory.status());

  std::error_code ec;
  fs::path run_dir = fs::weakly_canonical(fs::absolute(opts.out_dir), ec);
  if (ec)
    Fail("sbatch", agentrt::InvalidArgument(
                       fmt::format("output directory {}: {}", opts.out_dir, ec.message())));

  agentrt::Plan plan = PlanOrFail("sbatch", *config, *inventory, run_dir.string());
  for (const std::string& w : plan.warnings) {
    std::fputs(fmt::format("agentctl sbatch: warning: {}\n", w).c_str(), stderr);
  }

  agentrt::slurm::SbatchOptions sbatch;
  sbatch.run_dir = run_dir.string();
  sbatch.agentctl_path = SelfPath();
  sbatch.bus_path = opts.bus_path.empty()
                        ? (fs::path(sbatch.agentctl_path).parent_path() / "agentrt-bus").string()
                        : fs::absolute(opts.bus_path).string();
  sbatch.bus_wait_s = opts.bus_wait_s;
  sbatch.cpus_per_rank = opts.cpus_per_rank;
  if (!fs::exists(sbatch.bus_path)) {
    std::fputs(
        fmt::format(
            "agentctl sbatch: warning: {} does not exist here; the bus job needs it on its node "
            "(give --bus PATH)\n",
            sbatch.bus_path)
            .c_str(),
        stderr);
  }
  auto written = agentrt::slurm::WriteSbatchRun(std::move(plan), *config, sbatch);
  if (!written.ok()) Fail("sbatch", written.status());

  Print(fmt::format("wrote {}:\n  bus.sbatch  the message bus\n", sbatch.run_dir));
  for (const auto& array : written->arrays) {
    std::string agents;
    for (const auto& a : array.agents) agents += (agents.empty() ? "" : " ") + a;
    Print(
        fmt::format("  {}  --array=0-{}: {}\n", array.file_name, array.agents.size() - 1, agents));
  }
  Print("  done.sbatch  stops the bus when every array task has ended\n");
  if (!opts.submit) {
    Print(fmt::format("submit with: {}/submit.sh\n", sbatch.run_dir));
    return;
  }
  auto out = runner->Run({"bash", sbatch.run_dir + "/submit.sh"}, 300);
  if (!out.ok()) Fail("sbatch", out.status());
  Print(out->out);
  if (out->exit_code != 0) {
    Fail("sbatch", agentrt::Unavailable(fmt::format("{}/submit.sh failed with exit code {}: {}",
                                                    sbatch.run_dir, out->exit_code, out->err)));
  }
}

}  // namespace

void RegisterSbatch(CLI::App& app) {
  auto opts = std::make_shared<SbatchCommand>();
  CLI::App* cmd = app.add_subcommand("sbatch",
                                     "Write sbatch scripts for the plan: one job array per "
                                     "resource shape, the bus as its own job");
  cmd->add_option("file", opts->file, "agents.yaml")->required();
  cmd->add_option("-o,--output", opts->out_dir,
                  "run directory to write (scripts, plan.json, secrets/, logs/)")
      ->required();
  cmd->add_option(
      "--cluster", opts->cluster,
      "inventory YAML with a cluster: block (default: the config's cluster, else the live SLURM "
      "cluster from `scontrol show node -o`)");
  cmd->add_option("--set", opts->overrides, "override a setting: key.path=value (repeatable)");
  cmd->add_option("--cpus-per-rank", opts->cpus_per_rank,
                  "sbatch --cpus-per-task of every array task")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  cmd->add_option("--bus-wait", opts->bus_wait_s, "seconds an array task waits for the bus address")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  cmd->add_option("--bus", opts->bus_path,
                  "path of agentrt-bus on the compute nodes (default: next to agentctl)");
  cmd->add_flag("--submit", opts->submit, "also run the generated submit.sh");
  cmd->callback([opts] { Sbatch(*opts); });
}

void RegisterArrayTask(CLI::App& app) {
  struct Options {
    std::string run_dir;
    std::string agent;
  };
  auto opts = std::make_shared<Options>();
  CLI::App* cmd = app.add_subcommand("array-task",
                                     "Run one rank of an agent inside a job-array task (called by "
                                     "the scripts of `agentctl sbatch`)");
  cmd->add_option("--run-dir", opts->run_dir, "run directory holding plan.json and bus.address")
      ->required();
  cmd->add_option("--agent", opts->agent, "the agent this array task runs")->required();
  cmd->callback([opts] {
    // Returns only when the agent's command could not be started.
    agentrt::Status s = agentrt::slurm::ExecArrayTask(opts->run_dir, opts->agent, SelfPath());
    Fail("array-task", s);
  });
}

}  // namespace agentctl
