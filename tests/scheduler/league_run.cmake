# Leagues and population-based training end to end: the example
# configs run as a user runs them, and a league that survives kill -9 of agentctl.
agentrt_python_scenarios(PREFIX league_run
  SCRIPT ${CMAKE_CURRENT_LIST_DIR}/league_run_test.py
  SCENARIOS pbt pbt_python league
  LABELS integration
  TIMEOUT 300)
agentrt_script_test(NAME league_run_resume
  COMMAND ${AGENTRT_PYTHON} ${CMAKE_CURRENT_LIST_DIR}/league_run_test.py league_resume
  LABELS integration fault
  TIMEOUT 420)
