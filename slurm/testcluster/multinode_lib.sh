# For scripts that start a multi-node test cluster of their own (the multi-node
# tests, bench/node_failure): source it, then `start_cluster N [start.sh options]`.
# Where network namespaces cannot be made (not root, no CAP_NET_ADMIN) it says
# so and exits with MULTINODE_SKIP_CODE (default 77, CTest's "skipped").
# Needs AGENTRT_SOURCE_DIR and AGENTRT_BIN_DIR. Sets: src, bin (agentctl's
# folder), py (Debian's python3), state (the cluster's state directory, removed
# with the cluster on exit), tag (its namespace tag), work (a scratch folder,
# removed on exit).
fail() { echo "FAIL: $*" >&2; exit 1; }
src=${AGENTRT_SOURCE_DIR:?}
bin=${AGENTRT_BIN_DIR:?}
py=/usr/bin/python3
if [ "$(id -u)" -ne 0 ] || ! ip netns add "agentrt-probe-$$" 2>/dev/null; then
  echo "$(basename "$0"): skipped: cannot create network namespaces here (needs root and CAP_NET_ADMIN)"
  exit "${MULTINODE_SKIP_CODE:-77}"
fi
ip netns del "agentrt-probe-$$"
state=$(mktemp -d /tmp/agentrt-multinode.XXXXXX)
tag=$(printf '%s' "$state" | md5sum | cut -c1-4)
work=$(mktemp -d /tmp/agentrt-multinode-work.XXXXXX)
cleanup() {
  "$src/slurm/testcluster/stop.sh" "$state" >/dev/null 2>&1
  rm -rf "$state" "$work"
}
trap cleanup EXIT

now() { date +%s.%N; }

# The median of the numbers given.
median() { printf '%s\n' "$@" | sort -g | awk '{v[NR] = $1} END {print v[int((NR + 1) / 2)]}'; }

# run_status RUN EXPR: prints the Python expression EXPR (it may span lines)
# over `agentctl status RUN --json`: S is the status, A its agents by name,
# nodes(agent) its ranks' nodes, heard_since(agent, t) whether every rank of
# it was heard after Unix time t; True/False print as 1/0. Nothing (and exit
# 1) while there is no status yet.
cat >"$work/run_status.py" <<'PY'
import json, sys
S = json.load(sys.stdin)
A = {a["name"]: a for a in S["agents"]}
def nodes(name): return [r["node"] for r in A[name]["ranks"]]
def heard_since(name, t): return all((r["heard_unix_s"] or 0) > t for r in A[name]["ranks"])
v = eval("(" + sys.argv[1] + ")")
print(int(v) if isinstance(v, bool) else v)
PY
run_status() { "$bin/agentctl" status "$1" --json 2>/dev/null | $py "$work/run_status.py" "$2" 2>/dev/null; }
# status_holds RUN EXPR: EXPR (as for run_status) is true now.
status_holds() { [ "$(run_status "$1" "$2")" = 1 ]; }

# submit_run: `agentctl run agents.yaml --backend slurm --detach` in the
# current directory; sets $job, and $run to the run directory matching the glob $1.
submit_run() {
  timeout 60 "$bin/agentctl" run agents.yaml --backend slurm --detach >submit.log 2>&1 \
    || { cat submit.log; fail "agentctl run --backend slurm --detach failed"; }
  job=$(grep -o 'submitted job [0-9]*' submit.log | awk '{print $3}')
  # shellcheck disable=SC2086  # $1 is a glob: the run directory agentctl made
  run=$(ls -d $1)
  [ -n "$job" ] && [ -d "$run" ] || { cat submit.log; fail "no job or run directory"; }
}
# agents_preamble NAME DIR SPARE_NODES RESTART CHECKPOINT: prints the head of
# an agents.yaml, up to `agents:`: run NAME in DIR/runs, slurm.spare_nodes, and
# the defaults' restart and checkpoint settings (flow-map bodies, e.g.
# "max_restarts: 5, backoff_s: 1").
agents_preamble() {
  cat <<YAML
run: {name: $1, dir: $2/runs}
slurm: {spare_nodes: $3}
defaults:
  restart: {$4}
  checkpoint: {$5}
agents:
YAML
}

