# The srun command line and the allocation script of `agentctl run --backend slurm`;
# submitting and following its job, and the driver's options inside it.
agentrt_test(NAME slurm_alloc_unit_test
  SRCS ${CMAKE_CURRENT_LIST_DIR}/alloc_unit_test.cc ${CMAKE_CURRENT_LIST_DIR}/allocation_test.cc
  DEPS agentrt::slurm
  LABELS unit
  TIMEOUT 60)
# slurm.steps: node: the SLURM backend's node steps with a fake spawner.
agentrt_test(NAME slurm_srun_node_steps_test
  SRCS ${CMAKE_CURRENT_LIST_DIR}/srun_node_steps_test.cc
  DEPS agentrt::slurm
  LABELS unit
  TIMEOUT 60)
