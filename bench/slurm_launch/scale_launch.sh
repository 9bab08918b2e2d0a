#!/usr/bin/env bash
# bench_slurm_launch_32nodes: `agentctl run --backend slurm` of 256 one-rank
# agentrt-test-agent agents on a 32-node test cluster (network namespaces, one
# slurmd each) in one allocation, from submit to every
# rank running (its process started: the birth time of the rank's log, which the
# rank wrapper creates just before it starts the agent) and to every rank heard
# (status.json first lists every rank with telemetry), with a step per agent
# (slurm.steps: agent, the default) and with one step per node (slurm.steps:
# node), against a plain
# `sbatch -N32` of the same 256 ranks, each rank noting when it started and then
# starting the same binary (its loading and linking) and sleeping:
#   - anchor "srun per agent": the batch script srun-s every rank as its own step;
#   - anchor "one srun": one srun of all 256 ranks.
# And as job arrays: `agentctl sbatch --submit` (the bus job, then one array of
# 256 tasks, each srun-ing `agentctl array-task`), to every rank running (the
# birth of its checkpoint fence, which array-task writes just before it execs
# the agent), against a plain `sbatch --array=0-255` whose every task srun-s
# (--overlap, as agentctl's tasks do) the same rank script.
# Medians over --reps N (default 3), alternating; every submission waits for
# every node to be idle first (the job arrays: a fresh cluster). --nodes N and
# --agents A change the size (the shortened test runs 4 nodes and 16 agents);
# --only allocation|arrays runs one half.
# Needs root (network namespaces); says "skipped" and exits 0 otherwise.
set -uo pipefail
reps=3 nodes=32 agents=256 only=""
while [ $# -gt 0 ]; do
  case $1 in
    --reps) reps=${2:?}; shift 2 ;;
    --nodes) nodes=${2:?}; shift 2 ;;
    --agents) agents=${2:?}; shift 2 ;;
    --only) only=${2:?}; shift 2 ;;
    *) echo "usage: $0 [--reps N] [--nodes N] [--agents A] [--only allocation|arrays]" >&2; exit 2 ;;
  esac
done
case $only in "" | allocation | arrays) ;; *) echo "$0: --only allocation or arrays, not '$only'" >&2; exit 2 ;; esac
MULTINODE_SKIP_CODE=${MULTINODE_SKIP_CODE:-0}
# shellcheck source=slurm/testcluster/multinode_lib.sh
source "${AGENTRT_SOURCE_DIR:?}/slurm/testcluster/multinode_lib.sh"
per_node=$(((agents + nodes - 1) / nodes))
# Each node: its agents' ranks and the controller's task (every node is asked
# for the same count), with room to spare.
start_cluster "$nodes" --gpus 0 --cpus $((per_node + 2)) >/dev/null
# A fresh cluster: 256 batch jobs cancelled at once leave this host's slurmctld
# busy and nodes completing for minutes, which would delay the next submission.
restart_cluster() {
  "$src/slurm/testcluster/stop.sh" "$state" >/dev/null 2>&1
  rm -rf "$state"
  state=$(mktemp -d /tmp/agentrt-multinode.XXXXXX)
  tag=$(printf '%s' "$state" | md5sum | cut -c1-4)
  start_cluster "$nodes" --gpus 0 --cpus $((per_node + 2)) >/dev/null
}
agent=$bin/agentrt-test-agent
cat >"$work/agents.yaml" <<YAML
run: {name: scale$agents, dir: $work/runs}
slurm: {time: "00:10:00"}
agents:
  - {name: a, replicas: $agents, ranks: 1,
     command: [$agent, --forever, --step-ms, "1000", --heartbeat-ms, "1000"]}
