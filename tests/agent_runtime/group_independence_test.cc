// Two agents side by side: two separate mpirun worlds at once, each with its
// own values and its own rendezvous port, must each reduce only their own.
// And a collective whose peer never joins fails loudly within its timeout.
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "tests/agent_runtime/free_port.h"

namespace {

std::string Launch(int np, const std::string& args) {
  const char* mpiexec = std::getenv("AGENTRT_MPIEXEC");
  const char* worker = std::getenv("GROUP_AGENT_WORKER");
  REQUIRE(mpiexec != nullptr);
  REQUIRE(worker != nullptr);
  // `timeout` bounds the whole world even if something hangs.
  return "timeout -s KILL 60 " + std::string(mpiexec) +
         " --oversubscribe --allow-run-as-root -np " + std::to_string(np) + " " + worker + " " +
         args + " 2>&1";
}

struct Outcome {
  int exit_code = -1;
  std::string output;
};

Outcome Finish(FILE* p) {
  Outcome o;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), p)) > 0) o.output.append(buf, n);
  const int status = ::pclose(p);
  o.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return o;
}

TEST_CASE("two agents' groups run side by side without cross-talk") {
  const int port_a = agentrt::testing::FreeTestPort();
  int port_b = agentrt::testing::FreeTestPort();
  while (port_b == port_a) port_b = agentrt::testing::FreeTestPort();
  // Both worlds run at the same time: started before either is read.
  FILE* a = ::popen(Launch(2, "--mode agent --agent agent-a --value 1 --iters 400 --port " +
                                  std::to_string(port_a))
                        .c_str(),
                    "r");
  FILE* b = ::popen(Launch(2, "--mode agent --agent agent-b --value 1000 --iters 400 --port " +
                                  std::to_string(port_b))
                        .c_str(),
                    "r");
  REQUIRE(a != nullptr);
  REQUIRE(b != nullptr);
  const Outcome oa = Finish(a);
  const Outcome ob = Finish(b);
  INFO("agent-a:\n" << oa.output << "\nagent-b:\n" << ob.output);
  CHECK(oa.exit_code == 0);
  CHECK(ob.exit_code == 0);
  // Sum over 2 ranks of value*(rank+1) + i at i = 399: 3*value + 798.
  for (int r = 0; r < 2; ++r) {
    CHECK_THAT(oa.output,
               Catch::Contains("RESULT agent=agent-a rank=" + std::to_string(r) +
                               " size=2 backend=mpi last=801 mismatches=0 store=ok port=" +
                               std::to_string(port_a)));
    CHECK_THAT(ob.output,
               Catch::Contains("RESULT agent=agent-b rank=" + std::to_string(r) +
                               " size=2 backend=mpi last=3798 mismatches=0 store=ok port=" +
                               std::to_string(port_b)));
  }
  CHECK(port_a != port_b);
}

TEST_CASE("a collective whose peer never joins times out and the rank fails loudly") {
  const auto t0 = std::chrono::steady_clock::now();
  FILE* p = ::popen(Launch(2, "--mode timeout --agent stuck-agent --port 0").c_str(), "r");
  REQUIRE(p != nullptr);
  const Outcome o = Finish(p);
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  INFO(o.output);
  CHECK(o.exit_code != 0);
  CHECK_THAT(o.output,
             Catch::Contains("DEADLINE_EXCEEDED") &&
                 Catch::Contains(
                     "agent stuck-agent rank 0 (mpi): allreduce of 1 float32 timed out after 1 s"));
  // 1 s timeout + 5 s grace + mpirun start-up and tear-down on a loaded machine.
  CHECK(took < 40.0);
}

}  // namespace
