#include "scheduler/control_inbox.h"

#include <fmt/format.h>

#include <string>
#include <utility>
#include <vector>

#include "scheduler/control.h"
#include "scheduler/run_driver.h"

namespace agentrt {

ControlInbox::ControlInbox(RunDir dir, RunController* controller, const Clock* clock,
                           RunObserver* observer)
    : dir_(std::move(dir)), controller_(controller), clock_(clock), observer_(observer) {}

void ControlInbox::Poll() {
  const double now = clock_->NowSeconds();
  if (checked_at_ >= 0 && now - checked_at_ < kPollIntervalS) return;
  checked_at_ = now;
  std::vector<std::string> refused;
  for (const ControlRequest& r : agentrt::TakeControlRequests(dir_, &refused)) {
    const std::string who = r.by.empty() ? "a control request" : r.by;
    if (r.action == "stop") {
      if (controller_->stop_requested()) continue;
      observer_->Event("agentctl run: " + who + " asked to stop the run: stopping every agent");
      controller_->RequestStop("requested by " + who);
    } else if (r.action == "restart") {
      const Status s = controller_->Replace(r.agent, "restart requested by " + who, [] {});
      observer_->Event(s.ok() ? fmt::format("agentctl run: {} asked to restart {}", who, r.agent)
                              : fmt::format("agentctl run: {} asked to restart {}: {}", who,
                                            r.agent, s.message()));
    } else {
      refused.push_back(r.file + ": unknown action '" + r.action + "'");
    }
  }
  for (const std::string& why : refused) observer_->Warn("agentctl run: " + why + "\n");
}

}  // namespace agentrt
