# `agentctl run --backend slurm` (allocation mode) against the live SLURM test
# cluster (label slurm): real sbatch, srun steps, scancel signals and requeue.
foreach(scenario complete preempt kill_rank interrupt stop infeasible pbt)
  agentrt_script_test(NAME slurm_alloc_${scenario}
    COMMAND ${AGENTRT_PYTHON} ${CMAKE_CURRENT_LIST_DIR}/alloc_test.py ${scenario}
    LABELS slurm
    TIMEOUT 240)
endforeach()
