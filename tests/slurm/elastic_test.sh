#!/usr/bin/env bash
# An elastic agent (restart.elastic.min_ranks) on a 3-node test cluster
# (slurm/testcluster/start.sh --nodes 3, network namespaces) with no spare
# node (slurm.spare_nodes: 0), through `agentctl run --backend slurm`:
#   `wide` (agent-worker, 4 MPI ranks, two on each of n1 and n2) and `solo`
#   (n3) train and checkpoint; n2 dies (its slurmd and every process in its
#   namespace killed, the node marked down); with no spare to move to, `wide`
#   goes on with the 2 ranks of n1, resumed from its checkpoint re-sharded from
#   4 ranks onto 2, while `solo` is not touched and the allocation is not
#   requeued; status, agentctl status and plan.json say so. Then n2 comes
#   back and the allocation is preempted (USR2 to its batch shell): the
#   requeued job holds n2 again and `wide` grows back to its 4 planned ranks,
#   its checkpoint re-sharded from 2 ranks onto 4.
# Skips (77) where network namespaces cannot be made.
set -uo pipefail
# shellcheck source=slurm/testcluster/multinode_lib.sh
source "${AGENTRT_SOURCE_DIR:?}/slurm/testcluster/multinode_lib.sh"
start_cluster 3 --gpus 2 --cpus 4
mkdir -p "$state/el"
{
  agents_preamble elastic "$state/el" 0 "max_restarts: 5, backoff_s: 1, heartbeat_timeout_s: 4, grace_s: 2" \
    "interval_s: 1, keep_last: 100"
  cat <<YAML
  - name: wide
    gpus: 4   # two whole nodes, two ranks on each
    ranks: 4
    backend: mpi
    restart: {elastic: {min_ranks: 2}}
    command: [$bin/agent-worker]
    args: {env: cartpole, algo: ppo, steps: 1000000000}
YAML
  solo_worker solo
} >"$state/el/agents.yaml"
cd "$state/el" || fail "no $state/el"
submit_run "$state/el/runs/elastic-*"
on_failure() {
  echo "--- steps"; timeout 5 squeue -s 2>&1; timeout 5 scontrol show step 2>&1 | head -40
  echo "--- nodes"; timeout 5 sinfo -N 2>&1
  echo "--- slurmctld"; grep -E "StepId=[0-9]+\.0|step|n2" "$state/log/slurmctld.log" | tail -25
  echo "--- status"; "$bin/agentctl" status "$run" 2>&1
  echo "--- controller"; tail -30 "$run"/slurm-*.out
  for f in "$run"/logs/*/rank*.log "$run"/logs/*/srun.log; do echo "--- $f"; tail -8 "$f"; done
}

t=$(now)
until_status 90 "both agents training with a checkpoint, every rank heard from" \
  "all(a['state'] == 'running' and a['last_checkpoint_step'] is not None for a in A.values())
   and heard_since('wide', $t) and heard_since('solo', $t)"
check "nodes('wide') == ['n1', 'n1', 'n2', 'n2'] and nodes('solo') == ['n3']" \
  || { on_failure; fail "placement: wide on $(value "[r['node'] for r in A['wide']['ranks']]")"; }
solo_restarts=$(value "A['solo']['restarts']")
solo_step=$(value "A['solo']['step']")

t_kill=$(now)
kill_node n2
until_status 90 "wide to go on with n1's 2 ranks, restored from its checkpoint" \
  "nodes('wide') == ['n1', 'n1'] and A['wide']['state'] == 'running' and heard_since('wide', $t_kill)
   and (A['wide']['restored_step'] or -1) >= 0" || { on_failure; fail "wide did not shrink"; }
echo "node n2 killed: wide training again on n1 with 2 ranks after $(awk "BEGIN {print $(now) - $t_kill}") s"
check "A['solo']['restarts'] == $solo_restarts and A['solo']['step'] > $solo_step and A['solo']['state'] == 'running'" \
  || { on_failure; fail "solo was disturbed by n2's death"; }
check "S['requeue_reason'] == '' and any(f['node'] == 'n2' and f['agent'] == 'wide' and f['shrunk'] for f in S['node_failures'])" \
  || { on_failure; fail "status does not record wide going on without n2 (or the run requeued)"; }
timeout 5 scontrol show job "$job" -o | grep -q 'Restarts=0' || fail "the allocation was requeued"
"$bin/agentctl" status "$run" | grep -q "note: node n2 failed at .* UTC: wide goes on without it (restart.elastic)" \
  || fail "agentctl status does not say that wide went on without n2"
grep -q "re-sharded the checkpoint of 4 ranks onto 2" "$run/logs/wide/rank0.log" \
  || { tail -20 "$run/logs/wide/rank0.log"; fail "wide's rank 0 did not re-shard its checkpoint"; }
$py -c "import json,sys; p=json.load(open(sys.argv[1])); w=next(a for a in p['agents'] if a['name']=='wide'); assert w['ranks']==2 and w['planned_ranks']==4 and [x['node'] for x in w['placement']]==['n1'], w" \
  "$run/plan.json" || fail "plan.json does not hold wide's 2 ranks on n1 (4 planned)"
grep -h "goes on with the 2 rank(s) on n1" "$run"/slurm-*.out | head -1 \
  || fail "the controller did not say why wide shrank"
check "A['wide']['planned_ranks'] == 4" || fail "status does not say wide's planned size"
"$bin/agentctl" status "$run" | grep -q "note: agent wide runs 2 of its 4 planned ranks" \
  || fail "agentctl status does not say that wide runs 2 of its 4 planned ranks"

# n2 comes back; a preemption requeues the allocation, which holds n2 again.
revive_node n2
t_requeue=$(now)
timeout 10 scancel --signal=USR2 --batch "$job" || fail "cannot signal job $job"
until_status 240 "wide to grow back onto n1 and n2 with its 4 planned ranks after the requeue" \
  "nodes('wide') == ['n1', 'n1', 'n2', 'n2'] and A['wide']['state'] == 'running'
   and heard_since('wide', $t_requeue) and 'planned_ranks' not in A['wide']" \
  || { on_failure; fail "wide did not grow back"; }
echo "requeued with n2 back: wide training with 4 ranks after $(awk "BEGIN {print $(now) - $t_requeue}") s"
timeout 5 scontrol show job "$job" -o | grep -q 'Restarts=1' || fail "the allocation was not requeued once"
# Its ranks say hello before they restore: wait for the restore's line.
wait_until 60 "wide's rank 0 to re-shard its checkpoint 2 -> 4" \
  grep -q "re-sharded the checkpoint of 2 ranks onto 4" "$run/logs/wide/rank0.log"
$py -c "import json,sys; p=json.load(open(sys.argv[1])); w=next(a for a in p['agents'] if a['name']=='wide'); assert w['ranks']==4 and 'planned_ranks' not in w and [x['node'] for x in w['placement']]==['n1','n2'], w" \
  "$run/plan.json" || fail "plan.json does not hold wide's 4 ranks on n1 and n2 again"
grep -h "wide grows back to its 4 planned ranks on n1,n2" "$run"/slurm-*.out | head -1 \
  || fail "the controller did not say that wide grew back"
timeout 10 scancel "$job"
wait_job_gone "$job"
echo "elastic_test: PASS"