YAML
cat >"$work/rank.sh" <<SH
#!/bin/bash
f="\$1/\$SLURM_JOB_ID.\$2.\$SLURM_PROCID"
date +%s.%N >"\$f.tmp" && mv "\$f.tmp" "\$f.start"
$agent --help >/dev/null
exec sleep 600
SH
{
  echo "#!/bin/bash"
  echo "#SBATCH --job-name=plain-steps -N$nodes --ntasks-per-node=$per_node --cpus-per-task=1"
  echo "#SBATCH --output=$work/plain-%j.out"
  for ((i = 0; i < agents; ++i)); do
    echo "srun --exact -N1 -n1 --nodelist=n$((i % nodes + 1)) bash $work/rank.sh $work/seen a$i &"
  done
  echo wait
} >"$work/steps.sbatch"
cat >"$work/one.sbatch" <<SH
#!/bin/bash
#SBATCH --job-name=plain-one -N$nodes --ntasks-per-node=$per_node --cpus-per-task=1
#SBATCH --output=$work/plain-%j.out
srun -n$agents bash $work/rank.sh $work/seen all
SH
cat >"$work/array.sbatch" <<SH
#!/bin/bash
#SBATCH --job-name=plain-array --array=0-$((agents - 1)) --ntasks=1 --cpus-per-task=1
#SBATCH --output=$work/plain-%A_%a.out
# --overlap as in agentctl's array script: when slurmctld answers a step's
# creation after srun's MessageTimeout (256 at once on this host), srun asks
# again, and without it would wait for ever for the step it had created.
srun --overlap bash $work/rank.sh $work/seen a\$SLURM_ARRAY_TASK_ID
SH
mkdir -p "$work/seen"

