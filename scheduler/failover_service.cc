#include "scheduler/failover_service.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "common/file_util.h"
#include "scheduler/run_driver.h"

namespace agentrt {

FailoverService::FailoverService(Plan* plan, RunDir dir, std::vector<NodeSpec> nodes,
                                 DownNodes down_nodes, RunEndpoints endpoints,
                                 RunObserver* observer)
    : plan_(plan),
      dir_(std::move(dir)),
      failover_(std::move(nodes)),
      down_nodes_(std::move(down_nodes)),
      endpoints_(std::move(endpoints)),
      observer_(observer) {}

RelaunchAdvice FailoverService::Advise(AgentLaunch& launch) {
  RelaunchAdvice advice;
  if (allocation_shrunk_) launch.overlap_steps = true;  // see below; also when SLURM cannot say
  auto down = down_nodes_();
  if (!down.ok()) {
    observer_->Warn("agentctl run: warning: cannot tell which nodes are down (" +
                    down.status().message() + "); " + launch.name +
                    " is relaunched where it was\n");
    return advice;
  }
  // A node seen down has left the job (SLURM removes it, --no-kill), and
  // SLURM cannot give back the CPUs and GPUs of a step that started before
  // that ("unable to update job's core use information due to job
  // resizing"): a new step of any agent on the healthy nodes would wait for
  // them forever. From then on every relaunch overlaps the job's other steps;
  // the plan keeps the agents apart.
  if (!down->empty()) allocation_shrunk_ = launch.overlap_steps = true;
  const FailoverDecision d = failover_.Relocate(*plan_, launch.name, *down);
  if (d.kind == FailoverDecision::Kind::kStay) return advice;
  const double now = UnixTimeSeconds();
  for (size_t k = 0; k < d.failed.size(); ++k) {
    advice.failures.push_back({d.failed[k], now, launch.name,
                               k < d.moved_to.size() ? d.moved_to[k] : "",
                               d.kind == FailoverDecision::Kind::kShrunk});
  }
  if (d.kind == FailoverDecision::Kind::kNoSpare) {
    advice.hold = true;
    advice.reason = fmt::format("node {} failed and {}: requeueing the allocation",
                                fmt::join(d.failed, ","), d.reason);
    observer_->Event("agentctl run: " + launch.name + ": " + advice.reason);
    return advice;
  }
  // Only this agent's ranks move (or shrink); plan.json says where they are now.
  for (SupervisedAgent& s :
       SupervisedAgentsOf(*plan_, dir_, endpoints_.bus_address, endpoints_.telemetry_endpoint,
                          endpoints_.local_node)) {
    if (s.launch.name != launch.name) continue;
    launch.ranks = std::move(s.launch.ranks);
    launch.master_addr = std::move(s.launch.master_addr);
    launch.use_mpirun = s.launch.use_mpirun;
    launch.planned_ranks = s.launch.planned_ranks;
  }
  const Status written = WriteRunPlan(*plan_, dir_.path());
  if (!written.ok()) observer_->Warn("agentctl run: warning: " + written.message() + "\n");
  if (d.kind == FailoverDecision::Kind::kShrunk) {
    observer_->Event(fmt::format("agentctl run: node {} failed: {}: {}", fmt::join(d.failed, ","),
                                 launch.name, d.reason));
    return advice;
  }
  observer_->Event(fmt::format("agentctl run: node {} failed: {} moves to {}",
                               fmt::join(d.failed, ","), launch.name, fmt::join(d.moved_to, ",")));
  return advice;
}

}  // namespace agentrt
