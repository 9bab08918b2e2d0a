// agentrt::Clock — the one monotonic time source, injected wherever time
// decides something (the supervisor's deadlines, the checkpoint cadence) so
// tests move time by hand instead of sleeping.
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
  // Now() in seconds since the clock's epoch (differences are what matter).
  double NowSeconds() const {
    return std::chrono::duration<double>(Now().time_since_epoch()).count();
  }
};

// The process's steady clock. Stateless; the returned object lives forever.
const Clock* SteadyClock();

// A clock that moves only when told to (tests, simulations). Thread-safe.
class ManualClock final : public Clock {
 public:
  TimePoint Now() const override {
    return TimePoint(std::chrono::steady_clock::duration(ticks_.load()));
  }
  void Advance(std::chrono::steady_clock::duration d) { ticks_.fetch_add(d.count()); }
  void AdvanceSeconds(double s) {
    Advance(std::chrono::duration_cast<std::chrono::steady_clock::duration>(
        std::chrono::duration<double>(s)));
  }

 private:
  // Starts an hour in, so "time since the last event" is never negative.
  std::atomic<std::chrono::steady_clock::rep> ticks_{
      std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::hours(1))
          .count()};
};

}  // namespace agentrt