# RUN T0: seconds from T0 until every rank's log exists (the latest birth time),
# once all $agents do; nothing (exit 1) before.
ranks_running() {
  local logs
  logs=$(ls "$1"/logs/*/rank0.log 2>/dev/null | wc -l)
  [ "$logs" -eq "$agents" ] || return 1
  stat -c '%.9W' "$1"/logs/*/rank0.log | sort -g | tail -1 | awk -v t0="$2" '{print $1 - t0}'
}
all_heard() {
  status_holds "$1" "len([r for a in S['agents'] for r in a['ranks'] if r['heard_unix_s']]) == $agents"
}
# Submits sbatch script $1; prints seconds until all ranks noted their start,
# then cancels it (an array, $2: the caller restarts the cluster instead).
plain() {
  local t0 job t1
  # An array's tasks each note under their own job id (SLURM_JOB_ID): count
  # every note, the last submission's only.
  rm -f "$work"/seen/*.start
  t0=$(now)
  job=$(timeout 30 sbatch --parsable "$1") || fail "sbatch $1 failed"
  wait_period=0.1 wait_until 300 "the $agents ranks of $1 to start" \
    sh -c "[ \$(ls $work/seen/*.start 2>/dev/null | wc -l) -ge $agents ]"
  t1=$(cat "$work"/seen/*.start | sort -g | tail -1)
  if [ "${2:-}" != arrays ]; then
    timeout 10 scancel "$job"
    wait_job_gone "$job"
    wait_nodes_idle
  fi
  awk -v a="$t1" -v b="$t0" 'BEGIN {print a - b}'
}
# Submits the run (extra agentctl arguments: $@), waits until every rank was
# heard; prints "RUNNING HEARD" (seconds from submit), then cancels the job.
agentrt_run() {
  local t0 out job run heard="" running deadline
  t0=$(now)
  out=$("$bin/agentctl" run "$work/agents.yaml" --backend slurm --detach "$@" 2>&1) || fail "submit: $out"
  job=$(grep -o 'submitted job [0-9]*' <<<"$out" | awk '{print $3}')
  run=$(grep -o 'run dir [^ ]*' <<<"$out" | awk '{print $3}' | tr -d ',')
  deadline=$((SECONDS + 300))
  until [ -n "$heard" ]; do
    [ $SECONDS -lt $deadline ] || fail "not every rank of $run was heard within 300 s"
    all_heard "$run" && heard=$(awk -v a="$(now)" -v b="$t0" 'BEGIN {print a - b}')
    sleep 0.1
  done
  running=$(ranks_running "$run" "$t0") || fail "a rank of $run has no log"
  timeout 10 scancel "$job"
  wait_job_gone "$job"
  wait_nodes_idle
  echo "$running $heard"
}
# `agentctl sbatch --submit` into a fresh run folder; prints seconds from
# submit until every agent's array task exec-ed it (its checkpoint fence
# exists: the latest birth time). The caller restarts the cluster after it.
agentrt_arrays() {
  local t0 out run=$work/arrays-$1 running
  t0=$(now)
  out=$("$bin/agentctl" sbatch "$work/agents.yaml" -o "$run" --submit 2>&1) || fail "agentctl sbatch --submit: $out"
  wait_period=0.1 wait_until 300 "the $agents array tasks of $run to exec their agents" \
    sh -c "[ \$(ls $run/checkpoints/*/FENCE 2>/dev/null | wc -l) -ge $agents ]"
  running=$(stat -c '%.9W' "$run"/checkpoints/*/FENCE | sort -g | tail -1 | awk -v t0="$t0" '{print $1 - t0}')
  echo "$running"
}
agent_run_s=() agent_heard_s=() node_run_s=() node_heard_s=() steps_s=() one_s=() arrays_s=() plain_arrays_s=()
if [ "$only" != arrays ]; then
  for ((r = 0; r < reps; ++r)); do
    read -r running heard < <(agentrt_run) && [ -n "$heard" ] || fail "agentctl run (a step per agent)"
    agent_run_s+=("$running") agent_heard_s+=("$heard")
    read -r running heard < <(agentrt_run --set slurm.steps=node) && [ -n "$heard" ] || fail "agentctl run (node steps)"
    node_run_s+=("$running") node_heard_s+=("$heard")
    steps_s+=("$(plain "$work/steps.sbatch")")
    one_s+=("$(plain "$work/one.sbatch")")
    echo "rep $r: agentctl every rank running / heard: a step per agent ${agent_run_s[-1]} / ${agent_heard_s[-1]} s," \
      "node steps ${node_run_s[-1]} / ${node_heard_s[-1]} s; plain srun per agent ${steps_s[-1]} s, one srun ${one_s[-1]} s" >&2
  done
fi
if [ "$only" != allocation ]; then
  for ((r = 0; r < reps; ++r)); do
    arrays_s+=("$(agentrt_arrays "$r")")
    [ -n "${arrays_s[-1]}" ] || fail "agentctl sbatch --submit (job arrays)"
    restart_cluster
    plain_arrays_s+=("$(plain "$work/array.sbatch" arrays)")
    [ $((r + 1)) -lt "$reps" ] && restart_cluster
    echo "rep $r: job arrays, every rank running: agentctl sbatch ${arrays_s[-1]} s, plain ${plain_arrays_s[-1]} s" >&2
  done
fi
figure() {  # metric value anchor anchor_value
  printf '{"bench":"slurm_launch","metric":"%s","value":%.3f,"unit":"s","anchor":"%s","anchor_value":%.3f,"ratio":%.3f}\n' \
    "$1" "$2" "$3" "$4" "$(awk -v a="$2" -v b="$4" 'BEGIN {print a / b}')"
}
if [ "$only" != arrays ]; then
  steps_m=$(median "${steps_s[@]}") one_m=$(median "${one_s[@]}")
  what="run_backend_slurm_${nodes}_nodes_${agents}_agents_submit_to_every_rank"
  per_agent="plain sbatch -N$nodes srun-ing each of the $agents ranks as its own step"
  one="plain sbatch -N$nodes with one srun of the $agents ranks"
  figure "${what}_running_step_per_agent" "$(median "${agent_run_s[@]}")" "$per_agent" "$steps_m"
  figure "${what}_running_step_per_agent" "$(median "${agent_run_s[@]}")" "$one" "$one_m"
  figure "${what}_running_node_steps" "$(median "${node_run_s[@]}")" "$one" "$one_m"
  figure "${what}_heard_node_steps" "$(median "${node_heard_s[@]}")" "$one" "$one_m"
fi
if [ "$only" != allocation ]; then
  figure "job_arrays_${nodes}_nodes_${agents}_agents_submit_to_every_rank_running" "$(median "${arrays_s[@]}")" \
    "plain sbatch --array=0-$((agents - 1)), each task srun-ing its rank" "$(median "${plain_arrays_s[@]}")"
fi
