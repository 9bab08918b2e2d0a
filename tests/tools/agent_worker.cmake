# agent-worker: its pieces (unit) and the program itself (integration scripts).
agentrt_test(NAME agent_worker_unit_test
  SRCS agent_worker_unit_test.cc
  DEPS agent_worker_core
  LABELS unit
  TIMEOUT 60)

agentrt_script_test(NAME agent_worker_standalone
  COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/agent_worker_standalone_test.sh ${PROJECT_BINARY_DIR}
  LABELS integration
  TIMEOUT 300)

# The demo's acceptance through `agentctl run`: the demo (captures vs random
# predators, snapshots over the bus, curves and plots) and kill -9 of a rank.
agentrt_script_test(NAME agent_worker_demo
  COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/agent_worker_demo_test.sh ${PROJECT_BINARY_DIR}
  LABELS integration
  TIMEOUT 480)
set_tests_properties(agent_worker_demo PROPERTIES RUN_SERIAL TRUE)

agentrt_script_test(NAME agent_worker_kill
  COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/agent_worker_kill_test.sh ${PROJECT_BINARY_DIR}
  LABELS integration fault
  TIMEOUT 480)
set_tests_properties(agent_worker_kill PROPERTIES RUN_SERIAL TRUE)

# League play against the real league service on a real bus (loopback).
agentrt_test(NAME agent_worker_league_play_test
  SRCS agent_worker_league_play_test.cc
  DEPS agent_worker_core agentrt::scheduler
  LABELS integration
  TIMEOUT 60)
