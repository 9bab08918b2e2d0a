# Environments: Gymnasium-exact cartpole, pursuit rules, registry, pool.
agentrt_test(NAME envs_cartpole_test SRCS cartpole_test.cc DEPS agentrt::envs
             LABELS unit TIMEOUT 60)
agentrt_test(NAME envs_pursuit_test SRCS pursuit_test.cc DEPS agentrt::envs
             LABELS unit TIMEOUT 60)
agentrt_test(NAME envs_registry_test SRCS registry_test.cc DEPS agentrt::envs
             LABELS unit TIMEOUT 60)
agentrt_test(NAME envs_pool_test SRCS env_pool_test.cc DEPS agentrt::envs
             LABELS unit TIMEOUT 60)
# Its own binary: it replaces the global operator new to count allocations.
agentrt_test(NAME envs_pool_alloc_test SRCS env_pool_alloc_test.cc DEPS agentrt::envs
             LABELS unit TIMEOUT 60)
