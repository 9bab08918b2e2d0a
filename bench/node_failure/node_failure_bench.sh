#!/usr/bin/env bash
# bench_node_failure: a node dies under a running job; how long until work
# resumes? On a 4-node test cluster (slurm/testcluster/start.sh, network
# namespaces), fresh for every repetition:
#   agentrt:  `agentctl run --backend slurm` with slurm.spare_nodes: 1 and two
#             agent-worker agents, `keep` on n1 and `move` on n2. n2 dies (its
#             slurmd and every process in its namespace killed, the node marked
#             down). Figure: the kill to `move` training again on the spare
#             (its restore report: it has resumed from its checkpoint).
#   anchor:   SLURM's own answer: a plain `sbatch --requeue -N2` job running the
#             same two ranks with srun; its second node dies the same way; SLURM
#             requeues the whole job. Figure: the kill to both ranks running again.
#   elastic:  the same with slurm.spare_nodes: 0 and `wide` (2 MPI ranks, one
#             on each of n1 and n2, restart.elastic.min_ranks 1) beside `keep`;
#             wide's second node dies. Figure: the kill to `wide` training
#             again shrunk to 1 rank on its healthy node, restored from its
#             checkpoint re-sharded (no requeue), against the same anchor.
#   also:     the steps `keep` lost (0 when it was never restarted), against
#             the steps a whole-job requeue would have cost it (those since its
#             last checkpoint at the moment of the kill).
# The test cluster sets SLURM's requeue hold (cred_expire) to 10 s, not the
# default 120 s: the anchor is faster here than on a stock SLURM.
# Medians over --reps N (default 3). Prints one JSON line per figure.
# Needs root (network namespaces); says "skipped" and exits 0 otherwise.
set -uo pipefail
reps=3
[ "${1:-}" = "--reps" ] && reps=${2:?}
MULTINODE_SKIP_CODE=0
# shellcheck source=slurm/testcluster/multinode_lib.sh
source "${AGENTRT_SOURCE_DIR:?}/slurm/testcluster/multinode_lib.sh"
fresh_cluster() {
  "$src/slurm/testcluster/stop.sh" "$state" >/dev/null 2>&1
  rm -rf "$state" && mkdir -p "$state"
  start_cluster 4 --gpus 1 --cpus 4 >/dev/null
}
status() { run_status "$run" "$1"; }
wait_period=0.05  # the figures are timed by these waits
wait_status() { wait_until "$1" "$2" status_holds "$run" "$2"; }  # SECONDS EXPR

# submit DIR NAME SPARE_NODES AGENT...: agentctl run --backend slurm of a config
# in DIR whose agents are the given YAML flow maps, each an agent-worker
# training CartPole; sets job and run.
submit() {
  local dir=$1 name=$2 spare=$3
  shift 3
  mkdir -p "$dir"
  {
    agents_preamble "$name" "$dir" "$spare" \
      "max_restarts: 3, backoff_s: 0.5, heartbeat_timeout_s: 10, grace_s: 2" "interval_s: 2, keep_last: 3"
    for a in "$@"; do
      echo "  - {$a, command: [$bin/agent-worker], args: {env: cartpole, algo: ppo, steps: 1000000000}}"
    done
  } >"$dir/agents.yaml"
  cd "$dir" || fail "no $dir"
  submit_run "$dir/runs/$name-*"
}

