# For scripts that start a multi-node test cluster of their own (the multi-node
# tests, bench/node_failure): source it, then `start_cluster N [start.sh options]`.
# Where network namespaces cannot be made (not root, no CAP_NET_ADMIN) it says
# so and exits with MULTINODE_SKIP_CODE (default 77, CTest's "skipped").
# Needs AGENTRT_SOURCE_DIR. Sets: src, state (the cluster's state directory,
# removed with the cluster on exit), tag (its namespace tag).
fail() { echo "FAIL: $*" >&2; exit 1; }
src=${AGENTRT_SOURCE_DIR:?}
if [ "$(id -u)" -ne 0 ] || ! ip netns add "agentrt-probe-$$" 2>/dev/null; then
  echo "$(basename "$0"): skipped: cannot create network namespaces here (needs root and CAP_NET_ADMIN)"
  exit "${MULTINODE_SKIP_CODE:-77}"
fi
ip netns del "agentrt-probe-$$"
state=$(mktemp -d /tmp/agentrt-multinode.XXXXXX)
tag=$(printf '%s' "$state" | md5sum | cut -c1-4)
cleanup() {
  "$src/slurm/testcluster/stop.sh" "$state" >/dev/null 2>&1
  rm -rf "$state"
}
trap cleanup EXIT

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

# wait_until SECONDS WHAT COMMAND...: runs COMMAND every 0.2 s until it succeeds;
# fails the test naming WHAT when SECONDS pass first.
wait_until() {
  local limit=$1 what=$2
  shift 2
  local deadline=$((SECONDS + limit))
  until "$@"; do
    [ $SECONDS -lt "$deadline" ] || fail "not within ${limit} s: $what"
    sleep 0.2
  done
}

# Waits (at most 60 s) until job $1 has left the queue.
wait_job_gone() {
  wait_until 60 "job $1 to end" sh -c "[ -z \"\$(timeout 5 squeue -h -j $1 2>/dev/null)\" ]"
}

# Waits (at most 60 s) until every node is idle: a job that just ended may leave
# its nodes completing for a few seconds, which would delay the next one.
wait_nodes_idle() {
  wait_until 60 "every node to be idle" sh -c '[ "$(timeout 5 sinfo -h -N -o %T | sort -u)" = idle ]'
}
