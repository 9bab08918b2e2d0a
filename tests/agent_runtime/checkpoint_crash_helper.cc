// checkpoint_crash_helper DIR: the child process of the crash-consistency test.
//
// Two ranks (threads) of one agent restore from DIR, then save checkpoints in a
// tight loop, forever: every save holds a deterministic pattern of its step, in
// sizes that vary from save to save. After each commit rank 0 writes
// "committed <step>\n" to stdout (unbuffered), so the parent knows what was
// committed before it sends SIGKILL at a random moment.
#include <unistd.h>

#include <barrier>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "agent_runtime/checkpointer.h"
#include "tests/agent_runtime/checkpoint_crash_pattern.h"

namespace {

constexpr int kWorld = 2;

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: checkpoint_crash_helper DIR\n");
    return 2;
  }
  std::string dir = argv[1];
  std::barrier<> sync(kWorld);
  std::vector<std::thread> ranks;
  for (int r = 0; r < kWorld; ++r) {
    ranks.emplace_back([&, r] {
      agentrt::CheckpointOptions o{.dir = dir,
                                   .agent = "crash",
                                   .rank = r,
                                   .world_size = kWorld,
                                   .interval_s = 0,
                                   .keep_last = 2};
      o.barrier = [&sync] {
        sync.arrive_and_wait();
        return agentrt::Status::Ok();
      };
      if (r == 0) {
        o.on_commit = [](int64_t step) {
          char line[64];
          int n =
              std::snprintf(line, sizeof line, "committed %lld\n", static_cast<long long>(step));
          ssize_t ignored = ::write(1, line, static_cast<size_t>(n));
          (void)ignored;
        };
      }
      auto c = agentrt::Checkpointer::Create(o);
      if (!c.ok()) {
        std::fprintf(stderr, "%s\n", c.status().ToString().c_str());
        std::_Exit(3);
      }
      auto restored = (*c)->Restore();
      if (!restored.ok()) {
        std::fprintf(stderr, "%s\n", restored.status().ToString().c_str());
        std::_Exit(3);
      }
      int64_t step = restored->restored() ? restored->step : 0;
      for (;;) {
        ++step;
        auto data = agentrt::testing::CrashPattern(step, r);
        agentrt::CheckpointState s;
        s.AddArray("pattern", data.data(), "uint64", {static_cast<int64_t>(data.size())}, 8);
        s.metadata = {{"step", step}};
        agentrt::Status st = (*c)->Save(step, s);
        if (!st.ok()) {
          std::fprintf(stderr, "%s\n", st.ToString().c_str());
          std::_Exit(4);
        }
      }
    });
  }
  for (auto& t : ranks) t.join();
  return 0;
}
