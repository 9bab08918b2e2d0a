# Checkpoints end to end with `agentctl run`: kill -9 of a rank of an agent
# that checkpoints every second; after the restart it resumes from its last commit.
foreach(scenario single mpi_pair)
  agentrt_script_test(NAME agent_runtime_checkpoint_e2e_${scenario}
    COMMAND ${AGENTRT_PYTHON} ${CMAKE_CURRENT_LIST_DIR}/checkpoint_e2e_test.py ${scenario}
    LABELS integration
    TIMEOUT 180)
endforeach()
