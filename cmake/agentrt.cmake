# Helpers that declare every target the same way (cf. abseil's absl_cc_library).

set(AGENTRT_WARNINGS -Wall -Wextra -Wpedantic -Wshadow -Wnon-virtual-dtor
    -Wold-style-cast -Wcast-align -Woverloaded-virtual -Wnull-dereference)

# agentrt_library(NAME name SRCS ... [HDRS ...] [DEPS ...] [PRIVATE_DEPS ...])
# Creates agentrt_<name> with the alias agentrt::<name>. Headers are included as
# "<folder>/<header>.h" from the source root (and from include/agentrt when installed).
function(agentrt_library)
  cmake_parse_arguments(A "" "NAME" "SRCS;HDRS;DEPS;PRIVATE_DEPS" ${ARGN})
  if(NOT A_SRCS)  # a module whose sources are not written yet still links
    file(WRITE ${CMAKE_CURRENT_BINARY_DIR}/agentrt_${A_NAME}_empty.cc "// no sources yet\n")
    set(A_SRCS ${CMAKE_CURRENT_BINARY_DIR}/agentrt_${A_NAME}_empty.cc)
  endif()
  add_library(agentrt_${A_NAME} STATIC ${A_SRCS} ${A_HDRS})
  set(scope PUBLIC)
  add_library(agentrt::${A_NAME} ALIAS agentrt_${A_NAME})
  set_target_properties(agentrt_${A_NAME} PROPERTIES EXPORT_NAME ${A_NAME})
  target_include_directories(agentrt_${A_NAME} ${scope}
      $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}>
      $<BUILD_INTERFACE:${PROJECT_BINARY_DIR}>
      $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}/agentrt>)
  target_link_libraries(agentrt_${A_NAME} ${scope} ${A_DEPS})
  if(A_PRIVATE_DEPS)
    target_link_libraries(agentrt_${A_NAME} PRIVATE ${A_PRIVATE_DEPS})
  endif()
  target_compile_options(agentrt_${A_NAME} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:${AGENTRT_WARNINGS}>)
endfunction()

# agentrt_executable(NAME name SRCS ... [DEPS ...])
function(agentrt_executable)
  cmake_parse_arguments(A "" "NAME" "SRCS;DEPS" ${ARGN})
  add_executable(${A_NAME} ${A_SRCS})
  target_link_libraries(${A_NAME} PRIVATE ${A_DEPS})
  target_compile_options(${A_NAME} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:${AGENTRT_WARNINGS}>)
  set_target_properties(${A_NAME} PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${PROJECT_BINARY_DIR}/bin)
endfunction()

# agentrt_test(NAME name SRCS ... [DEPS ...] LABELS unit|integration|slurm|gpu|fault|torch
#              [TIMEOUT seconds] [COMMAND ...] [ENVIRONMENT ...])
# One Catch2 executable and one CTest entry. Every test has a timeout (default 120 s).
# COMMAND replaces the default `<exe>` invocation (e.g. to run it under mpirun);
# the token @EXE@ in COMMAND is replaced by the test executable.
function(agentrt_test)
  cmake_parse_arguments(A "" "NAME;TIMEOUT" "SRCS;DEPS;LABELS;COMMAND;ENVIRONMENT" ${ARGN})
  if(NOT A_TIMEOUT)
    set(A_TIMEOUT 120)
  endif()
  add_executable(${A_NAME} ${A_SRCS})
  target_link_libraries(${A_NAME} PRIVATE ${A_DEPS} agentrt_catch_main)
  target_include_directories(${A_NAME} PRIVATE ${PROJECT_SOURCE_DIR})  # tests/... helpers
  target_compile_options(${A_NAME} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:${AGENTRT_WARNINGS}>)
  set_target_properties(${A_NAME} PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${PROJECT_BINARY_DIR}/tests)
  if(A_COMMAND)
    list(TRANSFORM A_COMMAND REPLACE "@EXE@" "$<TARGET_FILE:${A_NAME}>")
    add_test(NAME ${A_NAME} COMMAND ${A_COMMAND})
  else()
    add_test(NAME ${A_NAME} COMMAND ${A_NAME})
  endif()
  set_tests_properties(${A_NAME} PROPERTIES LABELS "${A_LABELS}" TIMEOUT ${A_TIMEOUT}
      ENVIRONMENT "AGENTRT_BIN_DIR=${PROJECT_BINARY_DIR}/bin;AGENTRT_SOURCE_DIR=${PROJECT_SOURCE_DIR};${A_ENVIRONMENT}")
endfunction()

# agentrt_script_test(NAME name COMMAND ... LABELS ... [TIMEOUT s] [ENVIRONMENT ...])
# A test that is a script (bash/python) rather than a Catch2 executable.
function(agentrt_script_test)
  cmake_parse_arguments(A "" "NAME;TIMEOUT" "COMMAND;LABELS;ENVIRONMENT" ${ARGN})
  if(NOT A_TIMEOUT)
    set(A_TIMEOUT 120)
  endif()
  add_test(NAME ${A_NAME} COMMAND ${A_COMMAND})
  set_tests_properties(${A_NAME} PROPERTIES LABELS "${A_LABELS}" TIMEOUT ${A_TIMEOUT}
      ENVIRONMENT "AGENTRT_BIN_DIR=${PROJECT_BINARY_DIR}/bin;AGENTRT_SOURCE_DIR=${PROJECT_SOURCE_DIR};${A_ENVIRONMENT}")
endfunction()

# agentrt_bench(NAME name SRCS ... [DEPS ...]): the program bench_<name> in <build>/bench,
# run by `make bench`. It prints, last, one JSON object per line per figure.
function(agentrt_bench)
  cmake_parse_arguments(A "" "NAME" "SRCS;DEPS" ${ARGN})
  add_executable(bench_${A_NAME} ${A_SRCS})
  target_link_libraries(bench_${A_NAME} PRIVATE ${A_DEPS})
  target_compile_options(bench_${A_NAME} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:${AGENTRT_WARNINGS}>)
  set_target_properties(bench_${A_NAME} PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${PROJECT_BINARY_DIR}/bench)
endfunction()
