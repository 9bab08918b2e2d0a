// `agentctl sbatch`: a plan as sbatch scripts a user submits by hand.
//
// Agents with the same resource shape (nodes, ranks, GPUs per node) become one
// job array, one array task per agent (`--array=0-(n-1)`). Each task picks its
// agent from the list in its script by SLURM_ARRAY_TASK_ID, and its ports,
// checkpoint directory, command and environment from RUN_DIR/plan.json through
// `agentctl array-task` (slurm/array_task.h). The bus is its own small job
// (tools/agentrt-bus) that publishes its host:port in RUN_DIR/bus.address;
// array tasks wait for that file with a timeout and a clear error.
//
// What is written into the run directory:
//   plan.json          the plan (run_dir set; port blocks unique run-wide)
//   bus.sbatch         the bus job
//   array-<shape>.sbatch  one job array per shape
//   done.sbatch        stops the bus once every array task has ended
//   submit.sh          submits all of the above in order (bus, arrays, done)
//   secrets/           0700: run.secret and <agent>.token, each 0600
//   logs/              job output (%x-%A_%a.out)
// No script and no job environment holds a secret: only paths to 0600 files.
//
// In array mode SLURM, not the plan, chooses each task's node and GPUs (its
// CUDA_VISIBLE_DEVICES); GRES accounting keeps them disjoint. The plan's port
// blocks are therefore made unique across the whole run (two agents planned
// on different nodes may land on one).
#pragma once

#include <compare>
#include <string>
#include <vector>

#include "common/status.h"
#include "plan/config.h"
#include "plan/plan.h"

namespace agentrt::slurm {

// What one array task asks SLURM for.
struct ResourceShape {
  int nodes = 1;
  int ranks = 1;          // tasks in total (--ntasks)
  int gpus_per_node = 0;  // --gres=gpu:N (none when 0)
  std::string gpu_type;   // --gres=gpu:TYPE:N when set

  // "gpu2-rank2", "gpu8-rank16-node2", "cpu-rank1", "gpu2-rank2-h100".
  std::string Name() const;
  auto operator<=>(const ResourceShape&) const = default;
};

// The shape of an agent as planned. Errors: ranks or GPUs that do not divide
// evenly over its nodes (the planner gives multi-node agents whole nodes).
Result<ResourceShape> ShapeOf(const AgentPlan& agent);

struct SbatchOptions {
  std::string run_dir;        // absolute; created if missing
  std::string agentctl_path;  // absolute path of agentctl as the compute nodes see it
  std::string bus_path;       // absolute path of agentrt-bus
  double bus_wait_s = 300;    // how long an array task waits for bus.address
  int cpus_per_rank = 1;      // --cpus-per-task
};

struct ArrayJob {
  ResourceShape shape;
  std::vector<std::string> agents;  // array task i runs agents[i]
  std::string file_name;            // "array-gpu2-rank2.sbatch"
  std::string script;
};

struct SbatchSet {
  std::string bus_script;
  std::vector<ArrayJob> arrays;  // in order of each shape's first agent in the plan
  std::string done_script;
  std::string submit_script;
};

// Gives every agent a port block that no other agent of the run (and not the
// bus port) overlaps, on any node, keeping the planned block where it is
// already unique. Blocks come from `ports` (per_agent ports each).
// Errors: the range has too few blocks for the agents (names the agent).
Status MakePortsRunUnique(Plan& plan, const PortConfig& ports);

// The scripts for `plan` (whose run_dir must equal options.run_dir). Pure:
// writes nothing. Errors: a value that cannot go into an #SBATCH line
// (newline, or whitespace where SLURM takes one word), an uneven shape.
Result<SbatchSet> GenerateSbatchSet(const Plan& plan, const SlurmConfig& slurm,
                                    const SbatchOptions& options);

// Writes everything listed at the top of this file into options.run_dir:
// makes ports run-unique, sets plan.run_dir, generates a fresh run secret and
// one token per agent. Returns what it wrote. Errors name the path.
Result<SbatchSet> WriteSbatchRun(Plan plan, const Config& config, const SbatchOptions& options);

}  // namespace agentrt::slurm
