#!/usr/bin/env bash
# slurm.steps: node on a 2-node test cluster: `agentctl run --backend slurm`
# starts every node's single-node agents as one job step (srun --multi-prog),
# each agent still its own failure domain:
#   - each agent gets its own ranks, environment and log (rank variables from
#     its task file; its telemetry heard by the controller);
#   - an agent of 2 ranks and 2 GPUs (nccl: not MPI, whose wiring is per
#     step) that fails is restarted as a step of its own (and
#     fails for good after its one restart), while the agents beside it in the
#     node step keep running with the same processes;
#   - `agentctl stop` reaches every agent of the node steps (through their
#     signal files): all end, the job leaves the queue, no rank process is left.
# Skips (77) where network namespaces cannot be made (not root, no CAP_NET_ADMIN).
set -uo pipefail
# shellcheck source=slurm/testcluster/multinode_lib.sh
source "${AGENTRT_SOURCE_DIR:?}/slurm/testcluster/multinode_lib.sh"
start_cluster 2 --gpus 2 --cpus 8
agent=$bin/agentrt-test-agent
cat >"$work/agents.yaml" <<YAML
run: {name: nodesteps, dir: $work/runs}
slurm: {time: "00:05:00", steps: node}
agents:
  - {name: a, replicas: 6, ranks: 1, command: [$agent, --forever, --step-ms, "200", --heartbeat-ms, "200"]}
  - {name: bad, ranks: 2, gpus: 2, restart: {max_restarts: 1, backoff_s: 0.5},
     command: [$agent, --steps, "50", --step-ms, "200", --heartbeat-ms, "200", --fail-at-step, "3", --exit-code, "3"]}
YAML
on_failure() {
  "$bin/agentctl" status "$run" 2>&1 | tail -12
  tail -n 5 "$run"/logs/node-steps/*.srun.log "$run"/logs/bad/*.log 2>/dev/null
}
out=$("$bin/agentctl" run "$work/agents.yaml" --backend slurm --detach 2>&1) || fail "submit: $out"
job=$(grep -o 'submitted job [0-9]*' <<<"$out" | awk '{print $3}')
run=$(grep -o 'run dir [^ ]*' <<<"$out" | awk '{print $3}' | tr -d ',')
[ -n "$job" ] && [ -d "$run" ] || fail "no job or run dir in: $out"

# 1. Every agent heard; the a-* ranks tell their own pids; one node step per node.
pids() { run_status "$run" "' '.join(str(A['a-%d' % i]['ranks'][0]['pid']) for i in range(6))"; }
wait_until 90 "every agent's ranks heard" status_holds "$run" \
  "all(r['heard_unix_s'] for a in S['agents'] for r in a['ranks'])"
before=$(pids)
grep -qw 0 <<<"$before" && fail "a rank of a node step has no pid: $before"
confs=$(ls "$run"/logs/node-steps/*.conf | wc -l)
[ "$confs" -eq 2 ] || fail "$confs node step files, not one per node: $(ls "$run"/logs/node-steps)"
grep -q "task-file $run/logs/bad/task.json" "$run"/logs/node-steps/*.conf || fail "bad is not in a node step"
for i in 0 5; do
  wrapper=$(pgrep -f "task-file $run/logs/a-$i/task.json" | head -1)
  env_of=$(tr '\0' '\n' <"/proc/$(pgrep -P "$wrapper" | head -1)/environ" 2>/dev/null \
    | grep -E '^(AGENTRT_AGENT|RANK|WORLD_SIZE)=' | sort | tr '\n' ' ')
  [ "$env_of" = "AGENTRT_AGENT=a-$i RANK=0 WORLD_SIZE=1 " ] || fail "a-$i's environment: '$env_of'"
done

# 2. bad fails (rank exit code 3), restarts once as a step of its own, fails for good;
# the agents beside it keep their processes.
wait_until 90 "bad to fail after its restart" status_holds "$run" \
  "A['bad']['state'] == 'failed' and A['bad']['restarts'] == 1"
run_status "$run" "A['bad']['reason']" | grep -q "exited with code 3" \
  || fail "bad's reason: $(run_status "$run" "A['bad']['reason']")"
status_holds "$run" "all(A['a-%d' % i]['state'] == 'running' for i in range(6))" \
  || fail "an agent beside bad stopped: $(run_status "$run" "[a['state'] for a in S['agents']]")"
after=$(pids)
[ "$after" = "$before" ] || fail "the agents beside bad were restarted: pids $before, then $after"
steps=$(timeout 10 squeue -h -s -j "$job" -o %j | sort | tr '\n' ' ')
[ "$steps" = "batch node-step-n1 node-step-n2 " ] || [ "$steps" = "node-step-n1 node-step-n2 " ] \
  || fail "the job's steps: '$steps' (expected the two node steps)"

# 3. Stop: every agent of the node steps ends, the job leaves, no rank is left.
"$bin/agentctl" stop "$run" >/dev/null 2>&1 || fail "agentctl stop failed"
wait_job_gone "$job"
status_holds "$run" "all(A['a-%d' % i]['state'] in ('succeeded', 'stopped') for i in range(6))" \
  || fail "after stop: $(run_status "$run" "[(a['name'], a['state']) for a in S['agents']]")"
left=$(pgrep -f "$run" | wc -l)
[ "$left" -eq 0 ] || fail "$left processes of the run are left: $(pgrep -af "$run")"
echo "node_steps_test: ok: pids kept across bad's failure ($before); steps $steps"
