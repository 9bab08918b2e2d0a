// `agentctl run FILE [--cluster inventory.yaml] [--set key=value]...` — plan,
// create the run directory, start the bus, launch every agent on this machine,
// supervise (restart from checkpoints), stream progress, and exit 0 only when
// every agent succeeded. The work is scheduler/run_driver.h's; this file holds
// the command line, the terminal and the signal handlers.
//
// `--backend slurm` submits one allocation (slurm/alloc_script.h) whose batch
// shell runs the hidden `--backend slurm-steps --run-dir DIR` mode: the same
// driver, with every agent launched as a job step (slurm/srun_backend.h).
#include <fmt/format.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "agent_runtime/checkpointer.h"
#include "common/clock.h"
#include "common/file_util.h"
#include "dashboard/server.h"
#include "plan/port_lease.h"
#include "plan/run_dir.h"
#include "scheduler/hostlist.h"
#include "scheduler/inventory.h"
#include "scheduler/loader.h"
#include "scheduler/local_backend.h"
#include "scheduler/node_failover.h"
#include "scheduler/planner.h"
#include "scheduler/process.h"
#include "scheduler/run_driver.h"
#include "slurm/alloc_script.h"
#include "slurm/allocation.h"
#include "slurm/command_runner.h"
#include "slurm/job_follower.h"
#include "slurm/slurm_client.h"
#include "slurm/srun_backend.h"
#include "tools/agentctl/commands.h"

namespace agentctl {
namespace {

std::atomic<int> g_stop_signals{0};
std::atomic<int> g_last_signal{0};
int last_signal_of_run = 0;  // the driver's last stop signal, once it has ended

void OnStopSignal(int sig) {
  g_last_signal.store(sig);
  g_stop_signals.fetch_add(1);
}

void InstallSignalHandlers() {
  struct sigaction sa {};
  sa.sa_handler = OnStopSignal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = 0;  // no SA_RESTART: let a blocking poll return early
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  signal(SIGPIPE, SIG_IGN);
}

// Inside a SLURM allocation: USR2 is the preemption / time-limit warning.
void InstallPreemptionHandler() {
  struct sigaction sa {};
  sa.sa_handler = OnStopSignal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = 0;
  sigaction(SIGUSR2, &sa, nullptr);
}

void Print(const std::string& s) {
  std::fputs(s.c_str(), stdout);
  std::fflush(stdout);
}

// Progress on the terminal: the table redrawn in place on a TTY, periodic plain
// tables otherwise; events (state changes) always as their own lines.
class Display final : public agentrt::RunObserver {
 public:
  Display(bool tty, double interval_s, bool quiet)
      : tty_(tty), interval_s_(interval_s), quiet_(quiet) {}

  void Warn(const std::string& text) override {
    Clear();
    std::fputs(text.c_str(), stderr);
  }

  void Progress(const agentrt::RunStatus& status, double elapsed_s, bool force) override {
    Table(status, elapsed_s, force);
  }

  void Event(const std::string& line) override {
    if (quiet_) return;
    Clear();
    Print(line + "\n");
    drawn_lines_ = 0;
  }

  void Table(const agentrt::RunStatus& status, double now_s, bool force = false) {
    if (quiet_) return;
    if (!force && now_s - last_s_ < (tty_ ? 0.5 : interval_s_)) return;
    last_s_ = now_s;
    const std::string table = agentrt::RenderStatusTable(status, tty_ ? 160 : 0);
    Clear();
    Print(table);
    if (tty_) drawn_lines_ = static_cast<int>(std::count(table.begin(), table.end(), '\n'));
  }

 private:
  void Clear() {
    if (!tty_ || drawn_lines_ == 0) return;
    std::string s;
    for (int i = 0; i < drawn_lines_; ++i) s += "\x1b[1A\x1b[2K";
    Print(s);
    drawn_lines_ = 0;
  }

