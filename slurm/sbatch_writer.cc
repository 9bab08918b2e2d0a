#include "slurm/sbatch_writer.h"

#include <fmt/format.h>
#include <sys/stat.h>

#include <cerrno>
#include <filesystem>
#include <map>
#include <set>

#include "common/file_util.h"
#include "comms/auth.h"
#include "comms/run_ca.h"
#include "plan/port_lease.h"
#include "plan/run_dir.h"
#include "slurm/command_runner.h"

namespace agentrt::slurm {
namespace {

namespace fs = std::filesystem;

// A word for bash: quoted only when it needs to be (same rules as FormatCommand).
std::string Quote(const std::string& word) { return FormatCommand({word}); }

// A value that goes into an `#SBATCH --key=value` line: one line, and one
// word (sbatch splits the line on whitespace).
Status CheckSbatchWord(const std::string& what, const std::string& value) {
  if (value.find_first_of(" \t\r\n\"'\\") != std::string::npos) {
    return InvalidArgument(
        fmt::format("slurm: {} '{}' cannot go into an #SBATCH line (whitespace, quote or "
                    "backslash)",
                    what, value));
  }
  return Status::Ok();
}

// The #SBATCH lines every job of the run shares: partition, account, qos,
// time, constraint and the user's extra arguments.
Result<std::string> CommonDirectives(const SlurmConfig& slurm) {
  std::string out;
  auto add = [&out](const std::string& what, const std::string& flag,
                    const std::string& value) -> Status {
    if (value.empty()) return Status::Ok();
    AGENTRT_RETURN_IF_ERROR(CheckSbatchWord(what, value));
    out += fmt::format("#SBATCH {}={}\n", flag, value);
    return Status::Ok();
  };
  AGENTRT_RETURN_IF_ERROR(add("slurm.partition", "--partition", slurm.partition));
  AGENTRT_RETURN_IF_ERROR(add("slurm.account", "--account", slurm.account));
  AGENTRT_RETURN_IF_ERROR(add("slurm.qos", "--qos", slurm.qos));
  AGENTRT_RETURN_IF_ERROR(add("slurm.time", "--time", slurm.time));
  AGENTRT_RETURN_IF_ERROR(add("slurm.constraint", "--constraint", slurm.constraint));
  for (const std::string& extra : slurm.extra_args) {
    AGENTRT_RETURN_IF_ERROR(CheckSbatchWord("slurm.extra_args entry", extra));
    out += fmt::format("#SBATCH {}\n", extra);
  }
  return out;
}

std::string Join(const std::vector<std::string>& words, const std::string& sep) {
  std::string out;
  for (const auto& w : words) out += (out.empty() ? "" : sep) + w;
  return out;
}

Status MakeDir(const fs::path& path, fs::perms mode) {
  std::error_code ec;
  fs::create_directories(path, ec);
  if (ec)
    return Internal(fmt::format("cannot create directory {}: {}", path.string(), ec.message()));
  fs::permissions(path, mode, fs::perm_options::replace, ec);
  if (ec) return Internal(fmt::format("chmod {}: {}", path.string(), ec.message()));
  return Status::Ok();
}

}  // namespace

std::string ResourceShape::Name() const {
  std::string name = gpus_per_node > 0 ? fmt::format("gpu{}-rank{}", gpus_per_node * nodes, ranks)
                                       : fmt::format("cpu-rank{}", ranks);
  if (nodes > 1) name += fmt::format("-node{}", nodes);
  if (!gpu_type.empty()) name += "-" + gpu_type;
  return name;
}

Result<ResourceShape> ShapeOf(const AgentPlan& agent) {
  ResourceShape shape;
  shape.nodes = agent.placement.empty() ? 1 : static_cast<int>(agent.placement.size());
  shape.ranks = agent.ranks;
  if (agent.ranks < 1)
    return InvalidArgument(fmt::format("agent {}: {} ranks", agent.name, agent.ranks));
  if (agent.ranks % shape.nodes != 0 || agent.gpus % shape.nodes != 0) {
    return InvalidArgument(
        fmt::format("agent {}: {} ranks and {} GPUs do not divide evenly over its {} nodes; a "
                    "job array needs the same tasks and GPUs on every node",
                    agent.name, agent.ranks, agent.gpus, shape.nodes));
  }
  shape.gpus_per_node = agent.gpus / shape.nodes;
  shape.gpu_type = agent.gpu_type;
  return shape;
}

Status MakePortsRunUnique(Plan& plan, const PortConfig& ports) {
  if (ports.per_agent < 1) return InvalidArgument("cluster.ports.per_agent must be at least 1");
  std::vector<std::pair<int, int>> taken;  // [first, last] of kept blocks
  auto overlaps = [&taken](int first, int last) {
    for (auto [f, l] : taken)
      if (first <= l && f <= last) return true;
    return false;
  };
  if (plan.bus.port > 0) taken.emplace_back(plan.bus.port, plan.bus.port);
  std::vector<AgentPlan*> moved;
  for (AgentPlan& agent : plan.agents) {
    if (agent.ports.first > 0 && !overlaps(agent.ports.first, agent.ports.last)) {
      taken.emplace_back(agent.ports.first, agent.ports.last);
    } else {
      moved.push_back(&agent);
    }
  }
  int next = ports.first;
  for (AgentPlan* agent : moved) {
    while (next + ports.per_agent - 1 <= ports.last && overlaps(next, next + ports.per_agent - 1))
      ++next;
    if (next + ports.per_agent - 1 > ports.last) {
      return ResourceExhausted(
          fmt::format("agent {}: no free block of {} ports left in {}-{} for a job-array run "
                      "(every agent needs its own block run-wide); widen cluster.ports",
                      agent->name, ports.per_agent, ports.first, ports.last));
    }
    agent->master_port =
        MovedMasterPort(agent->master_port, agent->ports.first, next, next + ports.per_agent - 1);
    agent->ports.first = next;
    agent->ports.last = next + ports.per_agent - 1;
    taken.emplace_back(agent->ports.first, agent->ports.last);
  }
  return Status::Ok();
}

namespace {

// What every script of a run's set shares.
struct ScriptContext {
  const Plan& plan;
  const SlurmConfig& slurm;
  const SbatchOptions& options;
  RunDir layout;
  std::string run_dir;  // quoted for the shell
  std::string logs;
  std::string common;  // the #SBATCH lines of slurm.* every job gets
};

// The bus job: the message bus on a free port of whichever node SLURM gives it.
std::string BusScript(const ScriptContext& c) {
  const Plan& plan = c.plan;
  const SbatchOptions& options = c.options;
  const RunDir& layout = c.layout;
  const std::string &run_dir = c.run_dir, &logs = c.logs, &common = c.common;
  return fmt::format(
      R"sh(#!/bin/bash
# agentrt run "{run}": the message bus, as its own small job.
# It listens on a free port of whichever node SLURM gives it and writes its
# host:port to RUN_DIR/bus.address; the array tasks wait for that file.
# Agents authenticate with tokens derived from RUN_DIR/secrets/run.secret (0600);
# the secret itself is never in this script or in any job's environment.
# Generated by `agentctl sbatch`.
#SBATCH --job-name={run}-bus
#SBATCH --ntasks=1
#SBATCH --cpus-per-task=1
#SBATCH --output={logs}/%x-%j.out
#SBATCH --open-mode=append
{common}set -euo pipefail
RUN_DIR={run_dir}

# An address left by an earlier bus would send agents to the wrong place.
rm -f {address}
# Advertise this node's address as SLURM knows it (NodeAddr): node names need
# not resolve on every node. Without scontrol's answer, the host name.
addr=$(scontrol show node "${{SLURMD_NODENAME:-}}" -o 2>/dev/null | grep -o 'NodeAddr=[^ ]*' | cut -d= -f2 || true)
exec {bus} --plan {plan} --secret-file {secret} \
  --port 0 --address-file {address} ${{addr:+--advertise-host "$addr"}}
)sh",
      fmt::arg("run", plan.run), fmt::arg("logs", logs), fmt::arg("common", common),
      fmt::arg("run_dir", run_dir), fmt::arg("bus", Quote(options.bus_path)),
      fmt::arg("plan", Quote(layout.PlanPath())), fmt::arg("secret", Quote(layout.SecretPath())),
      fmt::arg("address", Quote(layout.BusAddressPath())));
}

// One job array: a task per agent of `array`'s resource shape.
std::string ArrayScript(const ScriptContext& c, const ArrayJob& array) {
  const Plan& plan = c.plan;
  const SlurmConfig& slurm = c.slurm;
  const SbatchOptions& options = c.options;
  const RunDir& layout = c.layout;
  const std::string &run_dir = c.run_dir, &logs = c.logs, &common = c.common;
  const ResourceShape& s = array.shape;
  std::string resources =
      fmt::format("#SBATCH --nodes={}\n#SBATCH --ntasks={}\n", s.nodes, s.ranks);
  if (s.nodes > 1) resources += fmt::format("#SBATCH --ntasks-per-node={}\n", s.ranks / s.nodes);
  resources += fmt::format("#SBATCH --cpus-per-task={}\n", options.cpus_per_rank);
  if (s.gpus_per_node > 0) {
    resources += fmt::format("#SBATCH --gres=gpu:{}{}\n",
                             s.gpu_type.empty() ? "" : s.gpu_type + ":", s.gpus_per_node);
  }
  // MPI agents need SLURM's PMIx to wire up MPI_Init under srun.
  bool mpi = false;
  for (const std::string& name : array.agents) {
    const AgentPlan* agent = plan.FindAgent(name);
    mpi |= LaunchesThroughMpi(agent->backend, agent->ranks);
  }
  std::vector<std::string> quoted;
  for (const std::string& name : array.agents) quoted.push_back(Quote(name));
  std::string gpus_text =
      s.gpus_per_node > 0 ? fmt::format("{} GPU(s) per node", s.gpus_per_node) : "no GPU";
  return fmt::format(
      R"sh(#!/bin/bash
# agentrt run "{run}": job array "{shape}": {count} agent(s), each {ranks} rank(s)
# on {nodes} node(s) with {gpus_text}. Array task i runs agent AGENTS[i].
# Its ports, checkpoint directory, command and environment come from the plan
# (RUN_DIR/plan.json) through `agentctl array-task`; SLURM picks the node and
# the GPUs (CUDA_VISIBLE_DEVICES). The agent's bus credential is the 0600 file
# RUN_DIR/secrets/<agent>.token: no secret is in this script or its environment.
# Before the time limit (or on preemption) SLURM sends USR2: the agent
# checkpoints and exits, and this task requeues itself; on restart
# (SLURM_RESTART_COUNT > 0) the agent resumes from its checkpoint.
# Generated by `agentctl sbatch`.
#SBATCH --job-name={run}-{shape}
#SBATCH --array=0-{last}
{resources}#SBATCH --signal=B:USR2@{grace}
#SBATCH --requeue
#SBATCH --output={logs}/%x-%A_%a.out
#SBATCH --open-mode=append
{common}set -uo pipefail
RUN_DIR={run_dir}
AGENTCTL={agentctl}
AGENTS=({agents})
BUS_WAIT_S={bus_wait}

agent=${{AGENTS[$SLURM_ARRAY_TASK_ID]}}
echo "agentrt: array task ${{SLURM_ARRAY_JOB_ID}}_${{SLURM_ARRAY_TASK_ID}} runs agent $agent (restart ${{SLURM_RESTART_COUNT:-0}})"

# The bus job writes its host:port to bus.address once it listens; look
# every 0.1 s (ticks), give up after BUS_WAIT_S.
ticks=0
until [ -s {address} ]; do
  if [ "$ticks" -ge $((BUS_WAIT_S * 10)) ]; then
    echo "agentrt: agent $agent: the bus did not publish its address in "{address}" within" \
      "$BUS_WAIT_S s; is the bus job $(cat "$RUN_DIR/bus.jobid" 2>/dev/null) running? See $RUN_DIR/logs/{run}-bus-*.out" >&2
    exit 1
  fi
  sleep 0.1
  ticks=$((ticks + 1))
done

# USR2 (time limit, preemption): pass it on to the agent's ranks, which
# checkpoint and exit; then requeue this array task.
preempted=0
step=
trap 'preempted=1; [ -n "$step" ] && kill -USR2 "$step" 2>/dev/null' USR2

# The task's one step. --overlap: when a busy slurmctld answers the step's
# creation too late, srun asks again, and without it would wait for ever for
# the CPUs of the step it had in fact created.
srun --overlap --kill-on-bad-exit=1{mpi} "$AGENTCTL" array-task --run-dir "$RUN_DIR" --agent "$agent" &
step=$!
wait "$step"
rc=$?
while kill -0 "$step" 2>/dev/null; do  # `wait` returns early when the trap runs
  wait "$step"
  rc=$?
done

if [ "$preempted" = 1 ]; then
  echo "agentrt: agent $agent stopped after USR2 (exit $rc); requeueing ${{SLURM_ARRAY_JOB_ID}}_${{SLURM_ARRAY_TASK_ID}}"
  scontrol requeue "${{SLURM_ARRAY_JOB_ID}}_${{SLURM_ARRAY_TASK_ID}}"
fi
exit "$rc"
)sh",
      fmt::arg("run", plan.run), fmt::arg("shape", s.Name()),
      fmt::arg("count", array.agents.size()), fmt::arg("ranks", s.ranks),
      fmt::arg("nodes", s.nodes), fmt::arg("gpus_text", gpus_text),
      fmt::arg("last", array.agents.size() - 1), fmt::arg("resources", resources),
      fmt::arg("grace", slurm.signal_grace_s), fmt::arg("logs", logs), fmt::arg("common", common),
      fmt::arg("run_dir", run_dir), fmt::arg("agentctl", Quote(options.agentctl_path)),
      fmt::arg("agents", Join(quoted, " ")),
      fmt::arg("bus_wait", static_cast<long long>(options.bus_wait_s)),
      fmt::arg("mpi", mpi ? " --mpi=pmix" : ""),
      fmt::arg("address", Quote(layout.BusAddressPath())));
}

