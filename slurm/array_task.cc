#include "slurm/array_task.h"

#include <fmt/format.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "scheduler/hostlist.h"

namespace agentrt::slurm {
namespace {

Result<int> IntVar(const EnvLookup& env, const std::string& name) {
  std::optional<std::string> v = env(name);
  if (!v) {
    return FailedPrecondition(
        fmt::format("{} is not set: `agentctl array-task` runs under srun inside a job-array "
                    "task (see the array-*.sbatch scripts)",
                    name));
  }
  int value = 0;
  auto [ptr, ec] = std::from_chars(v->data(), v->data() + v->size(), value);
  if (ec != std::errc() || ptr != v->data() + v->size()) {
    return InvalidArgument(fmt::format("{}='{}' is not a number", name, *v));
  }
  return value;
}

}  // namespace

Result<std::vector<int>> ParseTasksPerNode(const std::string& text) {
  std::vector<int> counts;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    int count = 0;
    int repeat = 1;
    size_t paren = item.find('(');
    auto [p, ec] = std::from_chars(
        item.data(), item.data() + (paren == std::string::npos ? item.size() : paren), count);
    bool ok = ec == std::errc() && count >= 0;
    if (ok && paren != std::string::npos) {
      // "2(x3)": three nodes with two tasks each.
      ok = item.size() > paren + 3 && item[paren + 1] == 'x' && item.back() == ')';
      if (ok) {
        auto [q, ec2] =
            std::from_chars(item.data() + paren + 2, item.data() + item.size() - 1, repeat);
        ok = ec2 == std::errc() && q == item.data() + item.size() - 1 && repeat > 0;
      }
    } else if (ok) {
      ok = p == item.data() + item.size();
    }
    if (!ok)
      return InvalidArgument(
          fmt::format("SLURM_TASKS_PER_NODE='{}': cannot read '{}'", text, item));
    counts.insert(counts.end(), static_cast<size_t>(repeat), count);
  }
  if (counts.empty()) return InvalidArgument("SLURM_TASKS_PER_NODE is empty");
  return counts;
}

