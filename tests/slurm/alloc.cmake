# `agentctl run --backend slurm` (allocation mode) against the live SLURM test
# cluster (label slurm): real sbatch, srun steps, scancel signals and requeue.
agentrt_python_scenarios(PREFIX slurm_alloc
  SCRIPT ${CMAKE_CURRENT_LIST_DIR}/alloc_test.py
  SCENARIOS complete preempt kill_rank interrupt stop infeasible pbt
  LABELS slurm
  TIMEOUT 240)
