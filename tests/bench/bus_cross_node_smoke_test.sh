#!/usr/bin/env bash
# bench/bus/cross_node.sh, shortened (--quick: 64 MiB, one repetition) on a
# 2-node test cluster of its own: 4 subscribers in the second node's
# namespace each get the version over the link, the ZeroMQ anchor's
# receivers too, and the figure line carries the seven keys with positive
# values. No goal is asserted (speed goals live in `make bench`). Skipped
# (77) where network namespaces cannot be made.
#   bus_cross_node_smoke_test.sh SOURCE_DIR BIN_DIR BENCH_BUS
set -uo pipefail
out=$(mktemp /tmp/agentrt-bus-cross-node-smoke.XXXXXX)
trap 'rm -f "$out"' EXIT
fail() { echo "bus_cross_node_smoke_test: FAIL: $*" >&2; cat "$out" >&2; exit 1; }
AGENTRT_SOURCE_DIR=$1 AGENTRT_BIN_DIR=$2 AGENTRT_BENCH_BUS=$3 MULTINODE_SKIP_CODE=77 timeout 200 \
  bash "$1/bench/bus/cross_node.sh" --quick >"$out" 2>&1
rc=$?
[ $rc -eq 77 ] && { cat "$out"; exit 77; }
[ $rc -eq 0 ] || fail "cross_node.sh exited with $rc"
grep -q "4 subscribers in art.*-n2 holding views" "$out" || fail "no subscriber ran in the second node"
/usr/bin/python3 - "$out" <<'PY' || fail "figures"
import json, sys
figures = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
assert len(figures) == 2, "%d figure lines, not 2" % len(figures)
for f in figures:
    assert list(f) == ["bench", "metric", "value", "unit", "anchor", "anchor_value", "ratio"], f
    assert f["value"] > 0 and f["anchor_value"] > 0 and f["ratio"] > 0, f
assert [f["metric"] for f in figures] == ["weights_64MiB_4subs_cross_node",
                                          "weights_64MiB_4subs_cross_node_no_node_cache"], figures
print("bus_cross_node_smoke_test: ok: %.2f GB/s (%.2f without the node folder) vs ZeroMQ %.2f GB/s"
      % (figures[0]["value"], figures[1]["value"], figures[0]["anchor_value"]))
PY
