#!/usr/bin/env bash
# bench/slurm_launch/scale_launch.sh, shortened: 16 agents on a 4-node test
# cluster, one repetition. Every rank of both agentctl runs (a step per agent,
# node steps) must start and be heard, every agent of `agentctl sbatch
# --submit`'s job array must be exec-ed, every anchor must start its ranks,
# and every figure line must carry the seven keys with positive values. No goal is asserted (speed goals live
# in `make bench`). Skipped (77) where network namespaces cannot be made.
#   slurm_launch_scale_smoke_test.sh SOURCE_DIR BIN_DIR
set -uo pipefail
out=$(mktemp /tmp/agentrt-slurm-scale-smoke.XXXXXX)
trap 'rm -f "$out"' EXIT
fail() { echo "slurm_launch_scale_smoke_test: FAIL: $*" >&2; cat "$out" >&2; exit 1; }
AGENTRT_SOURCE_DIR=$1 AGENTRT_BIN_DIR=$2 MULTINODE_SKIP_CODE=77 timeout 400 \
  bash "$1/bench/slurm_launch/scale_launch.sh" --nodes 4 --agents 16 --reps 1 >"$out" 2>&1
rc=$?
[ $rc -eq 77 ] && { cat "$out"; exit 77; }
[ $rc -eq 0 ] || fail "scale_launch.sh exited with $rc"
/usr/bin/python3 - "$out" <<'PY' || fail "figures"
import json, sys
figures = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
assert len(figures) == 5, "%d figure lines, not 5" % len(figures)
for f in figures:
    assert list(f) == ["bench", "metric", "value", "unit", "anchor", "anchor_value", "ratio"], f
    assert f["value"] > 0 and f["anchor_value"] > 0 and f["ratio"] > 0, f
    assert "4_nodes_16_agents" in f["metric"], f["metric"]
print("slurm_launch_scale_smoke_test: ok:", "; ".join(
    "%s %.2f s vs %s %.2f s" % (f["metric"], f["value"], f["anchor"], f["anchor_value"]) for f in figures))
PY
