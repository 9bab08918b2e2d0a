# `agentctl sbatch` script generation and the array-task environment. No SLURM needed.
agentrt_test(NAME slurm_sbatch_test
  SRCS ${CMAKE_CURRENT_LIST_DIR}/sbatch_writer_test.cc ${CMAKE_CURRENT_LIST_DIR}/array_task_test.cc
  DEPS agentrt::slurm
  LABELS unit
  TIMEOUT 60)