// The job that stops the bus once every array task has ended.
std::string DoneScript(const ScriptContext& c) {
  const Plan& plan = c.plan;
  const std::string &logs = c.logs, &common = c.common;
  return fmt::format(
      R"sh(#!/bin/bash
# agentrt run "{run}": stops the bus job (its id is the argument) once every
# array task of the run has ended (submit.sh gives this job an afterany
# dependency on all the arrays). Generated by `agentctl sbatch`.
#SBATCH --job-name={run}-done
#SBATCH --ntasks=1
#SBATCH --cpus-per-task=1
#SBATCH --output={logs}/%x-%j.out
{common}set -euo pipefail
echo "agentrt: every agent of run {run} has ended; stopping the bus job $1"
scancel "$1"
)sh",
      fmt::arg("run", plan.run), fmt::arg("logs", logs), fmt::arg("common", common));
}

// submit.sh: the bus job, the arrays after it, the cleanup job after them.
std::string SubmitScript(const ScriptContext& c, const std::vector<ArrayJob>& arrays) {
  const Plan& plan = c.plan;
  const std::string& run_dir = c.run_dir;
  std::string submits;
  std::vector<std::string> array_vars;   // inside a double-quoted string
  std::vector<std::string> quoted_vars;  // as words of a command
  for (size_t i = 0; i < arrays.size(); ++i) {
    submits += fmt::format("a{}=$(submit --dependency=after:\"$bus\" \"$RUN_DIR/{}\")  # {}\n", i,
                           arrays[i].file_name, Join(arrays[i].agents, " "));
    array_vars.push_back(fmt::format("$a{}", i));
    quoted_vars.push_back(fmt::format("\"$a{}\"", i));
  }
  return fmt::format(
      R"sh(#!/bin/bash
# Submits agentrt run "{run}": the bus job, then one job array per resource
# shape (each may start once the bus job has started; its tasks then wait for
# bus.address), then a job that stops the bus when every array task has ended.
# Job ids go to RUN_DIR/bus.jobid and RUN_DIR/arrays.jobids.
# Generated by `agentctl sbatch`.
set -euo pipefail
RUN_DIR={run_dir}

submit() {{  # sbatch --parsable prints "id" or "id;cluster"
  local out
  out=$(sbatch --parsable "$@")
  echo "${{out%%;*}}"
}}

rm -f "$RUN_DIR/bus.address"
bus=$(submit "$RUN_DIR/bus.sbatch")
echo "$bus" >"$RUN_DIR/bus.jobid"
{submits}echo {quoted_vars} >"$RUN_DIR/arrays.jobids"
done_job=$(submit --dependency=afterany:{array_deps} "$RUN_DIR/done.sbatch" "$bus")
echo "agentrt: submitted run {run}: bus job $bus, job arrays {array_vars}, cleanup job $done_job"
echo "agentrt: follow with: squeue -j $bus,{array_list}; logs in $RUN_DIR/logs"
)sh",
      fmt::arg("run", plan.run), fmt::arg("run_dir", run_dir), fmt::arg("submits", submits),
      fmt::arg("array_vars", Join(array_vars, " ")),
      fmt::arg("quoted_vars", Join(quoted_vars, " ")),
      fmt::arg("array_deps", Join(quoted_vars, ":")),
      fmt::arg("array_list", Join(array_vars, ",")));
}

}  // namespace

