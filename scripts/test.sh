#!/usr/bin/env bash
# Runs the whole test suite: everything but the `slurm` label first, then the
# `slurm` tests against a real slurmctld/slurmd started for them (and stopped
# after, also on failure). Labels: unit integration slurm gpu fault torch browser dist.
set -uo pipefail
build=${1:-build}
cd "$(dirname "$0")/.."
jobs=${AGENTRT_TEST_JOBS:-2}

rc=0
ctest --test-dir "$build" --output-on-failure -j "$jobs" -LE slurm || rc=1

if [ -x slurm/testcluster/start.sh ] && ctest --test-dir "$build" -N -L slurm | grep -q "Total Tests: [1-9]"; then
  state=$(mktemp -d /tmp/agentrt-slurm.XXXXXX)
  trap 'slurm/testcluster/stop.sh "$state" >/dev/null 2>&1 || true' EXIT
  if slurm/testcluster/start.sh "$state"; then
    # shellcheck disable=SC1091
    source "$state/env.sh"
    ctest --test-dir "$build" --output-on-failure -j 1 -L slurm || rc=1
  else
    echo "test: the SLURM test cluster did not start; slurm tests fail" >&2
    rc=1
  fi
fi
exit $rc
