#include "slurm/alloc_script.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <map>
#include <set>
#include <string_view>
#include <vector>

namespace agentrt::slurm {
namespace {

// Single-quoted for bash unless the word is plainly safe.
std::string Quote(const std::string& word) {
  const bool plain = !word.empty() && std::all_of(word.begin(), word.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) ||
           std::string_view("/._-+:=,@%").find(c) != std::string_view::npos;
  });
  if (plain) return word;
  std::string out = "'";
  for (char c : word) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

}  // namespace

std::string AllocationScript(const Plan& plan, const SlurmConfig& slurm,
                             const AllocScriptOptions& options) {
  std::vector<std::string> nodes;
  std::map<std::string, size_t> gpus_on;
  std::map<std::string, size_t> ranks_on;
  int ranks = 0;
  for (const auto& a : plan.agents) {
    ranks += a.ranks;
    for (const auto& p : a.placement) {
      if (std::find(nodes.begin(), nodes.end(), p.node) == nodes.end()) nodes.push_back(p.node);
      gpus_on[p.node] += p.gpus.size();
      ranks_on[p.node] += p.ranks.size();
    }
  }
  size_t most_ranks = 0;
  for (const auto& [node, n] : ranks_on) most_ranks = std::max(most_ranks, n);
  size_t gpus = 0;
  for (const auto& [node, n] : gpus_on) gpus = std::max(gpus, n);
  // A typed GRES when every GPU agent asks for the same gpu_type (one request
  // applies to every node of the job); else untyped: the planner already put
  // each typed agent on nodes of its type, and --nodelist holds the job there.
  std::set<std::string> types;
  for (const auto& a : plan.agents) {
    if (a.gpus > 0) types.insert(a.gpu_type);
  }
  const std::string gres_type =
      types.size() == 1 && !types.begin()->empty() ? *types.begin() + ":" : "";
  std::string nodelist;
  for (const auto& n : nodes) nodelist += (nodelist.empty() ? "" : ",") + n;

  std::string s = "#!/bin/bash\n";
  s += fmt::format(
      "# agentctl run --backend slurm: the allocation of run '{}'.\n"
      "# Its batch shell becomes the run controller: it hosts the message bus and starts\n"
      "# every agent as its own job step (srun --exact), restarting failed agents as new\n"
      "# steps. On USR2 ({} s before the time limit, or `scancel --signal=USR2 --batch`)\n"
      "# every agent checkpoints and the job requeues itself; on restart it resumes every\n"
      "# agent from its checkpoint with the same plan and ports (RUN_DIR/plan.json).\n"
      "# No secret here: the run secret and tokens are 0600 files in RUN_DIR/secrets/.\n",
      plan.run, slurm.signal_grace_s);
  s += fmt::format("#SBATCH --job-name={}\n", Quote(plan.run));
  if (slurm.spare_nodes > 0) {
    s += fmt::format(
        "# the plan's nodes and {} spare: an agent on a node that fails moves to a spare\n",
        slurm.spare_nodes);
  } else {
    s += "# the plan's nodes\n";
  }
  s += fmt::format("#SBATCH --nodes={}\n#SBATCH --nodelist={}\n",
                   nodes.size() + static_cast<size_t>(slurm.spare_nodes), nodelist);
  if (nodes.size() > 1 || slurm.spare_nodes > 0) {
    // Else SLURM ends the whole job when one node fails; the controller
    // moves the agents of a failed node itself (or requeues the job).
    s += "# a failed node does not end the job: the controller handles it\n#SBATCH --no-kill\n";
  }
  s += fmt::format(
      "# one task per rank of every agent ({} in all), plus one for the controller: the\n"
      "# batch step holds CPUs of its own, and steps are --exact\n",
      ranks);
  if (nodes.size() + static_cast<size_t>(slurm.spare_nodes) > 1) {
    // SLURM would spread `--ntasks` its own way (filling the first node): ask
    // every node for the most ranks the plan puts on one node, and the controller's.
    s += fmt::format(
        "# on several nodes: on each, the most ranks the plan puts on one node ({}) and one\n",
        most_ranks);
    s += fmt::format("#SBATCH --ntasks-per-node={}\n#SBATCH --cpus-per-task={}\n", most_ranks + 1,
                     options.cpus_per_rank);
  } else {
    s += fmt::format("#SBATCH --ntasks={}\n#SBATCH --cpus-per-task={}\n", ranks + 1,
                     options.cpus_per_rank);
  }
  if (gpus > 0) {
    s += "# the most GPUs the plan uses on one node\n";
    s += fmt::format("#SBATCH --gres=gpu:{}{}\n", gres_type, gpus);
  }
  s += "# preemption / time limit: USR2 to the batch shell (USR1 is NCCL's), then requeue\n";
  s += fmt::format("#SBATCH --signal=B:USR2@{}\n#SBATCH --requeue\n", slurm.signal_grace_s);
  s += "#SBATCH --open-mode=append\n";
  s += fmt::format("#SBATCH --output={}\n", Quote(options.run_dir + "/slurm-%j.out"));
  if (!slurm.partition.empty())
    s += fmt::format("#SBATCH --partition={}\n", Quote(slurm.partition));
  if (!slurm.account.empty()) s += fmt::format("#SBATCH --account={}\n", Quote(slurm.account));
  if (!slurm.qos.empty()) s += fmt::format("#SBATCH --qos={}\n", Quote(slurm.qos));
  if (!slurm.time.empty()) s += fmt::format("#SBATCH --time={}\n", Quote(slurm.time));
  if (!slurm.constraint.empty()) {
    s += fmt::format("#SBATCH --constraint={}\n", Quote(slurm.constraint));
  }
  for (const auto& extra : slurm.extra_args) s += fmt::format("#SBATCH {}\n", extra);
  s += "\n# The controller replaces this shell, so SLURM's signals reach it directly.\n";
  s += fmt::format("exec {} run --backend slurm-steps --run-dir {} --cpus-per-rank {}{}\n",
                   Quote(options.agentctl_path), Quote(options.run_dir), options.cpus_per_rank,
                   slurm.steps == "node" ? " --node-steps" : "");
  return s;
}

}  // namespace agentrt::slurm
