# Partition planner: hand-written topology/pinning cases, the plan JSON
# contract, and property tests over thousands of random clusters.
agentrt_test(NAME scheduler_planner_test
  SRCS planner_test.cc planner_plan_json_test.cc
  DEPS agentrt::scheduler fmt::fmt
  LABELS unit
  TIMEOUT 60)
agentrt_test(NAME scheduler_planner_property_test
  SRCS planner_property_test.cc
  DEPS agentrt::scheduler fmt::fmt
  LABELS unit
  TIMEOUT 120)
