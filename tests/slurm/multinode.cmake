# The multi-node test cluster (slurm/testcluster/start.sh --nodes 3, network
# namespaces): starts and removes its own cluster; skipped without CAP_NET_ADMIN.
agentrt_script_test(NAME slurm_multinode_cluster_test
  COMMAND ${CMAKE_CURRENT_LIST_DIR}/multinode_cluster_test.sh
  LABELS slurm
  TIMEOUT 240)
set_tests_properties(slurm_multinode_cluster_test PROPERTIES SKIP_RETURN_CODE 77)
# Agents across nodes and node failover (slurm.spare_nodes) on its own 5-node cluster.
agentrt_script_test(NAME slurm_node_failover_test
  COMMAND ${CMAKE_CURRENT_LIST_DIR}/node_failover_test.sh
  LABELS slurm fault
  TIMEOUT 420)
set_tests_properties(slurm_node_failover_test PROPERTIES SKIP_RETURN_CODE 77)
# slurm.steps: node on its own 2-node cluster: one step per node, each agent
# still its own failure domain (restart alone, signalled alone, stop reaches all).
agentrt_script_test(NAME slurm_node_steps_test
  COMMAND ${CMAKE_CURRENT_LIST_DIR}/node_steps_test.sh
  LABELS slurm fault
  TIMEOUT 300)
set_tests_properties(slurm_node_steps_test PROPERTIES SKIP_RETURN_CODE 77)
# restart.elastic with no spare node: a 2-node agent goes on with its healthy node's ranks,
# its checkpoint re-sharded, on its own 3-node cluster.
agentrt_script_test(NAME slurm_elastic_test
  COMMAND ${CMAKE_CURRENT_LIST_DIR}/elastic_test.sh
  LABELS slurm fault
  TIMEOUT 600)
set_tests_properties(slurm_elastic_test PROPERTIES SKIP_RETURN_CODE 77)
# agentctl run --backend slurm --from OLD_RUN: an agent moved to another gpu_type and
# rank count (re-sharded), one dropped and one added, on its own 4-node cluster.
agentrt_script_test(NAME slurm_from_run_test
  COMMAND ${CMAKE_CURRENT_LIST_DIR}/from_run_test.sh
  LABELS slurm
  TIMEOUT 480)
set_tests_properties(slurm_from_run_test PROPERTIES SKIP_RETURN_CODE 77)
# A compressed stretch of failures on its own 6-node cluster (tests/slurm/soak_cluster_test.py):
# rank kills and stops, node deaths, partitions, requeues and preemptions from a fault injector
# with a fixed seed. The short run here; `make soak` runs it for 15 minutes.
agentrt_script_test(NAME slurm_soak_cluster
  COMMAND ${AGENTRT_PYTHON} ${CMAKE_CURRENT_LIST_DIR}/soak_cluster_test.py --seconds 60
  LABELS slurm soak fault
  TIMEOUT 900
  ENVIRONMENT AGENTRT_CLOCK_SHIM=$<TARGET_FILE:agentrt_clock_offset>)
set_tests_properties(slurm_soak_cluster PROPERTIES SKIP_RETURN_CODE 77)
