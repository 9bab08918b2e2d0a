#!/usr/bin/env bash
# Agents across nodes, and a run that survives losing nodes, on a 5-node test
# cluster (slurm/testcluster/start.sh --nodes 5, network namespaces) through
# `agentctl run --backend slurm` with slurm.spare_nodes: 2:
#   (a) a 2-node MPI agent (`wide`, 4 ranks, srun --mpi=pmix) beside a
#       single-node one (`solo`): every rank's node, GPUs and ports as planned;
#   (c) heartbeats from the ranks on every node reach `agentctl status`; a
#       SIGSTOPped rank on a node other than the controller's is caught by its
#       heartbeat and restarted;
#   a node dies (its slurmd and every process in its namespace killed, the node
#       marked down): only `solo` moves, to a spare, and resumes from its
#       checkpoint; `wide` is not restarted and keeps stepping;
#   a node is cut off (its link down, marked down) while `solo`'s rank there
#       lives on: `solo` moves to the last spare; the cut-off incarnation is
#       fenced, so exactly one incarnation commits checkpoints;
#   the next loss finds no spare: the run requeues its allocation and says why.
# Skips (77) where network namespaces cannot be made.
set -uo pipefail
# shellcheck source=slurm/testcluster/multinode_lib.sh
source "${AGENTRT_SOURCE_DIR:?}/slurm/testcluster/multinode_lib.sh"
start_cluster 5 --gpus 2 --cpus 4
mkdir -p "$state/fo"
{
  agents_preamble failover "$state/fo" 2 "max_restarts: 5, backoff_s: 1, heartbeat_timeout_s: 4, grace_s: 2" \
    "interval_s: 1, keep_last: 100"
  cat <<YAML
  - name: wide
    gpus: 4   # two whole nodes, two ranks on each
    ranks: 4
    backend: mpi
    command: [/bin/sh, -c, 'echo "RANKENV \$RANK \$SLURMD_NODENAME \$CUDA_VISIBLE_DEVICES \$AGENTRT_PORTS"; exec "\$0"', $bin/agent-worker]
    args: {env: cartpole, algo: ppo, steps: 1000000000}
YAML
  solo_worker solo
} >"$state/fo/agents.yaml"
cd "$state/fo" || fail "no $state/fo"
submit_run "$state/fo/runs/failover-*"
grep -q -- "^#SBATCH --nodes=5$" "$run/alloc.sbatch" && grep -q -- "^#SBATCH --no-kill$" "$run/alloc.sbatch" \
  || fail "the allocation does not ask for 3 planned + 2 spare nodes with --no-kill: $(grep SBATCH "$run/alloc.sbatch")"
