#include "slurm/command_runner.h"

#include <catch2/catch.hpp>
#include <chrono>

using namespace agentrt;
using namespace agentrt::slurm;

TEST_CASE("the process runner returns stdout, stderr and the exit code") {
  auto runner = MakeProcessRunner();
  auto out = runner->Run({"sh", "-c", "echo out; echo err >&2; exit 3"}, 30);
  REQUIRE(out.ok());
  CHECK(out->out == "out\n");
  CHECK(out->err == "err\n");
  CHECK(out->exit_code == 3);
}

TEST_CASE("the process runner reports a program that is not there") {
  auto runner = MakeProcessRunner();
  auto out = runner->Run({"agentrt-no-such-program"}, 30);
  REQUIRE_FALSE(out.ok());
  CHECK(out.status().code() == StatusCode::kNotFound);
  CHECK_THAT(out.status().message(), Catch::Contains("agentrt-no-such-program"));
}

TEST_CASE("the process runner kills a program at its deadline, with its children") {
  auto runner = MakeProcessRunner();
  auto start = std::chrono::steady_clock::now();
  // The child keeps the pipes open; closing them early must not matter either.
  auto out = runner->Run({"sh", "-c", "sleep 30 & exec sleep 30"}, 0.3);
  double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  REQUIRE_FALSE(out.ok());
  CHECK(out.status().code() == StatusCode::kDeadlineExceeded);
  CHECK(took < 20);
  auto closed = runner->Run({"sh", "-c", "exec >/dev/null 2>&1; sleep 30"}, 0.3);
  REQUIRE_FALSE(closed.ok());
  CHECK(closed.status().code() == StatusCode::kDeadlineExceeded);
}

TEST_CASE("a command line is quoted only where a word needs it") {
  CHECK(FormatCommand({"sbatch", "--parsable", "a b", "it's"}) ==
        "sbatch --parsable 'a b' 'it'\\''s'");
}
