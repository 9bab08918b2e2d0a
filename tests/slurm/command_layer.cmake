# The SLURM command layer: output parsers, SlurmClient over a fake runner, and
# the real process runner. No SLURM needed.
agentrt_test(NAME slurm_command_layer_test
  SRCS ${CMAKE_CURRENT_LIST_DIR}/parse_test.cc ${CMAKE_CURRENT_LIST_DIR}/slurm_client_test.cc
       ${CMAKE_CURRENT_LIST_DIR}/command_runner_test.cc
  DEPS agentrt::slurm
  LABELS unit
  TIMEOUT 60)
