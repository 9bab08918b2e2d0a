# `agentctl sbatch` output submitted to the live SLURM test cluster (label slurm).
agentrt_test(NAME slurm_sbatch_live_test
  SRCS ${CMAKE_CURRENT_LIST_DIR}/sbatch_live_test.cc
  DEPS agentrt::slurm agentrt::comms
  LABELS slurm
  TIMEOUT 300)
