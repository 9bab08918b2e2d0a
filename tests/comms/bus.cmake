# The message bus: broker logic, the real gRPC broker and client over
# loopback, the standalone agentrt-bus binary, and a Python client built from
# the same bus.proto.
agentrt_test(NAME bus_unit_test
  SRCS ${CMAKE_CURRENT_LIST_DIR}/bus_unit_test.cc
  DEPS agentrt::comms
  LABELS unit
  TIMEOUT 60)

# BusClient's retry, reconnect and dedupe logic against a real broker through a
# fault-injecting stub (tests/comms/faulty_bus_stub.h).
agentrt_test(NAME bus_client_test
  SRCS ${CMAKE_CURRENT_LIST_DIR}/bus_client_test.cc
  DEPS agentrt::comms
  LABELS unit
  TIMEOUT 60)

# The weights delta record (comms/weight_delta.h): round trip and refusals.
agentrt_test(NAME weight_delta_test
  SRCS ${CMAKE_CURRENT_LIST_DIR}/weight_delta_test.cc
  DEPS agentrt::comms
  LABELS unit
  TIMEOUT 60)

# Weight streams (comms/weight_stream.h) on a real broker: spool, mapping,
# versions, keep_last, ACL, unfinished publishes, a durable restart.
agentrt_test(NAME weight_stream_test
  SRCS ${CMAKE_CURRENT_LIST_DIR}/weight_stream_test.cc
  DEPS agentrt::comms
  LABELS integration fault
  TIMEOUT 120)

agentrt_test(NAME bus_grpc_test
  SRCS ${CMAKE_CURRENT_LIST_DIR}/bus_grpc_test.cc
  DEPS agentrt::comms
  LABELS integration fault
  TIMEOUT 300)
add_dependencies(bus_grpc_test agentrt-bus)

# Debian's python3-grpcio / python3-grpc-tools live under /usr/bin/python3,
# not under a pyenv python3 that may come first on PATH.
agentrt_script_test(NAME bus_python_interop_test
  COMMAND ${AGENTRT_PYTHON} ${CMAKE_CURRENT_LIST_DIR}/bus_python_interop_test.py
  LABELS integration
  TIMEOUT 120)

# A peer's raw bytes in gRPC's own log lines come out escaped.
agentrt_script_test(NAME bus_log_escape_test
  COMMAND ${AGENTRT_PYTHON} ${CMAKE_CURRENT_LIST_DIR}/bus_log_escape_test.py
  LABELS integration
  TIMEOUT 60)

if(CMAKE_CXX_COMPILER_ID MATCHES "Clang")
  # libFuzzer target on the broker's request validation (clang only; skipped
  # with g++). The validation and broker sources are compiled into it so that
  # they carry the fuzzer's coverage instrumentation.
  set(fuzz_sanitizers -fsanitize=fuzzer,address,undefined)
  add_executable(bus_validate_fuzz
    ${CMAKE_CURRENT_LIST_DIR}/fuzz/bus_validate_fuzz.cc
    ${PROJECT_SOURCE_DIR}/comms/bus_validate.cc
    ${PROJECT_SOURCE_DIR}/comms/broker.cc
    ${PROJECT_SOURCE_DIR}/comms/broker_large.cc
    ${PROJECT_SOURCE_DIR}/comms/broker_read.cc
    ${PROJECT_SOURCE_DIR}/comms/broker_requests.cc
    ${PROJECT_SOURCE_DIR}/comms/access_cache.cc
    ${PROJECT_SOURCE_DIR}/comms/publisher_window.cc
    ${PROJECT_SOURCE_DIR}/comms/request_table.cc
    ${PROJECT_SOURCE_DIR}/comms/bus_log.cc
    ${PROJECT_SOURCE_DIR}/comms/auth.cc
    ${PROJECT_BINARY_DIR}/comms/proto/bus.pb.cc)
  set_source_files_properties(${PROJECT_BINARY_DIR}/comms/proto/bus.pb.cc PROPERTIES GENERATED TRUE COMPILE_OPTIONS "-w")
  add_dependencies(bus_validate_fuzz agentrt_comms_protos)  # generates bus.pb.cc
  target_include_directories(bus_validate_fuzz PRIVATE ${PROJECT_SOURCE_DIR} ${PROJECT_BINARY_DIR})
  target_link_libraries(bus_validate_fuzz PRIVATE agentrt::common agentrt::plan fmt::fmt protobuf::libprotobuf OpenSSL::Crypto
                        nlohmann_json::nlohmann_json Threads::Threads)
  target_compile_options(bus_validate_fuzz PRIVATE ${fuzz_sanitizers} $<$<COMPILE_LANGUAGE:CXX>:${AGENTRT_WARNINGS}>)
  target_link_options(bus_validate_fuzz PRIVATE ${fuzz_sanitizers})
  set_target_properties(bus_validate_fuzz PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${PROJECT_BINARY_DIR}/tests)
  # A short bounded run as a test. New inputs go to a scratch corpus in the
  # build tree; the checked-in seeds are only read.
  add_test(NAME bus_validate_fuzz_test
    COMMAND sh -c "mkdir -p fuzz-corpus && exec \"$0\" -max_total_time=20 -max_len=4096 fuzz-corpus \"$1\""
            $<TARGET_FILE:bus_validate_fuzz> ${CMAKE_CURRENT_LIST_DIR}/fuzz/corpus
    WORKING_DIRECTORY ${CMAKE_CURRENT_BINARY_DIR})
  set_tests_properties(bus_validate_fuzz_test PROPERTIES LABELS unit TIMEOUT 120)
