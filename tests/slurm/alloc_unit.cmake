# The srun command line and the allocation script of `agentctl run --backend slurm`.
agentrt_test(NAME slurm_alloc_unit_test
  SRCS ${CMAKE_CURRENT_LIST_DIR}/alloc_unit_test.cc
  DEPS agentrt::slurm
  LABELS unit
  TIMEOUT 60)
