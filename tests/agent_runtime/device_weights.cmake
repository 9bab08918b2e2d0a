# Device weight streams: CUDA IPC between processes of a node over the fake
# device (its memory is memfds), pinned host staging elsewhere, a real broker.
agentrt_test_program(NAME device_weights_reader
  SRCS ${CMAKE_CURRENT_LIST_DIR}/device_weights_reader.cc DEPS agentrt::runtime)
agentrt_test(NAME agent_runtime_device_weights_test
  SRCS device_weights_test.cc
  DEPS agentrt::runtime
  LABELS integration fault
  TIMEOUT 120
  ENVIRONMENT DEVICE_WEIGHTS_READER=$<TARGET_FILE:device_weights_reader>)
add_dependencies(agent_runtime_device_weights_test device_weights_reader)
