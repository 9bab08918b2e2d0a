# examples/weights through agentctl run; skipped where /usr/bin/python3 has no NumPy.
agentrt_script_test(NAME example_weights
  COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/weights_test.sh ${PROJECT_BINARY_DIR}
  LABELS integration
  TIMEOUT 180)
set_tests_properties(example_weights PROPERTIES SKIP_RETURN_CODE 77)
