# `agentctl run` on one machine (issue 3), end to end: the real agentctl, the
# real test agent (tests/agent_runtime/test_agent.cc), real mpirun, real signals.
# Each scenario is its own test, bounded in time; ports are probed free by the test.
foreach(scenario env_contract restart failing kill_controller busy_port)
  agentrt_script_test(NAME agentctl_run_${scenario}
    COMMAND /usr/bin/python3 ${CMAKE_CURRENT_LIST_DIR}/agentctl_run_test.py ${scenario}
    LABELS integration
    TIMEOUT 120)
endforeach()
