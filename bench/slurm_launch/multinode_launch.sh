#!/usr/bin/env bash
# bench_slurm_launch_4nodes: `agentctl run --backend slurm` of two agent-worker
# agents spanning four nodes (4 ranks each, two whole nodes of two GPUs per
# agent) on a 4-node test cluster (network namespaces), from submit to every
# rank heartbeating (its first telemetry at the controller: the send time of
# the latest rank's "hello", from `agentctl status --json`), against a plain
# `sbatch -N4` whose script srun-s the same two groups of 4 ranks (each rank
# notes when it started). Medians over --reps N (default 5), alternating; each
# submission waits for every node to be idle first.
# Needs root (network namespaces); says "skipped" and exits 0 otherwise.
set -uo pipefail
reps=5
[ "${1:-}" = "--reps" ] && reps=${2:?}
MULTINODE_SKIP_CODE=0
# shellcheck source=slurm/testcluster/multinode_lib.sh
source "${AGENTRT_SOURCE_DIR:?}/slurm/testcluster/multinode_lib.sh"
start_cluster 4 --gpus 2 --cpus 4 >/dev/null
cat >"$work/agents.yaml" <<YAML
run: {name: launch4, dir: $work/runs}
slurm: {time: "00:05:00"}
agents:
  - {name: wide, replicas: 2, gpus: 4, ranks: 4, backend: mpi, command: [$bin/agent-worker],
     args: {env: cartpole, algo: ppo, steps: 1000000000}}
YAML
cat >"$work/rank.sh" <<'SH'
#!/bin/bash
f="$1/$2.$SLURM_PROCID"
date +%s.%N >"$f.tmp" && mv "$f.tmp" "$f.start"
SH
cat >"$work/plain.sbatch" <<SH
#!/bin/bash
#SBATCH --job-name=plain -N4 --ntasks-per-node=2 --cpus-per-task=1 --gres=gpu:2
#SBATCH --output=$work/plain-%j.out
srun --exact -N2 -n4 --gres=gpu:2 bash $work/rank.sh $work/seen wide-0 &
srun --exact -N2 -n4 --gres=gpu:2 bash $work/rank.sh $work/seen wide-1 &
wait
SH
# RUN: the latest first-telemetry time once all 8 ranks were heard, else nothing.
heard_all() {
  run_status "$1" "[max(t) for t in [[r['heard_unix_s'] for a in S['agents'] for r in a['ranks']]]
                   if len(t) == 8 and all(t)][0]"
}
agentrt_s=() plain_s=()
for ((r = 0; r < reps; ++r)); do
  t0=$(now)
  out=$("$bin/agentctl" run "$work/agents.yaml" --backend slurm --detach 2>&1) || fail "submit: $out"
  job=$(grep -o 'submitted job [0-9]*' <<<"$out" | awk '{print $3}')
  run=$(grep -o 'run dir [^ ]*' <<<"$out" | awk '{print $3}' | tr -d ',')
  deadline=$((SECONDS + 120))
  until t1=$(heard_all "$run") && [ -n "$t1" ]; do
    [ $SECONDS -lt $deadline ] || fail "not every rank of $run heartbeated within 120 s"
    sleep 0.05
  done
  agentrt_s+=("$(awk "BEGIN {print $t1 - $t0}")")
  timeout 10 scancel "$job"
  wait_job_gone "$job"
  wait_nodes_idle

  rm -rf "$work/seen" && mkdir -p "$work/seen"
  t0=$(now)
  pjob=$(timeout 20 sbatch --parsable "$work/plain.sbatch") || fail "sbatch of the anchor failed"
  wait_until 120 "the anchor's 8 ranks to start" sh -c "[ \$(ls $work/seen/*.start 2>/dev/null | wc -l) -eq 8 ]"
  t1=$(cat "$work"/seen/*.start | sort -n | tail -1)
  plain_s+=("$(awk "BEGIN {print $t1 - $t0}")")
  wait_job_gone "$pjob"
  wait_nodes_idle
  echo "rep $r: agentctl run --backend slurm ${agentrt_s[-1]} s, plain sbatch+srun ${plain_s[-1]} s" >&2
done
a=$(median "${agentrt_s[@]}")
p=$(median "${plain_s[@]}")
printf '{"bench":"slurm_launch","metric":"run_backend_slurm_4_nodes_submit_to_every_rank_heartbeating","value":%.3f,"unit":"s","anchor":"plain sbatch -N4 srun-ing the same 8 ranks to all running","anchor_value":%.3f,"ratio":%.3f}\n' \
  "$a" "$p" "$(awk "BEGIN {print $a / $p}")"
