# examples/custom_env built outside the tree against the installed package and
# run through agentctl (needs every installed target built: run after a full build).
agentrt_script_test(NAME example_custom_env
  COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/custom_env_test.sh ${PROJECT_BINARY_DIR}
  LABELS integration
  TIMEOUT 600)
