# Device weight streams: CUDA IPC between processes of a node over the fake
# device (its memory is memfds), pinned host staging elsewhere, a real broker.
add_executable(device_weights_reader device_weights_reader.cc)
target_link_libraries(device_weights_reader PRIVATE agentrt::runtime)
target_compile_options(device_weights_reader PRIVATE ${AGENTRT_WARNINGS})
set_target_properties(device_weights_reader PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${PROJECT_BINARY_DIR}/tests)
agentrt_test(NAME agent_runtime_device_weights_test
  SRCS device_weights_test.cc
  DEPS agentrt::runtime
  LABELS integration fault
  TIMEOUT 120
  ENVIRONMENT DEVICE_WEIGHTS_READER=$<TARGET_FILE:device_weights_reader>)
add_dependencies(agent_runtime_device_weights_test device_weights_reader)
