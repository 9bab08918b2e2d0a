# Crash consistency: a helper process saves in a loop and is SIGKILLed 100 times.
agentrt_test_program(NAME checkpoint_crash_helper
  SRCS ${CMAKE_CURRENT_LIST_DIR}/checkpoint_crash_helper.cc DEPS agentrt::runtime)

agentrt_test(NAME agent_runtime_checkpoint_crash_test
  SRCS ${CMAKE_CURRENT_LIST_DIR}/checkpoint_crash_test.cc
  DEPS agentrt::runtime
  LABELS fault
  TIMEOUT 120
  ENVIRONMENT CHECKPOINT_CRASH_HELPER=$<TARGET_FILE:checkpoint_crash_helper>)
add_dependencies(agent_runtime_checkpoint_crash_test checkpoint_crash_helper)
