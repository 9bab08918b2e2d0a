agentrt_test(NAME agent_runtime_checkpoint_test
  SRCS ${CMAKE_CURRENT_LIST_DIR}/checkpoint_test.cc
  DEPS agentrt::checkpoint agentrt::runtime
  LABELS unit
  TIMEOUT 120)
agentrt_test(NAME agent_runtime_checkpoint_adopt_test
  SRCS ${CMAKE_CURRENT_LIST_DIR}/checkpoint_adopt_test.cc
  DEPS agentrt::checkpoint
  LABELS unit
  TIMEOUT 60)