agentrt_s=() anchor_s=() lost=() would_lose=() elastic_s=()
for ((r = 0; r < reps; ++r)); do
  # --- agentrt, elastic: no spare; the 2-node agent goes on with 1 rank
  fresh_cluster
  submit "$work/e$r" elastic 0 "name: wide, gpus: 2, ranks: 2, backend: mpi, restart: {elastic: {min_ranks: 1}}" \
    "name: keep, gpus: 1, backend: single"
  wait_status 90 "all(a['state'] == 'running' and a['last_checkpoint_step'] is not None for a in A.values())"
  victim=$(status "A['wide']['ranks'][1]['node']")
  t0=$(now)
  kill_node "$victim"
  wait_status 120 "A['wide']['restarts'] >= 1 and A['wide']['state'] == 'running' and A['wide'].get('planned_ranks') == 2 and len(A['wide']['ranks']) == 1 and (A['wide']['restored_step'] or -1) >= 0"
  t1=$(now)
  elastic_s+=("$(awk "BEGIN {print $t1 - $t0}")")
  timeout 10 scancel "$job"
  wait_job_gone "$job"

  fresh_cluster
  # --- agentrt
  submit "$work/a$r" nodefail 1 "name: keep, gpus: 1, backend: single" "name: move, gpus: 1, backend: single"
  wait_status 90 "all(a['state'] == 'running' and a['last_checkpoint_step'] is not None for a in A.values())"
  victim=$(status "A['move']['ranks'][0]['node']")
  keep_node=$(status "A['keep']['ranks'][0]['node']")
  [ "$victim" != "$keep_node" ] || fail "keep and move share node $victim"
  t0=$(now)
  kill_node "$victim"
  keep_step=$(status "A['keep']['step']")
  keep_ckpt=$(status "A['keep']['last_checkpoint_step']")
  wait_status 120 "A['move']['restarts'] >= 1 and A['move']['state'] == 'running' and (A['move']['restored_step'] or -1) >= 0 and A['move']['ranks'][0]['node'] != '$victim'"
  t1=$(now)
  agentrt_s+=("$(awk "BEGIN {print $t1 - $t0}")")
  [ "$(status "A['keep']['restarts']")" = 0 ] && [ "$(status "A['keep']['step'] > $keep_step")" = 1 ] \
    && lost+=(0) || lost+=("$((keep_step - $(status "A['keep']['restored_step'] or 0")))")
  would_lose+=("$((keep_step - keep_ckpt))")
  timeout 10 scancel "$job"
  wait_job_gone "$job"

  # --- anchor: plain SLURM, requeue of the whole job
  mkdir -p "$work/p$r/seen"
  cat >"$work/p$r/rank.sh" <<'SH'
#!/bin/bash
f="$1/${SLURM_RESTART_COUNT:-0}.$SLURM_PROCID"
echo "$(date +%s.%N) $SLURMD_NODENAME" >"$f.tmp" && mv "$f.tmp" "$f.start"
exec sleep 1000
SH
  cat >"$work/p$r/plain.sbatch" <<SH
#!/bin/bash
#SBATCH --job-name=plain -N2 --ntasks-per-node=1 --gres=gpu:1 --requeue
#SBATCH --output=$work/p$r/plain-%j.out --open-mode=append
srun -N2 -n2 bash $work/p$r/rank.sh $work/p$r/seen
SH
  pjob=$(timeout 20 sbatch --parsable "$work/p$r/plain.sbatch") || fail "sbatch of the anchor failed"
  wait_until 60 "the anchor's two ranks to start" sh -c "[ \$(ls $work/p$r/seen/0.*.start 2>/dev/null | wc -l) -eq 2 ]"
  pvictim=$(awk '{print $2}' "$work/p$r/seen/0.1.start")
  t0=$(now)
  kill_node "$pvictim"
  wait_until 180 "SLURM to requeue the anchor and start both ranks again" \
    sh -c "[ \$(ls $work/p$r/seen/1.*.start 2>/dev/null | wc -l) -eq 2 ]"
  t1=$(cat "$work/p$r"/seen/1.*.start | awk '{print $1}' | sort -n | tail -1)
  anchor_s+=("$(awk "BEGIN {print $t1 - $t0}")")
  timeout 10 scancel "$pjob"
  wait_job_gone "$pjob"
  echo "rep $r: agentrt ${agentrt_s[-1]} s (move left $victim), elastic (shrunk) ${elastic_s[-1]} s, SLURM requeue ${anchor_s[-1]} s; keep lost ${lost[-1]} steps (a requeue: ${would_lose[-1]})" >&2
done

a=$(median "${agentrt_s[@]}")
e=$(median "${elastic_s[@]}")
p=$(median "${anchor_s[@]}")
l=$(median "${lost[@]}")
w=$(median "${would_lose[@]}")
printf '{"bench":"node_failure","metric":"node_death_to_agent_training_again","value":%.3f,"unit":"s","anchor":"SLURM requeue of the whole job to all ranks running again (requeue hold 10 s)","anchor_value":%.3f,"ratio":%.3f}\n' \
  "$a" "$p" "$(awk "BEGIN {print $a / $p}")"
printf '{"bench":"node_failure","metric":"node_death_to_elastic_agent_training_again_shrunk","value":%.3f,"unit":"s","anchor":"SLURM requeue of the whole job to all ranks running again (requeue hold 10 s)","anchor_value":%.3f,"ratio":%.3f}\n' \
  "$e" "$p" "$(awk "BEGIN {print $e / $p}")"
printf '{"bench":"node_failure","metric":"untouched_agent_steps_lost","value":%d,"unit":"env steps","anchor":"steps since its last checkpoint, lost to a whole-job requeue","anchor_value":%d,"ratio":%.3f}\n' \
  "$l" "$w" "$(awk "BEGIN {print $l / ($w + 0.000001)}")"
