# A compressed stretch of failures (tests/tools/soak_test.py): SIGKILL and SIGSTOP of ranks,
# kill -9 of the controller and `agentctl resume`, from a fault injector with a fixed seed. The
# short run here; `make soak` runs it for 15 minutes.
agentrt_script_test(NAME agentctl_soak_short
  COMMAND ${AGENTRT_PYTHON} ${CMAKE_CURRENT_LIST_DIR}/soak_test.py --seconds 30
  LABELS soak fault integration
  TIMEOUT 300)