endif()

# The durable log: restart, torn tail, corrupt record, segment retention.
agentrt_test(NAME bus_log_test
  SRCS ${CMAKE_CURRENT_LIST_DIR}/bus_log_test.cc
  DEPS agentrt::comms
  LABELS unit
  TIMEOUT 60)

# kill -9 of a real agentrt-bus mid-storm, restarted on its log (always, batch); a corrupt log refused.
agentrt_python_scenarios(PREFIX bus_durable
  SCRIPT ${CMAKE_CURRENT_LIST_DIR}/bus_durable_test.py
  SCENARIOS always batch corrupt
  LABELS integration fault
  ENVIRONMENT "PYTHONPATH=${PROJECT_BINARY_DIR}/python"
  TIMEOUT 120)

# Large messages: chunked publish and delivery, whole or not at all, their files.
agentrt_test(NAME bus_large_test
  SRCS ${CMAKE_CURRENT_LIST_DIR}/bus_large_test.cc
  DEPS agentrt::comms
  LABELS integration fault
  TIMEOUT 300)

# A 256 MiB snapshot to 4 subscribers through a real agentrt-bus: whole, small messages flowing, bounded RSS.
agentrt_python_scenarios(PREFIX bus_large_fanout
  SCRIPT ${CMAKE_CURRENT_LIST_DIR}/bus_large_fanout_test.py
  SCENARIOS streamed local
  LABELS integration
  ENVIRONMENT "PYTHONPATH=${PROJECT_BINARY_DIR}/python"
  TIMEOUT 300)

# Packed batch entries: the field's codec and validation, the broker storing them.
agentrt_test(NAME packed_entries_test
  SRCS ${CMAKE_CURRENT_LIST_DIR}/packed_entries_test.cc
  DEPS agentrt::comms
  LABELS unit
  TIMEOUT 60)

# Its own binary: it replaces the global operator new to count the broker's allocations.
agentrt_test(NAME bus_alloc_test
  SRCS ${CMAKE_CURRENT_LIST_DIR}/bus_alloc_test.cc
  DEPS agentrt::comms
  LABELS unit
  TIMEOUT 60)

# The broker's parts alone: duplicate suppression, the access cache, the request table.
foreach(part publisher_window access_cache request_table)
  agentrt_test(NAME comms_${part}_test
    SRCS ${CMAKE_CURRENT_LIST_DIR}/${part}_test.cc
    DEPS agentrt::comms
    LABELS unit
    TIMEOUT 60)
endforeach()

# The rate limit on gRPC's own log lines (comms/grpc_log.h), on a made-up clock.
agentrt_test(NAME grpc_log_test
  SRCS ${CMAKE_CURRENT_LIST_DIR}/grpc_log_test.cc
  DEPS agentrt::comms
  LABELS unit
  TIMEOUT 30)

# The run's own CA: files and modes, auto TLS, a real broker that only its CA's clients reach.
agentrt_test(NAME run_ca_test
  SRCS ${CMAKE_CURRENT_LIST_DIR}/run_ca_test.cc
  DEPS agentrt::comms
  LABELS unit
  TIMEOUT 60)
