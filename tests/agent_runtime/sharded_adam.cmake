# ShardedAdam and AdamW: single-rank tests (unit), and N = 1, 2, 3, 4 ranks under
# real mpirun against a single-process AdamW on the summed gradients (integration).
agentrt_test(NAME sharded_adam_test
  SRCS sharded_adam_test.cc
  DEPS agentrt::runtime
  LABELS unit
  TIMEOUT 60)

agentrt_test(NAME sharded_adam_mpi_test_np2
  SRCS sharded_adam_mpi_test.cc
  DEPS agentrt::runtime
  LABELS integration
  TIMEOUT 120
  COMMAND ${MPIEXEC_EXECUTABLE} --oversubscribe --allow-run-as-root -np 2 @EXE@
  ENVIRONMENT OMPI_MCA_btl_vader_single_copy_mechanism=none)
foreach(np 1 3 4)
  add_test(NAME sharded_adam_mpi_test_np${np}
           COMMAND ${MPIEXEC_EXECUTABLE} --oversubscribe --allow-run-as-root -np ${np}
                   $<TARGET_FILE:sharded_adam_mpi_test_np2>)
  set_tests_properties(sharded_adam_mpi_test_np${np} PROPERTIES LABELS integration TIMEOUT 120
                       ENVIRONMENT "OMPI_MCA_btl_vader_single_copy_mechanism=none")
endforeach()

# Re-sharding: N ranks save, M ranks resume (sharded_adam_reshard_test.cc).
agentrt_test(NAME sharded_adam_reshard_2to1
  SRCS sharded_adam_reshard_test.cc
  DEPS agentrt::runtime
  LABELS integration
  TIMEOUT 120
  COMMAND sh ${CMAKE_CURRENT_LIST_DIR}/reshard.sh ${MPIEXEC_EXECUTABLE} @EXE@ 2 1
          ${CMAKE_CURRENT_BINARY_DIR}/reshard-2to1)
foreach(pair "2;4" "4;3" "3;2")
  list(GET pair 0 from)
  list(GET pair 1 to)
  add_test(NAME sharded_adam_reshard_${from}to${to}
           COMMAND sh ${CMAKE_CURRENT_LIST_DIR}/reshard.sh ${MPIEXEC_EXECUTABLE}
                   $<TARGET_FILE:sharded_adam_reshard_2to1> ${from} ${to}
                   ${CMAKE_CURRENT_BINARY_DIR}/reshard-${from}to${to})
  set_tests_properties(sharded_adam_reshard_${from}to${to} PROPERTIES LABELS integration
                       TIMEOUT 120)
endforeach()
