# Checkpoints end to end with `agentctl run`: kill -9 of a rank of an agent
# that checkpoints every second; after the restart it resumes from its last commit.
agentrt_python_scenarios(PREFIX agent_runtime_checkpoint_e2e
  SCRIPT ${CMAKE_CURRENT_LIST_DIR}/checkpoint_e2e_test.py
  SCENARIOS single mpi_pair
  LABELS integration
  TIMEOUT 180)
