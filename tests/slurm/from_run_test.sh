#!/usr/bin/env bash
# `agentctl run agents.yaml --backend slurm --from OLD_RUN_DIR` on a 4-node test
# cluster (slurm/testcluster/start.sh --nodes 4 --gpu-types a100,h100: n1 and n3
# a100, n2 and n4 h100, two fake GPUs each), the config changed between runs:
#   run 1: `pred` (agent-worker, 2 MPI ranks, gpu_type a100: one a100 node) and
#          `gone` train and checkpoint; the job is cancelled.
#   run 2: `pred` now asks for 4 ranks of gpu_type h100 (both h100 nodes), `gone`
#          is no longer in the config and `fresh` is new. The new run starts
#          `pred` from run 1's newest verified checkpoint, re-sharded from 2
#          ranks onto 4, on the h100 nodes; `fresh` starts fresh and `gone` is
#          named as left behind; every one of them says so.
# Skips (77) where network namespaces cannot be made.
set -uo pipefail
# shellcheck source=slurm/testcluster/multinode_lib.sh
source "${AGENTRT_SOURCE_DIR:?}/slurm/testcluster/multinode_lib.sh"
start_cluster 4 --gpus 2 --cpus 4 --gpu-types a100,h100

# agents_yaml DIR RUN PRED_RANKS PRED_TYPE OTHER: an agents.yaml in DIR.
agents_yaml() {
  mkdir -p "$1"
  {
    agents_preamble "$2" "$1" 0 "max_restarts: 2, backoff_s: 1, heartbeat_timeout_s: 10, grace_s: 2" \
      "interval_s: 1, keep_last: 5"
    cat <<YAML
  - name: pred
    gpus: $3
    ranks: $3
    gpu_type: $4
    backend: mpi
    command: [$bin/agent-worker]
    args: {env: cartpole, algo: ppo, steps: 1000000000}
YAML
    solo_worker "$5"
  } >"$1/agents.yaml"
}
on_failure() {
  echo "--- status"; "$bin/agentctl" status "$run" 2>&1
  echo "--- controller"; tail -30 "$run"/slurm-*.out
  for f in "$run"/logs/*/rank0.log; do echo "--- $f"; tail -8 "$f"; done
}

# Run 1: pred on an a100 node.
agents_yaml "$state/one" first 2 a100 gone
cd "$state/one" || fail "no $state/one"
submit_run "$state/one/runs/first-*"
until_status 90 "both agents training with a checkpoint" \
  "all(a['state'] == 'running' and (a['last_checkpoint_step'] or 0) > 0 for a in A.values())"
check "nodes('pred') in (['n1', 'n1'], ['n3', 'n3'])" \
  || { on_failure; fail "pred is not on an a100 node: $(value "nodes('pred')")"; }
saved=$(value "A['pred']['last_checkpoint_step']")
first=$run
timeout 10 scancel "$job"
wait_job_gone "$job"

# Run 2: pred on both h100 nodes with 4 ranks, gone dropped, fresh added.
agents_yaml "$state/two" second 4 h100 fresh
cd "$state/two" || fail "no $state/two"
timeout 60 "$bin/agentctl" run agents.yaml --backend slurm --detach --from "$first" >submit.log 2>&1 \
  || { cat submit.log; fail "agentctl run --backend slurm --from failed"; }
grep -q "agent pred starts from step [0-9]* of run first (saved by 2 ranks, re-sharded onto 4)" submit.log \
  || { cat submit.log; fail "agentctl run --from does not say that pred starts from run 1"; }
grep -q "run first has no agent fresh; it starts fresh" submit.log \
  || { cat submit.log; fail "agentctl run --from does not say that fresh starts fresh"; }
grep -q "agent gone of run first is not in this run; its checkpoints stay in" submit.log \
  || { cat submit.log; fail "agentctl run --from does not name gone as left behind"; }
job=$(grep -o 'submitted job [0-9]*' submit.log | awk '{print $3}')
run=$(ls -d "$state"/two/runs/second-*)
until_status 90 "pred training with 4 ranks on the h100 nodes, restored from run 1" \
  "nodes('pred') == ['n2', 'n2', 'n4', 'n4'] and A['pred']['state'] == 'running'
   and (A['pred']['restored_step'] or -1) >= $saved" || { on_failure; fail "pred did not resume on h100"; }
wait_until 60 "pred's rank 0 to re-shard run 1's checkpoint 2 -> 4" \
  grep -q "re-sharded the checkpoint of 2 ranks onto 4" "$run/logs/pred/rank0.log"
until_status 60 "fresh training from a fresh start" \
  "A['fresh']['state'] == 'running' and A['fresh']['restored_step'] == -1"
check "'gone' not in A" || fail "gone is in the new run"
echo "run --from: pred resumed at step $(value "A['pred']['restored_step']") (run 1 saved >= $saved) on n2,n4 with 4 ranks"
timeout 10 scancel "$job"
wait_job_gone "$job"
echo "from_run_test: PASS"
