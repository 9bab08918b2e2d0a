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
  agentrt_test_properties("${A_NAME}" "${A_TIMEOUT}" "${A_LABELS}" "${A_ENVIRONMENT}")
endfunction()

# agentrt_test_program(NAME name SRCS ... [DEPS ...] [SHARED])
# A program (or, SHARED, an LD_PRELOAD-able library) that tests start, not a test
# itself: built with the project's warnings into the build's tests/ folder, next
# to the test executables.
function(agentrt_test_program)
  cmake_parse_arguments(A "SHARED" "NAME" "SRCS;DEPS" ${ARGN})
  if(A_SHARED)
    add_library(${A_NAME} SHARED ${A_SRCS})
  else()
    add_executable(${A_NAME} ${A_SRCS})
  endif()
  target_link_libraries(${A_NAME} PRIVATE ${A_DEPS})
  target_compile_options(${A_NAME} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:${AGENTRT_WARNINGS}>)
  set_target_properties(${A_NAME} PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${PROJECT_BINARY_DIR}/tests
                                             LIBRARY_OUTPUT_DIRECTORY ${PROJECT_BINARY_DIR}/tests)
endfunction()

# agentrt_script_test(NAME name COMMAND ... LABELS ... [TIMEOUT s] [ENVIRONMENT ...])
# A test that is a script (bash/python) rather than a Catch2 executable.
function(agentrt_script_test)
  cmake_parse_arguments(A "" "NAME;TIMEOUT" "COMMAND;LABELS;ENVIRONMENT" ${ARGN})
  add_test(NAME ${A_NAME} COMMAND ${A_COMMAND})
  agentrt_test_properties("${A_NAME}" "${A_TIMEOUT}" "${A_LABELS}" "${A_ENVIRONMENT}")
endfunction()

# agentrt_python_scenarios(PREFIX prefix SCRIPT file.py SCENARIOS ... LABELS ...
#                          [TIMEOUT s] [ENVIRONMENT ...])
# One script test per scenario, <prefix>_<scenario>, each `python3 file.py <scenario>`.
function(agentrt_python_scenarios)
  cmake_parse_arguments(A "" "PREFIX;SCRIPT;TIMEOUT" "SCENARIOS;LABELS;ENVIRONMENT" ${ARGN})
  foreach(scenario ${A_SCENARIOS})
    agentrt_script_test(NAME ${A_PREFIX}_${scenario}
      COMMAND ${AGENTRT_PYTHON} ${A_SCRIPT} ${scenario}
      LABELS ${A_LABELS}
      TIMEOUT ${A_TIMEOUT}
      ENVIRONMENT ${A_ENVIRONMENT})
  endforeach()
endfunction()

# The labels, timeout (default 120 s) and environment every test gets: where the
# programs and the sources are, and the test's own variables.
function(agentrt_test_properties name timeout labels environment)
  if(NOT timeout)
    set(timeout 120)
  endif()
  set_tests_properties(${name} PROPERTIES LABELS "${labels}" TIMEOUT ${timeout}
      ENVIRONMENT "AGENTRT_BIN_DIR=${PROJECT_BINARY_DIR}/bin;AGENTRT_SOURCE_DIR=${PROJECT_SOURCE_DIR};${environment}")
endfunction()

# Adds every sub-folder of the calling folder that has a CMakeLists.txt (one per program).
function(agentrt_program_dirs)
  file(GLOB children RELATIVE ${CMAKE_CURRENT_SOURCE_DIR} CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/*)
  list(SORT children)
  foreach(child ${children})
    if(EXISTS ${CMAKE_CURRENT_SOURCE_DIR}/${child}/CMakeLists.txt)
      add_subdirectory(${child})
    endif()
  endforeach()
endfunction()

# agentrt_bench(NAME name SRCS ... [DEPS ...]): the program bench_<name> in <build>/bench,
# run by `make bench`. It prints, last, one JSON object per line per figure.
# agentrt_script_bench(NAME name COMMAND argv... [ENV NAME=value...]): the script
# bench_<name> in <build>/bench (a generated wrapper that sets AGENTRT_BIN_DIR,
# AGENTRT_SOURCE_DIR and ENV, then execs COMMAND with its arguments), for a
# benchmark written as a script rather than a program.
function(agentrt_script_bench)
  cmake_parse_arguments(A "" "NAME" "COMMAND;ENV" ${ARGN})
  set(exports "")
  foreach(e ${A_ENV})
    string(APPEND exports "export ${e}\n")
  endforeach()
  list(JOIN A_COMMAND " " command)
  file(GENERATE OUTPUT ${PROJECT_BINARY_DIR}/bench/bench_${A_NAME} CONTENT "#!/bin/sh
# Generated by agentrt_script_bench (cmake/agentrt.cmake) for bench_${A_NAME}.
export AGENTRT_BIN_DIR=${PROJECT_BINARY_DIR}/bin
export AGENTRT_SOURCE_DIR=${PROJECT_SOURCE_DIR}
${exports}exec ${command} \"$@\"
" FILE_PERMISSIONS OWNER_READ OWNER_WRITE OWNER_EXECUTE GROUP_READ GROUP_EXECUTE WORLD_READ WORLD_EXECUTE)
endfunction()

function(agentrt_bench)
  cmake_parse_arguments(A "" "NAME" "SRCS;DEPS" ${ARGN})
  add_executable(bench_${A_NAME} ${A_SRCS})
  target_link_libraries(bench_${A_NAME} PRIVATE ${A_DEPS})
  target_compile_options(bench_${A_NAME} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:${AGENTRT_WARNINGS}>)
  set_target_properties(bench_${A_NAME} PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${PROJECT_BINARY_DIR}/bench)
endfunction()
