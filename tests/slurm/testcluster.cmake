# The live SLURM test cluster (label slurm: scripts/test.sh starts it and
# sources its env.sh first; without SLURM_CONF these tests fail at once).
agentrt_script_test(NAME slurm_testcluster_test
  COMMAND ${CMAKE_CURRENT_LIST_DIR}/testcluster_test.sh
  LABELS slurm
  TIMEOUT 180)