on_failure() {
  echo "--- status"; "$bin/agentctl" status "$run" 2>&1
  "$bin/agentctl" status "$run" --json | $py -c "import json,sys,time; S=json.load(sys.stdin); [print(a['name'], a['state'], a['restarts'], a['last_checkpoint_step'], [(r['rank'], r['node'], r['pid'], r['heard_unix_s'] and round(time.time() - r['heard_unix_s'], 1)) for r in a['ranks']]) for a in S['agents']]"
  echo "--- controller"; tail -30 "$run"/slurm-*.out
  for f in "$run"/logs/*/rank*.log; do echo "--- $f"; tail -5 "$f"; done
}


# (a) + (c): both agents train, have checkpointed, and every rank on every
# node (n1, n2 for wide; n3 for solo) heartbeats to the controller on n1.
t=$(now)
until_status 90 "both agents training with a checkpoint, every rank heard from" \
  "all(a['state'] == 'running' and a['last_checkpoint_step'] is not None for a in A.values())
   and heard_since('wide', $t) and heard_since('solo', $t)"
check "nodes('wide') == ['n1', 'n1', 'n2', 'n2'] and nodes('solo') == ['n3']" \
  || { on_failure; fail "placement: wide on $(value "[r['node'] for r in A['wide']['ranks']]"), solo on $(value "[r['node'] for r in A['solo']['ranks']]")"; }
$py - "$run" <<'PY' || fail "a rank of wide did not get the node, GPUs and ports the plan gave it"
import glob, json, sys
run = sys.argv[1]
plan = json.load(open(run + "/plan.json"))
wide = next(a for a in plan["agents"] if a["name"] == "wide")
seen = {}
for path in glob.glob(run + "/logs/wide/rank*.log"):
    for line in open(path):
        if line.startswith("RANKENV "):
            _, rank, node, gpus, ports = line.split()
            seen[int(rank)] = (node, gpus, ports)
want = {}
for p in wide["placement"]:
    for r in p["ranks"]:
        want[r] = (p["node"], ",".join(map(str, p["gpus"])), "%d-%d" % (wide["ports"]["first"], wide["ports"]["last"]))
print("wide's ranks:", seen)
assert seen == want, "seen %s, planned %s" % (seen, want)
assert any("4 rank(s)" in l for l in open(run + "/logs/wide/rank0.log")), "wide is not one 4-rank group"
PY

# (c) A SIGSTOPped rank on n3 (not the controller's node) is caught by heartbeat.
pid=$(value "A['solo']['ranks'][0]['pid']")
kill -STOP "$pid" || fail "cannot SIGSTOP solo's rank (pid $pid)"
until_status 40 "the stopped rank of solo to be restarted after its heartbeat timeout" \
  "A['solo']['restarts'] == 1 and A['solo']['state'] == 'running' and 'sent no heartbeat' in A['solo']['reason']
   and nodes('solo') == ['n3']"
echo "SIGSTOP on n3: $(value "A['solo']['reason']")"

# A node dies: its slurmd and everything in its namespace, then SLURM marks it down.
until_status 60 "solo to checkpoint again after its restart" "heard_since('solo', $(now)) and A['solo']['last_checkpoint_step'] is not None"
wide_step=$(value "A['wide']['step']")
# (Counted here: what n3's death may not cause is a restart of wide from now on.)
wide_restarts=$(value "A['wide']['restarts']")
t_kill=$(now)
kill_node n3
until_status 60 "solo to move to a spare node and train again from its checkpoint" \
  "nodes('solo') == ['n4'] and A['solo']['state'] == 'running' and heard_since('solo', $t_kill)
   and (A['solo']['restored_step'] or -1) >= 0"
echo "node n3 killed: solo back on n4 after $(awk "BEGIN {print $(now) - $t_kill}") s"
check "A['wide']['restarts'] == $wide_restarts and A['wide']['step'] > $wide_step and A['wide']['state'] == 'running'" \
  || { on_failure; fail "wide was disturbed by n3's death"; }
check "any(f['node'] == 'n3' and f['agent'] == 'solo' and f['moved_to'] == 'n4' for f in S['node_failures'])" \
  || fail "status does not record n3's failure and solo's move"
"$bin/agentctl" status "$run" | grep -q "note: node n3 failed at .* UTC: solo moved to n4" \
  || fail "agentctl status does not say that solo moved from n3 to n4"
$py -c "import json,sys; p=json.load(open(sys.argv[1])); s=next(a for a in p['agents'] if a['name']=='solo'); assert s['placement'][0]['node']=='n4', s" \
  "$run/plan.json" || fail "plan.json does not place solo on n4"

# A partition: n4's link is cut; solo's rank there lives on but cannot be heard.
old_pid=$(value "A['solo']['ranks'][0]['pid']")
ip link set "arth${tag}4" down || fail "cannot cut n4's link"
timeout 10 scontrol update nodename=n4 state=down reason=agentrt-test-partition || fail "cannot mark n4 down"
t_cut=$(now)
until_status 60 "solo to move off the cut-off n4 to the last spare" \
  "nodes('solo') == ['n5'] and A['solo']['state'] == 'running' and heard_since('solo', $t_cut)"
t_moved=$(now)
kill -0 "$old_pid" 2>/dev/null || fail "the cut-off incarnation (pid $old_pid) was not alive when solo moved: nothing was fenced"
fence=$(cat "$run/checkpoints/solo/FENCE")
until_status 60 "solo's new incarnation to commit a checkpoint" "A['solo']['last_checkpoint_step'] is not None and heard_since('solo', $t_moved + 2)"
wait_until 30 "the cut-off incarnation to be refused by the fence" grep -q "fenced" "$run/logs/solo/rank0.log"
$py - "$run/checkpoints/solo" "$fence" "$t_moved" <<'PY' || fail "an incarnation other than the newest committed a checkpoint after the move"
import glob, json, sys
root, fence, t_moved = sys.argv[1], sys.argv[2], float(sys.argv[3])
after = []
for m in glob.glob(root + "/step-*/manifest.json"):
    j = json.load(open(m))
    if j["time"] > t_moved:
        after.append((j["step"], j.get("incarnation")))
print("checkpoints committed after the move:", sorted(after))
assert after, "none"
assert all(inc == fence for _, inc in after), after
PY
grep -h "fenced" "$run/logs/solo/rank0.log" | head -1

# No spare left: n5 dies too; the run requeues its allocation and says why.
kill_node n5
until_status 60 "the run to requeue for want of a spare" "'no spare node left' in S['requeue_reason']"
echo "no spare: $(value "S['requeue_reason']")"
wait_until 60 "job $job to be requeued" sh -c "timeout 5 scontrol show job $job -o | grep -q 'Restarts=1'"
check "A['wide']['state'] == 'stopped' and A['wide']['restarts'] == $wide_restarts" || fail "wide did not stop cleanly for the requeue"
timeout 10 scancel "$job"
wait_job_gone "$job"
# Open MPI's shared memory: wide's ranks kept it in their step's folder, which
# the last of them removed (plan/mpi_shm.h); nothing of the job is left in
# /dev/shm. (The test nodes share one /dev/shm, so the sweep of a killed
# step's folder by the next step on its node is tested in plan_mpi_shm_test.)
wait_until 30 "the job's Open MPI shared memory to be removed" \
  sh -c "! ls -d /dev/shm/agentrt-mpi.step.$job.* /dev/shm/vader_segment.n[1-5].* 2>/dev/null | grep -q ."
echo "node_failover_test: PASS"
