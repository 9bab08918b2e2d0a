#include "common/clock.h"

namespace agentrt {
namespace {

class SteadyClockImpl final : public Clock {
 public:
  TimePoint Now() const override { return std::chrono::steady_clock::now(); }
};

}  // namespace

const Clock* SteadyClock() {
  static const SteadyClockImpl clock;
  return &clock;
}

}  // namespace agentrt