Result<std::map<std::string, std::string>> ArrayTaskEnvironment(const Plan& plan,
                                                                const AgentPlan& agent,
                                                                const std::string& run_dir,
                                                                const std::string& bus_address,
                                                                const EnvLookup& env) {
  const std::string where = fmt::format("agent {}", agent.name);
  AGENTRT_ASSIGN_OR_RETURN(int rank, IntVar(env, "SLURM_PROCID"));
  AGENTRT_ASSIGN_OR_RETURN(int world, IntVar(env, "SLURM_NTASKS"));
  AGENTRT_ASSIGN_OR_RETURN(int local_rank, IntVar(env, "SLURM_LOCALID"));
  AGENTRT_ASSIGN_OR_RETURN(int node_id, IntVar(env, "SLURM_NODEID"));
  if (world != agent.ranks) {
    return FailedPrecondition(
        fmt::format("{}: SLURM started {} tasks but the plan ({}/plan.json) gives the agent {} "
                    "ranks; was the array script edited?",
                    where, world, run_dir, agent.ranks));
  }
  std::optional<std::string> tasks_per_node = env("SLURM_TASKS_PER_NODE");
  if (!tasks_per_node) return FailedPrecondition(where + ": SLURM_TASKS_PER_NODE is not set");
  AGENTRT_ASSIGN_OR_RETURN(std::vector<int> per_node, ParseTasksPerNode(*tasks_per_node));
  if (node_id < 0 || static_cast<size_t>(node_id) >= per_node.size()) {
    return InvalidArgument(fmt::format("{}: SLURM_NODEID={} but SLURM_TASKS_PER_NODE='{}'", where,
                                       node_id, *tasks_per_node));
  }
  std::optional<std::string> nodelist = env("SLURM_JOB_NODELIST");
  if (!nodelist) return FailedPrecondition(where + ": SLURM_JOB_NODELIST is not set");
  auto hosts = ExpandHostlist(*nodelist);
  if (!hosts.ok()) return hosts.status().WithContext(where + ": SLURM_JOB_NODELIST");
  if (hosts->empty()) return InvalidArgument(where + ": SLURM_JOB_NODELIST is empty");

  std::map<std::string, std::string> vars = agent.env;  // the plan's first; the contract wins
  vars["AGENTRT_RUN_DIR"] = run_dir;
  vars["AGENTRT_AGENT"] = agent.name;
  vars["AGENTRT_AGENT_INDEX"] = std::to_string(agent.index);
  vars["RANK"] = std::to_string(rank);
  vars["WORLD_SIZE"] = std::to_string(world);
  vars["LOCAL_RANK"] = std::to_string(local_rank);
  vars["LOCAL_WORLD_SIZE"] = std::to_string(per_node[static_cast<size_t>(node_id)]);
  vars["MASTER_ADDR"] = hosts->front();
  vars["MASTER_PORT"] = std::to_string(agent.master_port);
  vars["AGENTRT_PORTS"] = fmt::format("{}-{}", agent.ports.first, agent.ports.last);
  vars["AGENTRT_CKPT_DIR"] = agent.checkpoint_dir;
  vars["AGENTRT_BUS"] = bus_address;
  vars["AGENTRT_TOKEN_FILE"] = run_dir + "/secrets/" + agent.name + ".token";
  vars["AGENTRT_RESTART_COUNT"] = env("SLURM_RESTART_COUNT").value_or("0");
  if (agent.gpus == 0) {
    vars["CUDA_VISIBLE_DEVICES"] = "";  // a CPU agent must not pick up a GPU
  } else {
    std::optional<std::string> cvd = env("CUDA_VISIBLE_DEVICES");
    if (!cvd || cvd->empty()) {
      return FailedPrecondition(
          fmt::format("{}: the agent has {} GPUs but SLURM set no CUDA_VISIBLE_DEVICES; does "
                      "the cluster's gres.conf declare its GPUs?",
                      where, agent.gpus));
    }
    vars["CUDA_VISIBLE_DEVICES"] = *cvd;
  }
  (void)plan;
  return vars;
}

Status ExecArrayTask(const std::string& run_dir, const std::string& agent_name,
                     const std::string& self_path) {
  AGENTRT_ASSIGN_OR_RETURN(Plan plan, ReadPlanFile(run_dir + "/plan.json"));
  const AgentPlan* agent = plan.FindAgent(agent_name);
  if (agent == nullptr) {
    return NotFound(fmt::format("agent '{}' is not in {}/plan.json", agent_name, run_dir));
  }
  if (agent->command.empty())
    return InvalidArgument(fmt::format("agent {}: empty command in the plan", agent_name));
  std::ifstream in(run_dir + "/bus.address");
  std::string bus;
  std::getline(in, bus);
  if (bus.empty()) {
    return FailedPrecondition(
        fmt::format("agent {}: {}/bus.address is missing or empty; the bus job has not "
                    "published its address",
                    agent_name, run_dir));
  }
  auto lookup = [](const std::string& name) -> std::optional<std::string> {
    const char* v = std::getenv(name.c_str());
    return v ? std::optional<std::string>(v) : std::nullopt;
  };
  AGENTRT_ASSIGN_OR_RETURN(auto vars, ArrayTaskEnvironment(plan, *agent, run_dir, bus, lookup));
  for (const auto& [k, v] : vars) {
    if (setenv(k.c_str(), v.c_str(), 1) != 0) return ErrnoStatus(errno, "setenv " + k);
  }
  // agent-worker and the other tools live next to agentctl.
  std::string bin = std::filesystem::path(self_path).parent_path().string();
  const char* path = std::getenv("PATH");
  std::string new_path = bin + ":" + (path ? path : "/usr/bin:/bin");
  setenv("PATH", new_path.c_str(), 1);

  std::vector<char*> argv;
  for (const std::string& a : agent->command) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  execvp(argv[0], argv.data());
  return ErrnoStatus(errno,
                     fmt::format("agent {}: cannot run '{}'", agent_name, agent->command.front()));
}

}  // namespace agentrt::slurm
