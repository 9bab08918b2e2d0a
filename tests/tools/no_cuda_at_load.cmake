# The programs and libagentrt_c.so do not need CUDA or NCCL at load time.
agentrt_script_test(NAME tools_no_cuda_at_load_test
  COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/no_cuda_at_load_test.sh
  LABELS unit
  TIMEOUT 30)
