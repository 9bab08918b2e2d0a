agentrt_test(NAME agent_runtime_checkpoint_test
  SRCS ${CMAKE_CURRENT_LIST_DIR}/checkpoint_test.cc
  DEPS agentrt::runtime
  LABELS unit
  TIMEOUT 120)
