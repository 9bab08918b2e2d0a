// A bounded wait for a condition that no event announces (a counter another
// thread moves, a file another process writes): polls `pred` every 5 ms for at
// most `limit`. The one polling helper of the C++ tests; prefer waiting on an
// event where there is one.
#pragma once

#include <chrono>
#include <functional>
#include <thread>

namespace agentrt::testing {

inline bool WaitFor(const std::function<bool()>& pred,
                    std::chrono::milliseconds limit = std::chrono::seconds(30)) {
  const auto end = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < end) {
    if (pred()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return pred();
}

}  // namespace agentrt::testing
