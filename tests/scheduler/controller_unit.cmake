# Run controller: the supervision state machine with a fake backend and a fake
# clock (no sleeps), the status.json model, the run directory, and the local
# backend's real fork/exec path (process groups, environment, port probing).
agentrt_test(NAME scheduler_controller_test
  SRCS ${CMAKE_CURRENT_LIST_DIR}/controller_test.cc
  DEPS agentrt::scheduler
  LABELS unit
  TIMEOUT 60)
agentrt_test(NAME scheduler_local_backend_test
  SRCS ${CMAKE_CURRENT_LIST_DIR}/controller_local_backend_test.cc
  DEPS agentrt::scheduler
  LABELS unit
  TIMEOUT 60)
agentrt_test(NAME scheduler_local_backend_fake_test
  SRCS ${CMAKE_CURRENT_LIST_DIR}/local_backend_fake_test.cc
  DEPS agentrt::scheduler
  LABELS unit
  TIMEOUT 60)
agentrt_test(NAME scheduler_run_driver_test
  SRCS ${CMAKE_CURRENT_LIST_DIR}/run_driver_test.cc
  DEPS agentrt::scheduler
  LABELS unit
  TIMEOUT 60)
agentrt_test(NAME scheduler_node_failover_test
  SRCS ${CMAKE_CURRENT_LIST_DIR}/node_failover_test.cc
  DEPS agentrt::scheduler
  LABELS unit
  TIMEOUT 60)
agentrt_test(NAME scheduler_league_test
  SRCS ${CMAKE_CURRENT_LIST_DIR}/league_test.cc
  DEPS agentrt::scheduler
  LABELS unit
  TIMEOUT 60)
# The league service on a real gRPC bus over loopback.
agentrt_test(NAME scheduler_league_service_test
  SRCS ${CMAKE_CURRENT_LIST_DIR}/league_service_test.cc
  DEPS agentrt::scheduler
  LABELS integration
  TIMEOUT 60)
agentrt_test(NAME scheduler_pbt_service_test
  SRCS ${CMAKE_CURRENT_LIST_DIR}/pbt_service_test.cc
  DEPS agentrt::scheduler
  LABELS unit
  TIMEOUT 60)
