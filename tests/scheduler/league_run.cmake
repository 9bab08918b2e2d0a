# Leagues and population-based training end to end: the example
# configs run as a user runs them, and a league that survives kill -9 of agentctl.
foreach(scenario pbt pbt_python league)
  agentrt_script_test(NAME league_run_${scenario}
    COMMAND ${AGENTRT_PYTHON} ${CMAKE_CURRENT_LIST_DIR}/league_run_test.py ${scenario}
    LABELS integration
    TIMEOUT 300)
endforeach()
agentrt_script_test(NAME league_run_resume
  COMMAND ${AGENTRT_PYTHON} ${CMAKE_CURRENT_LIST_DIR}/league_run_test.py league_resume
  LABELS integration fault
  TIMEOUT 420)
