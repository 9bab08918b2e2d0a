# `agentctl run` on one machine, end to end: the real agentctl, the
# real test agent (tests/agent_runtime/test_agent.cc), real mpirun, real signals.
# Each scenario is its own test, bounded in time; ports are probed free by the test.
agentrt_python_scenarios(PREFIX agentctl_run
  SCRIPT ${CMAKE_CURRENT_LIST_DIR}/agentctl_run_test.py
  SCENARIOS env_contract restart failing kill_controller busy_port workdir resume mpi_rank_failure
            config_error fresh_after_corrupt last_checkpoint bye_linger python_stall crash_loop
            stop_resume tls tls_run_ca from_run replan
  LABELS integration
  TIMEOUT 120)
set_tests_properties(agentctl_run_tls PROPERTIES SKIP_RETURN_CODE 77)  # no openssl

# Shared machines: four runs at once on one machine (fault: what users came to agentrt to escape).
agentrt_script_test(NAME agentctl_run_concurrent
  COMMAND ${AGENTRT_PYTHON} ${CMAKE_CURRENT_LIST_DIR}/agentctl_run_test.py concurrent
  LABELS integration fault
  TIMEOUT 180)

# The fault suite: a kill loop over random ranks, and a SIGSTOP during a short demo.
agentrt_script_test(NAME agentctl_run_kill_loop
  COMMAND ${AGENTRT_PYTHON} ${CMAKE_CURRENT_LIST_DIR}/agentctl_run_test.py kill_loop
  LABELS integration fault
  TIMEOUT 240)
agentrt_script_test(NAME agentctl_run_sigstop_demo
  COMMAND ${AGENTRT_PYTHON} ${CMAKE_CURRENT_LIST_DIR}/agentctl_run_test.py sigstop_demo
  LABELS integration fault
  TIMEOUT 300)
set_tests_properties(agentctl_run_sigstop_demo PROPERTIES RUN_SERIAL TRUE)

# Collective hang detection: skip / sleep / deadlock, and 60 s of a slow healthy agent.
agentrt_script_test(NAME agentctl_run_hangs
  COMMAND ${AGENTRT_PYTHON} ${CMAKE_CURRENT_LIST_DIR}/agentctl_run_test.py hangs
  LABELS integration fault
  TIMEOUT 240)

# agentctl check: the preflight sweep, a busy port, --strict.
agentrt_python_scenarios(PREFIX agentctl_check
  SCRIPT ${CMAKE_CURRENT_LIST_DIR}/agentctl_check_test.py
  SCENARIOS sweep busy_port strict
  LABELS integration
  TIMEOUT 120)
