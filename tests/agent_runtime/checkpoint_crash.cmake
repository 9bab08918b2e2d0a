# Crash consistency: a helper process saves in a loop and is SIGKILLed 100 times.
add_executable(checkpoint_crash_helper ${CMAKE_CURRENT_LIST_DIR}/checkpoint_crash_helper.cc)
target_link_libraries(checkpoint_crash_helper PRIVATE agentrt::runtime)
target_compile_options(checkpoint_crash_helper PRIVATE ${AGENTRT_WARNINGS})
set_target_properties(checkpoint_crash_helper PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${PROJECT_BINARY_DIR}/tests)

agentrt_test(NAME agent_runtime_checkpoint_crash_test
  SRCS ${CMAKE_CURRENT_LIST_DIR}/checkpoint_crash_test.cc
  DEPS agentrt::runtime
  LABELS fault
  TIMEOUT 120
  ENVIRONMENT CHECKPOINT_CRASH_HELPER=$<TARGET_FILE:checkpoint_crash_helper>)
add_dependencies(agent_runtime_checkpoint_crash_test checkpoint_crash_helper)