  bool tty_;
  double interval_s_;
  bool quiet_;
  double last_s_ = -1e9;
  int drawn_lines_ = 0;
};

struct RunOptions {
  std::string file;
  std::string cluster;
  std::vector<std::string> overrides;
  std::string backend = "local";
  double status_interval_s = 30;
  bool quiet = false;
  std::string run_dir;  // --backend slurm-steps: the run directory made by --backend slurm
  bool detach = false;  // --backend slurm: return once submitted
  int cpus_per_rank = 1;
  bool node_steps = false;  // --backend slurm-steps: slurm.steps: node
  bool preflight = false;   // agentctl check first; start nothing when it fails
  bool notes_to_stderr =
      false;               // --backend slurm: "submitted job ..." lines on stderr (check --json)
  bool strict = false;     // --preflight --strict: its warnings fail too
  bool dashboard = false;  // run/resume: serve the dashboard on loopback while the run lasts
  std::string from;        // run --from OLD_RUN_DIR: start from that run's checkpoints
  std::string replan;      // resume --replan agents.yaml: a new plan for the run
};

// The signal handlers above, as the driver sees them.
class ProcessStops final : public agentrt::StopRequests {
 public:
  int count() const override { return g_stop_signals.load(); }
  int last_signal() const override { return g_last_signal.load(); }
};

int SubmitSlurm(const RunOptions& opts, agentrt::Config& config);
int SubmitAndFollow(const agentrt::PreparedRun& prepared, const agentrt::SlurmConfig& slurm_config,
                    const RunOptions& opts);
int RunInAllocation(const RunOptions& opts);

// The rank wrapper (plan/rank_exec.h): next to agentctl when it is there, else agentctl itself.
std::vector<std::string> RankWrapper() {
  const std::string bin_dir = agentrt::SelfExecutableDir();
  if (::access((bin_dir + "/agentrt-exec-rank").c_str(), X_OK) == 0)
    return {bin_dir + "/agentrt-exec-rank"};
  return {bin_dir + "/agentctl", "exec-rank"};
}

// `run --from OLD_RUN_DIR`: the old run's plan, read before anything of the
// new run is made (nullopt without --from).
std::optional<agentrt::Plan> ReadFromRun(const std::string& from) {
  if (from.empty()) return std::nullopt;
  const agentrt::RunDir old(std::filesystem::absolute(from).lexically_normal().string());
  auto plan = agentrt::ReadPlanFile(old.PlanPath());
  if (!plan.ok()) {
    Fail("run", plan.status().WithContext("--from " + from + ": is it a run directory?"));
  }
  return std::move(plan).value();
}

// Each agent of the new run starts from the newest verified checkpoint of the
// old run's agent of the same name: copied and verified into its own
// checkpoint directory (AdoptCheckpoint; the old run is only read, and may
// still run), re-sharded when the agent restores if its ranks changed. Bus
// positions are not carried over: the new run has a new bus. An agent the old
// run lacks, or whose checkpoints none verify, starts fresh and is named; a
// checkpoint that cannot be re-sharded to the new ranks stops the run here.
void SeedFromRun(const agentrt::Plan& old_plan, const std::string& from, const agentrt::Plan& plan,
                 const agentrt::RunDir& dir) {
  const agentrt::RunDir old(std::filesystem::absolute(from).lexically_normal().string());
  for (const agentrt::AgentPlan& agent : plan.agents) {
    const agentrt::AgentPlan* was = old_plan.FindAgent(agent.name);
    if (was == nullptr) {
      Print(fmt::format("agentctl run: --from: run {} has no agent {}; it starts fresh\n",
                        old_plan.run, agent.name));
      continue;
    }
    agentrt::AdoptOptions o;
    o.from_dir = old.Resolve(was->checkpoint_dir);
    o.from_agent = agent.name;
    o.to_dir = dir.Resolve(agent.checkpoint_dir);
    o.to_agent = agent.name;
    o.world_size = agent.ranks;
    auto adopted = agentrt::AdoptCheckpoint(o);
    if (!adopted.ok() && adopted.status().code() == agentrt::StatusCode::kNotFound) {
      Print(fmt::format("agentctl run: --from: agent {} starts fresh: {}\n", agent.name,
                        adopted.status().message()));
      continue;
    }
    if (!adopted.ok()) {
      Fail("run", adopted.status().WithContext(
                      fmt::format("--from {}: agent {} ({} ranks there, {} here)", old.path(),
                                  agent.name, was->ranks, agent.ranks)));
    }
    for (const auto& bad : adopted->skipped) {
      Print(fmt::format("agentctl run: --from: agent {}: passed over step {}: {}: {}\n", agent.name,
                        bad.step, bad.file, bad.reason));
    }
    Print(fmt::format(
        "agentctl run: --from: agent {} starts from step {} of run {}{}\n", agent.name,
        adopted->step, old_plan.run,
        was->ranks == agent.ranks
            ? ""
            : fmt::format(" (saved by {} ranks, re-sharded onto {})", was->ranks, agent.ranks)));
  }
  for (const agentrt::AgentPlan& was : old_plan.agents) {
    if (plan.FindAgent(was.name) == nullptr) {
      Print(
          fmt::format("agentctl run: --from: agent {} of run {} is not in this run; its "
                      "checkpoints stay in {}\n",
                      was.name, old_plan.run, old.Resolve(was.checkpoint_dir)));
    }
  }
}

// Drives the run to its end on this thread and returns the exit code.
int Drive(agentrt::Plan plan, agentrt::RunDir dir, agentrt::LaunchBackend* backend,
          const RunOptions& opts, agentrt::RunDriverOptions driver_options,
          std::unique_ptr<agentrt::PortLeases> leases) {
  Display display(::isatty(STDOUT_FILENO) == 1, opts.status_interval_s, opts.quiet);
  ProcessStops stops;
  // The dashboard of this run, on a free loopback port, for as long as the run lasts
  // (`agentctl dashboard RUN_DIR` serves it afterwards, or from another host).
  std::unique_ptr<agentrt::Dashboard> dashboard;
  if (opts.dashboard) {
    auto started = agentrt::Dashboard::Start(dir.path(), {});
    if (started.ok()) {
      dashboard = std::move(started).value();
      if (!opts.quiet) std::printf("dashboard: %s\n", dashboard->url().c_str());
      std::fflush(stdout);
    } else {
      std::fprintf(stderr, "agentctl run: no dashboard: %s\n", started.status().message().c_str());
    }
  }
  agentrt::RunDriver driver(std::move(plan), std::move(dir), backend, agentrt::SteadyClock(),
                            &display, &stops, std::move(driver_options), std::move(leases));
  const int code = driver.Run();
  last_signal_of_run = driver.last_signal();
  return code;
}

}  // namespace

agentrt::PreparedRun PrepareLocal(agentrt::Config& config, const std::string& file,
                                  const std::string& cluster, std::string_view command) {
  agentrt::InventoryRequest request;
  request.config_file = file;
  request.cluster_file = cluster;
  auto prepared = agentrt::PrepareRun(config, request, nullptr);
  if (!prepared.ok()) {
    Fail(command, prepared.status(),
         prepared.status().code() == agentrt::StatusCode::kResourceExhausted ? kExitInfeasible
                                                                             : kExitError);
  }
  return std::move(prepared).value();
}

namespace {

int DriveLocalWith(agentrt::PreparedRun prepared, const RunOptions& opts) {
  InstallSignalHandlers();
  agentrt::LocalBackendOptions backend_options;
  backend_options.rank_exec = RankWrapper();
  auto backend = agentrt::MakeLocalBackend(agentrt::MakePosixSpawner(), backend_options);
  return Drive(std::move(prepared.plan), std::move(prepared.dir), backend.get(), opts, {},
               std::move(prepared.leases));
}

}  // namespace

int DriveLocal(agentrt::PreparedRun prepared, bool quiet) {
  RunOptions opts;
  opts.quiet = quiet;
  return DriveLocalWith(std::move(prepared), opts);
}

namespace {

int Run(const RunOptions& opts) {
  if (opts.backend == "slurm-steps") return RunInAllocation(opts);
  if (opts.file.empty()) Fail("run", agentrt::InvalidArgument("no agents.yaml given"));
  const agentrt::LoadOptions load = ConfigLoadOptions(opts.overrides);
  auto config = agentrt::LoadConfigFile(opts.file, load);
  if (!config.ok()) Fail("run", config.status());
  if (opts.backend != "local" && opts.backend != "slurm") {
    Fail("run", agentrt::InvalidArgument("unknown backend '" + opts.backend +
                                         "'; use --backend local or --backend slurm "
                                         "(or `agentctl sbatch` for job arrays)"));
  }
  if (opts.preflight) {
    // The same agents, on the same partition, first running the checks only.
    agentrt::Config copy = *config;
    CheckOptions check;
    check.file = opts.file;
    check.cluster = opts.cluster;
    check.strict = opts.strict;
    check.backend = opts.backend == "slurm" ? "slurm" : "local";
    const int checked = Check(copy, check, "run");
    if (checked != 0) {
      std::fputs("agentctl run: the preflight check failed; nothing was started\n", stderr);
      return checked;
    }
  }
  if (opts.backend == "slurm") return SubmitSlurm(opts, *config);
  const std::optional<agentrt::Plan> from = ReadFromRun(opts.from);
  auto prepared = PrepareLocal(*config, opts.file, opts.cluster, "run");
  for (const auto& w : prepared.plan.warnings)
    std::fputs(fmt::format("agentctl run: warning: {}\n", w).c_str(), stderr);
  if (from) SeedFromRun(*from, opts.from, prepared.plan, prepared.dir);
  return DriveLocalWith(std::move(prepared), opts);
}

// A requeued allocation holds every node of its plan again (--nodelist): an
// agent that went on shrunk after a node failed (restart.elastic) gets its
// planned placement back before anything is leased or launched; its restore
// re-shards its checkpoint. The spares it holds may differ: an agent moved to
// a spare that failed since moves to a node of this allocation that no agent
// uses. plan.json is rewritten when the run starts.
void FitPlanToAllocation(agentrt::Plan& plan, const agentrt::RunDriverOptions& driver_options) {
  if (!driver_options.down_nodes) return;
  auto down = driver_options.down_nodes();
  if (!down.ok()) return;  // Drive warns that it cannot tell, at its first relaunch
  agentrt::NodeFailover failover(driver_options.allocation_nodes);
  for (const std::string& name : failover.GrowBack(plan, *down)) {
    const agentrt::AgentPlan* a = plan.FindAgent(name);
    Print(fmt::format("agentctl run: {} grows back to its {} planned ranks on {}\n", name, a->ranks,
                      a->NodeList()));
  }
  // An agent moved to a spare that failed since is not in this allocation.
  for (const auto& [name, d] : failover.PlaceStrays(plan, *down)) {
    const std::string where = fmt::format("{}: planned on {}, which this allocation does not hold",
                                          name, fmt::join(d.failed, ","));
    if (d.kind == agentrt::FailoverDecision::Kind::kMoved) {
      Print(fmt::format("agentctl run: {}: it moves to {}\n", where, fmt::join(d.moved_to, ",")));
    } else if (d.kind == agentrt::FailoverDecision::Kind::kShrunk) {
      Print(fmt::format("agentctl run: {}: {}\n", where, d.reason));
    } else {
      std::fputs(fmt::format("agentctl run: warning: {}, and {}\n", where, d.reason).c_str(),
                 stderr);
    }
  }
}

// `--backend slurm-steps`: the batch shell of the allocation. The same driver,
// every agent a job step; on USR2 (preemption, time limit) every agent
// checkpoints and the job requeues itself.
int RunInAllocation(const RunOptions& opts) {
  if (opts.run_dir.empty())
    Fail("run", agentrt::InvalidArgument("--backend slurm-steps needs --run-dir"));
  agentrt::RunDir dir(opts.run_dir);
  auto plan = agentrt::ReadPlanFile(dir.PlanPath());
  if (!plan.ok()) Fail("run", plan.status());
  const char* restarts = std::getenv("SLURM_RESTART_COUNT");
  if (restarts != nullptr && std::string(restarts) != "0") {
    Print(fmt::format(
        "agentctl run: job restart {} of run {}: resuming every agent from its checkpoint\n",
        restarts, plan->run));
  }
  const char* node_env = std::getenv("SLURMD_NODENAME");
  const std::string local_node = node_env != nullptr ? node_env : "";
  InstallSignalHandlers();
  InstallPreemptionHandler();
  auto runner = agentrt::slurm::MakeProcessRunner();
  std::string warning;
  const agentrt::RunDriverOptions driver_options = agentrt::slurm::AllocationDriverOptions(
      *plan, local_node, *runner, agentrt::ProcessEnvLookup(), &warning);
  if (!warning.empty()) std::fputs(("agentctl run: warning: " + warning + "\n").c_str(), stderr);
  // Before anything reads the placement: the GPU mapping, the MPI agents, the ports.
  FitPlanToAllocation(*plan, driver_options);
  const char* job_gpus = std::getenv("SLURM_JOB_GPUS");
  if (job_gpus != nullptr && !local_node.empty() && !plan->trust_slurm_binding) {
    warning = agentrt::slurm::MapPlanGpusOntoJob(*plan, local_node, job_gpus);
    if (!warning.empty()) std::fputs(("agentctl run: warning: " + warning + "\n").c_str(), stderr);
  }
  agentrt::slurm::SrunOptions srun;
  srun.cpus_per_rank = opts.cpus_per_rank;
  srun.rank_exec = RankWrapper();
  srun.trust_slurm_binding = plan->trust_slurm_binding;
  srun.node_steps = opts.node_steps;
  for (const agentrt::NodeSpec& n : driver_options.allocation_nodes)
    srun.allocation_nodes.push_back(n.name);
  for (const auto& a : plan->agents) {
    if (agentrt::LaunchesThroughMpi(a.backend, a.ranks)) srun.mpi_agents.push_back(a.name);
  }
  auto backend = agentrt::slurm::MakeSrunBackend(agentrt::MakePosixSpawner(), runner.get(), srun);
  // Lease the ports this node serves (the bus, its agents'); a block another
  // run holds here moves, and plan.json is rewritten with it at start.
  auto leases = agentrt::PortLeases::Open(dir.path());
  if (!leases.ok()) Fail("run", leases.status());
  const agentrt::Status leased = agentrt::LeaseRunPorts(
      *plan, plan->ports,
      [&local_node](const agentrt::AgentPlan& a) {
        return local_node.empty() ||
               (!a.placement.empty() && a.placement.front().node == local_node);
      },
      **leases);
  if (!leased.ok())
    Fail("run", leased.WithContext("cannot lease the run's ports on " + local_node));
  const int code =
      Drive(std::move(*plan), dir, backend.get(), opts, driver_options, std::move(leases).value());
  const char* job = std::getenv("SLURM_JOB_ID");
  if (last_signal_of_run == SIGUSR2 && job != nullptr) {
    // Preempted or near the time limit: every agent has checkpointed; come back.
    Print(fmt::format("agentctl run: requeueing job {}; agents resume from their checkpoints\n",
                      job));
    auto out = runner->Run({"scontrol", "requeue", job}, 60);
    if (!out.ok() || out->exit_code != 0) {
      std::fputs(fmt::format("agentctl run: scontrol requeue {} failed: {}\n", job,
                             out.ok() ? out->err : out.status().message())
                     .c_str(),
                 stderr);
      return code;
    }
    return 0;
  }
  return code;
}

// `--backend slurm`: plan on the live cluster, write and submit the allocation,
// then follow the run through RUN_DIR/status.json (or return at once with --detach).
int SubmitSlurm(const RunOptions& opts, agentrt::Config& config) {
  const std::optional<agentrt::Plan> from = ReadFromRun(opts.from);
  agentrt::PreparedRun prepared = PrepareOnSlurm(config, opts.file, opts.cluster, "run");
  for (const auto& w : prepared.plan.warnings)
    std::fputs(fmt::format("agentctl run: warning: {}\n", w).c_str(), stderr);
  if (from) SeedFromRun(*from, opts.from, prepared.plan, prepared.dir);
  return SubmitAndFollow(prepared, config.slurm, opts);
}

}  // namespace

agentrt::PreparedRun PrepareOnSlurm(agentrt::Config& config, const std::string& file,
                                    const std::string& cluster, std::string_view command) {
  auto runner = agentrt::slurm::MakeProcessRunner();
  agentrt::slurm::SlurmClient slurm(*runner);
  agentrt::InventoryRequest request;
  request.config_file = file;
  request.cluster_file = cluster;
  request.live_slurm = true;
  agentrt::PrepareOptions prepare;
  prepare.lease_ports = false;  // the allocation's controller leases them on its node
  auto prepared = agentrt::PrepareRun(
      config, request, [&slurm] { return slurm.ShowNodesText(); }, prepare);
  if (!prepared.ok()) {
    const bool infeasible = prepared.status().code() == agentrt::StatusCode::kResourceExhausted;
    Fail(command,
         infeasible ? prepared.status().WithContext("nothing submitted") : prepared.status(),
         infeasible ? kExitInfeasible : kExitError);
  }
  return std::move(prepared).value();
}

int SubmitAndFollow(const agentrt::PreparedRun& prepared, const agentrt::SlurmConfig& slurm_config,
                    bool quiet) {
  RunOptions opts;
  opts.quiet = quiet;
  opts.notes_to_stderr = quiet;
  return SubmitAndFollow(prepared, slurm_config, opts);
}

namespace {

int SubmitAndFollow(const agentrt::PreparedRun& prepared, const agentrt::SlurmConfig& slurm_config,
                    const RunOptions& opts) {
  auto runner = agentrt::slurm::MakeProcessRunner();
  agentrt::slurm::SlurmClient slurm(*runner);
  const agentrt::RunDir& dir = prepared.dir;
  const agentrt::Plan& plan = prepared.plan;
  agentrt::slurm::AllocScriptOptions script_options;
  script_options.run_dir = dir.path();
  script_options.agentctl_path = agentrt::SelfExecutableDir() + "/agentctl";
  script_options.cpus_per_rank = opts.cpus_per_rank;
  auto job = agentrt::slurm::SubmitAllocation(slurm, plan, slurm_config, dir, script_options);
  if (!job.ok()) Fail("run", job.status());
  auto note = [&opts](const std::string& line) {
    if (opts.notes_to_stderr) {
      std::fputs(line.c_str(), stderr);
    } else {
      Print(line);
    }
  };
  note(fmt::format("run {}: submitted job {} ({} agents), run dir {}\n", plan.run, *job,
                   plan.agents.size(), dir.path()));
  if (opts.detach) {
    Print(
        fmt::format("follow with: agentctl status {}; stop with: scancel {}\n", dir.path(), *job));
    return 0;
  }

  InstallSignalHandlers();
  Display display(::isatty(STDOUT_FILENO) == 1, opts.status_interval_s, opts.quiet);
  agentrt::slurm::FollowHooks hooks;
  hooks.stop_requests = [] { return g_stop_signals.load(); };
  hooks.on_status = [&display](const agentrt::RunStatus& s, double t) { display.Table(s, t); };
  hooks.on_event = [&display](const std::string& line) { display.Event(line); };
  const agentrt::Clock* clock = agentrt::SteadyClock();
  const double t0 = clock->NowSeconds();
  const int exit_code = agentrt::slurm::FollowJob(slurm, *job, dir, *clock, hooks);
  auto final_status = agentrt::ReadRunStatusFile(dir.StatusPath());
  if (final_status.ok()) display.Table(*final_status, clock->NowSeconds() - t0, /*force=*/true);
  note(fmt::format("run {} job {} ended with exit code {}; status: agentctl status {}\n", plan.run,
                   *job, exit_code, dir.path()));
  return exit_code;
}

}  // namespace

// `resume --replan agents.yaml`: the run's new plan from the changed config,
// in the same run directory (the run keeps its name, secret, CA, bus log and
// checkpoint directories, which are by agent name). An agent whose ranks,
// GPUs or GPU type changed restores its newest checkpoint re-sharded: that it
// can is checked here, before anything starts. An agent new to the config
// starts fresh; one gone from it is named and its checkpoints stay.
agentrt::PreparedRun Replan(const agentrt::Plan& old, const agentrt::RunDir& dir,
                            const std::string& file) {
  auto config = agentrt::LoadConfigFile(file, ConfigLoadOptions({}));
  if (!config.ok()) Fail("resume", config.status());
  agentrt::InventoryRequest request;
  request.config_file = file;
  auto prepared = agentrt::PrepareReplan(*config, request, dir, old.run);
  if (!prepared.ok()) {
    Fail("resume", prepared.status().WithContext("--replan " + file),
         prepared.status().code() == agentrt::StatusCode::kResourceExhausted ? kExitInfeasible
                                                                             : kExitError);
  }
  for (const agentrt::AgentPlan& agent : prepared->plan.agents) {
    const agentrt::AgentPlan* was = old.FindAgent(agent.name);
    if (was == nullptr) {
      Print(
          fmt::format("agentctl resume: --replan: agent {} is new; it starts fresh\n", agent.name));
      continue;
    }
    const bool same_shape =
        was->ranks == agent.ranks && was->gpus == agent.gpus && was->gpu_type == agent.gpu_type;
    if (same_shape) continue;
    // Its newest checkpoint must restore at the new size: rank 0 tries (and
    // reads only its own shard; the agent's ranks verify every one).
    agentrt::CheckpointOptions o{.dir = dir.Resolve(agent.checkpoint_dir),
                                 .agent = agent.name,
                                 .rank = 0,
                                 .world_size = agent.ranks,
                                 .interval_s = 0,
                                 .verify_all_shards = false};
    auto checkpointer = agentrt::Checkpointer::Create(o);
    auto restored = checkpointer.ok()
                        ? (*checkpointer)->Restore()
                        : agentrt::Result<agentrt::RestoreResult>(checkpointer.status());
    if (!restored.ok()) {
      Fail("resume", restored.status().WithContext(
                         fmt::format("--replan: agent {} ({} ranks planned before, {} now)",
                                     agent.name, was->ranks, agent.ranks)));
    }
    Print(fmt::format(
        "agentctl resume: --replan: agent {}: {} rank(s), {} GPU(s){} before; {} rank(s), {} "
        "GPU(s){} now; {}\n",
        agent.name, was->ranks, was->gpus, was->gpu_type.empty() ? "" : " " + was->gpu_type,
        agent.ranks, agent.gpus, agent.gpu_type.empty() ? "" : " " + agent.gpu_type,
        restored->restored()
            ? fmt::format("its checkpoint of step {} (saved by {} ranks) is re-sharded",
                          restored->step, restored->world_size)
            : std::string("it has no checkpoint to restore")));
  }
  for (const agentrt::AgentPlan& was : old.agents) {
    if (prepared->plan.FindAgent(was.name) == nullptr) {
      Print(
          fmt::format("agentctl resume: --replan: agent {} is no longer in the config; its "
                      "checkpoints stay in {}\n",
                      was.name, dir.Resolve(was.checkpoint_dir)));
    }
  }
  return std::move(prepared).value();
}

// `agentctl resume RUN_DIR`: continue a local run whose controller died.
int Resume(const std::string& run_dir_path, const RunOptions& opts) {
  const agentrt::RunDir dir(std::filesystem::absolute(run_dir_path).lexically_normal().string());
  if (agentrt::ControllerRunning(dir.path())) {
    Fail("resume", agentrt::FailedPrecondition(
                       fmt::format("run {} still has a live controller (pid {}); nothing to resume",
                                   dir.path(), agentrt::LiveControllerPid(dir.path()))));
  }
  if (std::filesystem::exists(dir.SlurmJobIdPath())) {
    Fail("resume", agentrt::FailedPrecondition(
                       "run " + dir.path() +
                       " runs on SLURM: its allocation resumes itself on requeue (scontrol requeue "
                       "JOBID), or start it again with agentctl run --backend slurm"));
  }
  auto plan = agentrt::ReadPlanFile(dir.PlanPath());
  if (!plan.ok())
    Fail("resume", plan.status().WithContext("is " + dir.path() + " a run directory?"));
  agentrt::RunDriverOptions driver_options;
  if (auto previous = agentrt::ReadRunStatusFile(dir.StatusPath()); previous.ok()) {
    if (previous->state == agentrt::RunState::kSucceeded ||
        previous->state == agentrt::RunState::kFailed) {
      Fail("resume", agentrt::FailedPrecondition(
                         fmt::format("run {} already {}; nothing to resume", previous->run,
                                     agentrt::RunStateName(previous->state))));
    }
    driver_options.resume_from = *previous;
  }
  std::unique_ptr<agentrt::PortLeases> leases;
  if (!opts.replan.empty()) {
    agentrt::PreparedRun replanned = Replan(*plan, dir, opts.replan);
    *plan = std::move(replanned.plan);
    leases = std::move(replanned.leases);
  } else {
    // The ports again: the same blocks unless another run took them meanwhile.
    auto opened = agentrt::PortLeases::Open(dir.path());
    if (!opened.ok()) Fail("resume", opened.status());
    const agentrt::Status leased = agentrt::LeaseRunPorts(
        *plan, plan->ports, [](const agentrt::AgentPlan&) { return true; }, **opened);
    if (!leased.ok()) Fail("resume", leased.WithContext("cannot lease the run's ports"));
    leases = std::move(opened).value();
  }
  Print(
      fmt::format("agentctl resume: run {} in {}: every unfinished agent resumes from its "
                  "newest checkpoint\n",
                  plan->run, dir.path()));
  InstallSignalHandlers();
  agentrt::LocalBackendOptions backend_options;
  backend_options.rank_exec = RankWrapper();
  auto backend = agentrt::MakeLocalBackend(agentrt::MakePosixSpawner(), backend_options);
  return Drive(std::move(*plan), dir, backend.get(), opts, std::move(driver_options),
               std::move(leases));
}

void RegisterResume(CLI::App& app) {
  auto opts = std::make_shared<RunOptions>();
  auto run_dir = std::make_shared<std::string>();
  CLI::App* cmd = app.add_subcommand(
      "resume",
      "Continue a local run whose controller died: same plan and run directory, unfinished "
      "agents from their newest checkpoints");
  cmd->add_option("run_dir", *run_dir, "the run directory")->required();
  cmd->add_option("--status-interval-s", opts->status_interval_s,
                  "seconds between progress tables when stdout is not a terminal");
  cmd->add_flag("--quiet", opts->quiet, "no progress output; only the summary");
  cmd->add_option("--replan", opts->replan,
                  "plan the run anew from this (changed) agents.yaml: agents whose ranks or GPUs "
                  "changed restore their checkpoints re-sharded");
  opts->dashboard = true;
  cmd->add_flag("!--no-dashboard", opts->dashboard, "do not serve the dashboard while it runs");
  cmd->callback([opts, run_dir] { Exit(Resume(*run_dir, *opts)); });
}

void RegisterRun(CLI::App& app) {
  auto opts = std::make_shared<RunOptions>();
  CLI::App* cmd = app.add_subcommand(
      "run", "Plan, start the bus, launch and supervise every agent; exit 0 when all succeeded");
  cmd->add_option("file", opts->file, "agents.yaml");
  cmd->add_option("--cluster", opts->cluster,
                  "inventory YAML with a cluster: block (e.g. fake GPUs)");
  cmd->add_option("--set", opts->overrides, "override a setting: key.path=value (repeatable)");
  cmd->add_option("--from", opts->from,
                  "start every agent from the newest verified checkpoint of the agent of the "
                  "same name in this earlier run directory (re-sharded when its ranks changed)");
  cmd->add_option("--backend", opts->backend,
                  "launch backend: local, or slurm (one allocation, every agent a job step)");
  cmd->add_flag("--detach", opts->detach,
                "--backend slurm: return once the allocation is submitted");
  cmd->add_option("--cpus-per-rank", opts->cpus_per_rank, "--backend slurm: CPUs of every rank")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--run-dir", opts->run_dir, "")->group("");      // hidden: --backend slurm-steps
  cmd->add_flag("--node-steps", opts->node_steps, "")->group("");  // hidden: slurm.steps: node
  cmd->add_option("--status-interval-s", opts->status_interval_s,
                  "seconds between progress tables when stdout is not a terminal");
  cmd->add_flag("--quiet", opts->quiet, "no progress output; only the summary");
  cmd->add_flag("--preflight", opts->preflight,
                "run `agentctl check` on the same partition (and backend) first; start nothing "
                "if it fails");
  cmd->add_flag("--strict", opts->strict, "with --preflight: its warnings fail too");
  opts->dashboard = true;
  cmd->add_flag("!--no-dashboard", opts->dashboard,
                "do not serve the dashboard (on a free loopback port) while it runs");
  cmd->callback([opts] { Exit(Run(*opts)); });
}

}  // namespace agentctl