Result<SbatchSet> GenerateSbatchSet(const Plan& plan, const SlurmConfig& slurm,
                                    const SbatchOptions& options) {
  if (options.run_dir.empty() || options.run_dir.front() != '/') {
    return InvalidArgument(fmt::format(
        "sbatch: the run directory must be an absolute path, got '{}'", options.run_dir));
  }
  if (plan.agents.empty()) return InvalidArgument("sbatch: the plan has no agents");
  AGENTRT_RETURN_IF_ERROR(CheckSbatchWord("run name", plan.run));
  AGENTRT_RETURN_IF_ERROR(CheckSbatchWord("run directory", options.run_dir));
  if (slurm.signal_grace_s < 0) {
    return InvalidArgument(
        fmt::format("slurm.signal_grace_s must be >= 0, got {}", slurm.signal_grace_s));
  }
  AGENTRT_ASSIGN_OR_RETURN(std::string common, CommonDirectives(slurm));
  const RunDir layout(options.run_dir);
  const ScriptContext context{
      plan, slurm, options, layout, Quote(options.run_dir), layout.LogsDir(), std::move(common)};
  SbatchSet set;

  // Group agents by shape, in order of each shape's first agent.
  std::vector<ArrayJob> arrays;
  std::map<ResourceShape, size_t> index_of;
  for (const AgentPlan& agent : plan.agents) {
    AGENTRT_RETURN_IF_ERROR(CheckSbatchWord("agent name", agent.name));
    AGENTRT_ASSIGN_OR_RETURN(ResourceShape shape, ShapeOf(agent));
    auto [it, fresh] = index_of.emplace(shape, arrays.size());
    if (fresh) {
      arrays.push_back({shape, {}, "array-" + shape.Name() + ".sbatch", ""});
    }
    arrays[it->second].agents.push_back(agent.name);
  }
  set.bus_script = BusScript(context);
  for (ArrayJob& array : arrays) array.script = ArrayScript(context, array);
  set.done_script = DoneScript(context);
  set.submit_script = SubmitScript(context, arrays);
  set.arrays = std::move(arrays);
  return set;
}

