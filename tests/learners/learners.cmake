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
