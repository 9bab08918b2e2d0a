# The multi-node test cluster's stepped wall clock (start.sh --clock-shim): an
# LD_PRELOAD library every task of a node gets, and its test (the offset read,
# the steady clock left alone, waits until a wall-clock instant, telemetry
# after a step back, and the bus through steps of +-60 s).
agentrt_test_program(NAME agentrt_clock_offset SHARED
  SRCS ${CMAKE_CURRENT_LIST_DIR}/clock_offset_shim.cc DEPS ${CMAKE_DL_LIBS})
agentrt_test_program(NAME clock_waits
  SRCS ${CMAKE_CURRENT_LIST_DIR}/clock_waits.cc DEPS Threads::Threads)
agentrt_script_test(NAME slurm_clock_offset_test
  COMMAND ${CMAKE_CURRENT_LIST_DIR}/clock_offset_test.sh
  LABELS integration fault
  TIMEOUT 180
  ENVIRONMENT AGENTRT_CLOCK_SHIM=$<TARGET_FILE:agentrt_clock_offset>
              AGENTRT_CLOCK_WAITS=$<TARGET_FILE:clock_waits>
              AGENTRT_BUS_GRPC_TEST=$<TARGET_FILE:bus_grpc_test>
              AGENTRT_TELEMETRY_TEST=$<TARGET_FILE:comms_telemetry_test>)
