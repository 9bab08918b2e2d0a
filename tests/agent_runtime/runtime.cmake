# The test agent used by the run controller's integration tests (tests/scheduler, tests/tools).
agentrt_executable(NAME agentrt-test-agent
  SRCS ${CMAKE_CURRENT_LIST_DIR}/test_agent.cc
  DEPS agentrt::runtime CLI11::CLI11)

agentrt_test(NAME agent_runtime_runtime_test
  SRCS ${CMAKE_CURRENT_LIST_DIR}/runtime_test.cc
  DEPS agentrt::runtime
  LABELS unit
  TIMEOUT 60)

# The test agent as a real process: signals, telemetry, checkpoint before exit, resume.
agentrt_test(NAME agent_runtime_agent_test
  SRCS ${CMAKE_CURRENT_LIST_DIR}/runtime_agent_test.cc
  DEPS agentrt::comms
  LABELS integration
  TIMEOUT 90)
add_dependencies(agent_runtime_agent_test agentrt-test-agent)
