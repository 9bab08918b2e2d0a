# The run's broker process (agentrt-bus started and supervised by the run driver).
agentrt_test(NAME scheduler_broker_process_test
  SRCS ${CMAKE_CURRENT_LIST_DIR}/broker_process_test.cc
  DEPS agentrt::scheduler
  LABELS integration fault
  TIMEOUT 120)
add_dependencies(scheduler_broker_process_test agentrt-bus)
# Its supervision over a fake spawner and a clock moved by hand.
agentrt_test(NAME scheduler_broker_process_unit_test
  SRCS ${CMAKE_CURRENT_LIST_DIR}/broker_process_unit_test.cc
  DEPS agentrt::scheduler
  LABELS unit)
