# The test agent used by the run controller's integration tests (tests/scheduler, tests/tools).
agentrt_executable(NAME agentrt-test-agent
  SRCS ${CMAKE_CURRENT_LIST_DIR}/test_agent.cc
  DEPS agentrt::runtime CLI11::CLI11)
