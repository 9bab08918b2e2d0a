# The message bus (issue 6): broker logic, the real gRPC broker and client over
# loopback, the standalone agentrt-bus binary, and a Python client built from
# the same bus.proto.
agentrt_test(NAME bus_unit_test
  SRCS ${CMAKE_CURRENT_LIST_DIR}/bus_unit_test.cc
  DEPS agentrt::comms
  LABELS unit
  TIMEOUT 60)

if(EXISTS ${CMAKE_CURRENT_LIST_DIR}/bus_grpc_test.cc)
agentrt_test(NAME bus_grpc_test
  SRCS ${CMAKE_CURRENT_LIST_DIR}/bus_grpc_test.cc
  DEPS agentrt::comms
  LABELS integration fault
  TIMEOUT 300)
add_dependencies(bus_grpc_test agentrt-bus)
endif()

# Debian's python3-grpcio / python3-grpc-tools live under /usr/bin/python3,
# not under a pyenv python3 that may come first on PATH.
agentrt_script_test(NAME bus_python_interop_test
  COMMAND /usr/bin/python3 ${CMAKE_CURRENT_LIST_DIR}/bus_python_interop_test.py
  LABELS integration
  TIMEOUT 120)

if(CMAKE_CXX_COMPILER_ID MATCHES "Clang" AND EXISTS ${CMAKE_CURRENT_LIST_DIR}/fuzz/bus_validate_fuzz.cc)
  # libFuzzer target on the broker's request validation (clang only).
  add_executable(bus_validate_fuzz ${CMAKE_CURRENT_LIST_DIR}/fuzz/bus_validate_fuzz.cc)
  target_link_libraries(bus_validate_fuzz PRIVATE agentrt::comms)
  target_compile_options(bus_validate_fuzz PRIVATE -fsanitize=fuzzer,address,undefined ${AGENTRT_WARNINGS})
  target_link_options(bus_validate_fuzz PRIVATE -fsanitize=fuzzer,address,undefined)
  set_target_properties(bus_validate_fuzz PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${PROJECT_BINARY_DIR}/tests)
  # A short, bounded run as a test: 20 s of fuzzing from the seed corpus.
  add_test(NAME bus_validate_fuzz_test
    COMMAND bus_validate_fuzz -max_total_time=20 -max_len=4096 ${CMAKE_CURRENT_LIST_DIR}/fuzz/corpus)
  set_tests_properties(bus_validate_fuzz_test PROPERTIES LABELS unit TIMEOUT 120)
endif()
