# PPO learner: the maths (gradient check), the learner's contract, and the
# acceptance runs (cartpole solved with 1 rank and with 2 MPI ranks).
agentrt_test(NAME learners_actor_critic_test SRCS actor_critic_test.cc DEPS agentrt::learners
             LABELS unit TIMEOUT 60)
agentrt_test(NAME learners_ppo_test SRCS ppo_test.cc DEPS agentrt::learners
             LABELS unit TIMEOUT 60)
agentrt_test(NAME learners_policy_snapshot_test SRCS policy_snapshot_test.cc
             DEPS agentrt::learners LABELS unit TIMEOUT 60)
agentrt_test(NAME learners_cartpole_ppo_test SRCS cartpole_ppo_test.cc DEPS agentrt::learners
             LABELS integration TIMEOUT 300)
add_test(NAME learners_cartpole_ppo_test_np2
         COMMAND ${MPIEXEC_EXECUTABLE} --oversubscribe --allow-run-as-root -np 2
                 $<TARGET_FILE:learners_cartpole_ppo_test>)
set_tests_properties(learners_cartpole_ppo_test_np2 PROPERTIES LABELS integration TIMEOUT 300
  ENVIRONMENT "OMPI_MCA_btl_vader_single_copy_mechanism=none;OMPI_MCA_rmaps_base_oversubscribe=1")
agentrt_test(NAME learners_pursuit_ppo_test SRCS pursuit_ppo_test.cc DEPS agentrt::learners
             LABELS integration TIMEOUT 300)

# A trainer's checkpoint re-sharded: N ranks save, M ranks resume (ppo_reshard_test.cc).
agentrt_test(NAME learners_ppo_reshard_2to1
  SRCS ppo_reshard_test.cc
  DEPS agentrt::learners
  LABELS integration
  TIMEOUT 180
  COMMAND sh ${PROJECT_SOURCE_DIR}/tests/agent_runtime/reshard.sh ${MPIEXEC_EXECUTABLE} @EXE@ 2 1
          ${CMAKE_CURRENT_BINARY_DIR}/ppo-reshard-2to1)
foreach(pair "2;4" "4;3" "3;2")
  list(GET pair 0 from)
  list(GET pair 1 to)
  add_test(NAME learners_ppo_reshard_${from}to${to}
           COMMAND sh ${PROJECT_SOURCE_DIR}/tests/agent_runtime/reshard.sh ${MPIEXEC_EXECUTABLE}
                   $<TARGET_FILE:learners_ppo_reshard_2to1> ${from} ${to}
                   ${CMAKE_CURRENT_BINARY_DIR}/ppo-reshard-${from}to${to})
  set_tests_properties(learners_ppo_reshard_${from}to${to} PROPERTIES LABELS integration
                       TIMEOUT 180)
endforeach()