# solo_worker NAME: prints the agents.yaml entry of NAME, a 1-GPU agent-worker
# (one rank, backend single) training CartPole without end.
solo_worker() {
  cat <<YAML
  - name: $1
    gpus: 1
    backend: single   # agent-worker trains on the CPU; its GPU stays reserved
    command: [$bin/agent-worker]
    args: {env: cartpole, algo: ppo, steps: 1000000000}
YAML
}

# check EXPR / value EXPR / until_status SECONDS WHAT EXPR: a Python
# expression over the status of the run $run (run_status).
check() { status_holds "$run" "$1"; }
value() { run_status "$run" "$1"; }
until_status() { wait_until "$1" "$2" check "$3"; }

# start_cluster N [start.sh options...]: N nodes, then this shell talks to them.
start_cluster() {
  local n=$1
  shift
  "$src/slurm/testcluster/start.sh" "$state" --nodes "$n" "$@" || fail "start.sh --nodes $n failed"
  # shellcheck disable=SC1091
  source "$state/env.sh"
}

# The NodeAddr SLURM has for node $1.
node_addr() { timeout 10 scontrol show node "$1" -o | grep -o 'NodeAddr=[^ ]*' | cut -d= -f2; }

# wait_until SECONDS WHAT COMMAND...: runs COMMAND every $wait_period s
# (default 0.2) until it succeeds; when SECONDS pass first, calls on_failure
# (if the script defines it) and fails naming WHAT.
wait_until() {
  local limit=$1 what=$2
  shift 2
  local deadline=$((SECONDS + limit))
  until "$@"; do
    if [ $SECONDS -ge "$deadline" ]; then
      declare -F on_failure >/dev/null && on_failure
      fail "not within ${limit} s: $what"
    fi
    sleep "${wait_period:-0.2}"
  done
}

# kill_node NODE: the node dies: every process in its namespace (its slurmd,
# step daemons, ranks) is killed, then SLURM is told it is down.
kill_node() {
  # shellcheck disable=SC2046
  kill -KILL $(ip netns pids "art$tag-$1") 2>/dev/null
  timeout 10 scontrol update nodename="$1" state=down reason=agentrt-test-killed >/dev/null \
    || fail "cannot mark $1 down"
}

# revive_node NODE: a node kill_node took down comes back: its slurmd starts
# again in its namespace (as start.sh started it, recorded for stop.sh) and
# SLURM takes it back (state=resume); waits (at most 60 s) until it answers.
revive_node() {
  setsid "$state/slurmd-$1.sh" </dev/null >>"$state/log/slurmd-$1.out" 2>&1 &
  echo "slurmd-$1 $!" >>"$state/pids"
  wait_until 60 "node $1's slurmd to register" sh -c \
    "timeout 5 scontrol update nodename=$1 state=resume >/dev/null 2>&1; \
     s=\$(timeout 5 sinfo -h -n $1 -o %T) && [ -n \"\$s\" ] && \
     ! echo \"\$s\" | grep -qE 'down|drain|fail|unknown|not_responding|\\*'"
}

# Waits (at most 60 s) until job $1 has left the queue.
wait_job_gone() {
  wait_until 60 "job $1 to end" sh -c "[ -z \"\$(timeout 5 squeue -h -j $1 2>/dev/null)\" ]"
}

# Waits (at most 300 s) until every node is idle: a job that just ended may
# leave its nodes completing for a few seconds, which would delay the next one
# (256 array tasks cancelled at once on a 2-core host: over a minute).
wait_nodes_idle() {
  wait_until 300 "every node to be idle" sh -c '[ "$(timeout 5 sinfo -h -N -o %T | sort -u)" = idle ]'
}
