// agentrt::Clock — the time source of wall-clock triggers (checkpoint cadence),
// injected so tests can move time by hand instead of sleeping.
#pragma once

#include <atomic>
#include <chrono>

namespace agentrt {

class Clock {
 public:
  using TimePoint = std::chrono::steady_clock::time_point;
  virtual ~Clock() = default;
  // Monotonic time. Thread-safe.
  virtual TimePoint Now() const = 0;
};

// The process's steady clock. Stateless; the returned object lives forever.
const Clock* SteadyClock();

// A clock that moves only when told to (tests, simulations). Thread-safe.
class ManualClock : public Clock {
 public:
  TimePoint Now() const override {
    return TimePoint(std::chrono::steady_clock::duration(ticks_.load()));
  }
  void Advance(std::chrono::steady_clock::duration d) { ticks_.fetch_add(d.count()); }

 private:
  std::atomic<std::chrono::steady_clock::rep> ticks_{
      std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::hours(1))
          .count()};
};

}  // namespace agentrt