Result<SbatchSet> WriteSbatchRun(Plan plan, const Config& config, const SbatchOptions& options) {
  if (options.run_dir.empty() || options.run_dir.front() != '/') {
    return InvalidArgument(fmt::format(
        "sbatch: the run directory must be an absolute path, got '{}'", options.run_dir));
  }
  plan.run_dir = options.run_dir;
  AGENTRT_RETURN_IF_ERROR(MakePortsRunUnique(plan, config.cluster.ports));
  AGENTRT_ASSIGN_OR_RETURN(SbatchSet set, GenerateSbatchSet(plan, config.slurm, options));

  const fs::path dir(options.run_dir);
  const auto rwx = fs::perms::owner_all | fs::perms::group_read | fs::perms::group_exec |
                   fs::perms::others_read | fs::perms::others_exec;
  AGENTRT_RETURN_IF_ERROR(MakeDir(dir, rwx));
  AGENTRT_RETURN_IF_ERROR(MakeDir(dir / "logs", rwx));
  AGENTRT_RETURN_IF_ERROR(MakeDir(dir / "secrets", fs::perms::owner_all));
  const RunDir run_dir(options.run_dir);
  for (const AgentPlan& agent : plan.agents) {
    const std::string ckpt = run_dir.Resolve(agent.checkpoint_dir);
    std::error_code ec;
    fs::create_directories(ckpt, ec);
    if (ec)
      return Internal(fmt::format("agent {}: cannot create checkpoint directory {}: {}", agent.name,
                                  ckpt, ec.message()));
  }

  // Credentials: a fresh secret per generated run; tokens derive from it.
  AGENTRT_ASSIGN_OR_RETURN(const std::string secret, run_dir.CreateSecret());
  // The bus job and the array tasks run on nodes SLURM picks: `auto` is on.
  // The bus job signs its own certificate with the run's CA where it lands.
  std::vector<std::string> clients;
  for (const AgentPlan& a : plan.agents) clients.push_back(a.name);
  AGENTRT_RETURN_IF_ERROR(PrepareBusTls(run_dir, plan.bus, /*beyond_loopback=*/true, clients));
  AGENTRT_RETURN_IF_ERROR(WriteAgentTokens(run_dir, secret, plan));

  AGENTRT_RETURN_IF_ERROR(WriteRunPlan(plan, run_dir.path()));
  const AtomicWriteOptions script{.mode = 0755};
  AGENTRT_RETURN_IF_ERROR(WriteFileAtomic((dir / "bus.sbatch").string(), set.bus_script, script));
  for (const ArrayJob& array : set.arrays) {
    AGENTRT_RETURN_IF_ERROR(
        WriteFileAtomic((dir / array.file_name).string(), array.script, script));
  }
  AGENTRT_RETURN_IF_ERROR(WriteFileAtomic((dir / "done.sbatch").string(), set.done_script, script));
  AGENTRT_RETURN_IF_ERROR(WriteFileAtomic((dir / "submit.sh").string(), set.submit_script, script));
  return set;
}

}  // namespace agentrt::slurm
