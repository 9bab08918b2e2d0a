# `agentctl validate` / `agentctl plan` run as a user runs them.
agentrt_test(NAME scheduler_agentctl_test
  SRCS planner_agentctl_test.cc
  DEPS agentrt::scheduler
  LABELS integration
  TIMEOUT 120)
add_dependencies(scheduler_agentctl_test agentctl)
