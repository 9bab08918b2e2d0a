# examples/pytorch_ddp through agentctl run; skipped where /usr/bin/python3 has no torch.
agentrt_script_test(NAME example_pytorch_ddp
  COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/pytorch_ddp_test.sh ${PROJECT_BINARY_DIR}
  LABELS torch
  TIMEOUT 300)
set_tests_properties(example_pytorch_ddp PROPERTIES SKIP_RETURN_CODE 77)
