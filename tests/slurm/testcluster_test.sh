#!/usr/bin/env bash
# The SLURM test cluster (slurm/testcluster/start.sh) against its own promises:
# the node is up with its fake GPUs, `srun --gres=gpu:2` binds two distinct
# GPUs through CUDA_VISIBLE_DEVICES, two jobs running at the same time get
# disjoint GPUs, and start.sh on a running cluster is a no-op.
# Needs SLURM_CONF (scripts/test.sh sources STATE_DIR/env.sh); fails at once without it.
set -uo pipefail

fail() { echo "FAIL: $*" >&2; exit 1; }
[ -n "${SLURM_CONF:-}" ] || fail "SLURM_CONF is not set: start the test cluster (slurm/testcluster/start.sh DIR; source DIR/env.sh) or run scripts/test.sh"
[ -n "${AGENTRT_TESTCLUSTER_DIR:-}" ] || fail "AGENTRT_TESTCLUSTER_DIR is not set: source the env.sh that start.sh wrote"
src=${AGENTRT_SOURCE_DIR:?}
gpus=${AGENTRT_TESTCLUSTER_GPUS:-8}
[ "$gpus" -ge 4 ] || fail "these checks need at least 4 fake GPUs, the cluster has $gpus"
work=$(mktemp -d /tmp/agentrt-testcluster-test.XXXXXX)
trap 'rm -rf "$work"' EXIT

# 1. The node is idle and offers its GPUs.
node_line=$(timeout 20 scontrol show node -o) || fail "scontrol show node failed"
echo "$node_line" | grep -q "Gres=gpu:$gpus" || fail "node does not offer gpu:$gpus: $node_line"
state=$(timeout 20 sinfo -h -o %T) || fail "sinfo failed"
echo "$state" | grep -Eq '^(idle|mixed)' || fail "node state is '$state'"

# 2. start.sh on the running cluster says so and changes nothing.
out=$("$src/slurm/testcluster/start.sh" "$AGENTRT_TESTCLUSTER_DIR" 2>&1) || fail "start.sh again failed: $out"
echo "$out" | grep -q "already running" || fail "start.sh again did not notice the running cluster: $out"

# 3. Two GPUs, two distinct indices.
cvd=$(timeout 60 srun -N1 -n1 --gres=gpu:2 -t 1 printenv CUDA_VISIBLE_DEVICES) || fail "srun --gres=gpu:2 failed"
IFS=, read -r -a ids <<<"$cvd"
[ ${#ids[@]} -eq 2 ] || fail "srun --gres=gpu:2 saw CUDA_VISIBLE_DEVICES='$cvd', not two GPUs"
[ "${ids[0]}" != "${ids[1]}" ] || fail "the two GPUs are the same: '$cvd'"
echo "srun --gres=gpu:2: CUDA_VISIBLE_DEVICES=$cvd"

# 4. Two jobs that run at the same time get disjoint GPUs. Each writes what it
# saw, then waits (bounded) until the other has written too, so they overlap.
half=$((gpus / 2))
job() {  # name
  # shellcheck disable=SC2016  # the script runs in the job, with its own $0 and $1
  timeout 90 srun -N1 -n1 --gres=gpu:$half -t 2 bash -c '
    echo "$CUDA_VISIBLE_DEVICES" >"$0/$1.gpus"
    for _ in $(seq 300); do [ -s "$0/a.gpus" ] && [ -s "$0/b.gpus" ] && exit 0; sleep 0.1; done
    echo "the other job never started" >&2; exit 1' "$work" "$1"
}
job a & pa=$!
job b & pb=$!
wait $pa || fail "job a failed (or never overlapped with job b)"
wait $pb || fail "job b failed (or never overlapped with job a)"
a=$(cat "$work/a.gpus")
b=$(cat "$work/b.gpus")
echo "concurrent jobs: a=$a b=$b"
IFS=, read -r -a ga <<<"$a"
IFS=, read -r -a gb <<<"$b"
if [ ${#ga[@]} -ne "$half" ] || [ ${#gb[@]} -ne "$half" ]; then fail "expected $half GPUs each: a=$a b=$b"; fi
for x in "${ga[@]}"; do
  for y in "${gb[@]}"; do
    [ "$x" != "$y" ] || fail "GPU $x was given to both concurrent jobs (a=$a b=$b)"
  done
done
echo "PASS"
