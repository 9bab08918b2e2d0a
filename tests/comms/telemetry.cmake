agentrt_test(NAME comms_telemetry_test
  SRCS ${CMAKE_CURRENT_LIST_DIR}/telemetry_test.cc
  DEPS agentrt::comms
  LABELS unit
  TIMEOUT 60)
