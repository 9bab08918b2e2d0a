#!/usr/bin/env bash
# examples/weights through `agentctl run`: the actor follows the learner's
# versions to the last (step 5), reading them mapped from the broker's file;
# keep_last 2 leaves 2 payload files and the spool is gone after the run.
# Skips (exit 77) where /usr/bin/python3 has no NumPy.
#   weights_test.sh BUILD_DIR
set -euo pipefail
# shellcheck source=tests/examples/lib.sh
source "${AGENTRT_SOURCE_DIR:?}/tests/examples/lib.sh"
example_test weights_test "$1" numpy
cd "$tmp"
export PATH="/usr/bin:$build/bin:$PATH"
timeout 120 "$build/bin/agentctl" run "$src/examples/weights/agents.yaml" --set run.dir="$tmp/runs" --quiet \
  >"$tmp/run.log" 2>&1 || { cat "$tmp/run.log"; cat "$tmp"/runs/*/logs/*/* 2>/dev/null; fail "agentctl run exited non-zero"; }
run_dir=$(ls -d "$tmp"/runs/weights-* | head -1)
log="$run_dir/logs/actor/rank0.log"
cat "$log"
grep -q "version 5 of learner (step 5, mapped): b\[0\] = 5.0, w\[1\] = 5.0" "$log" ||
  fail "the actor did not read version 5 mapped from the broker's file"
grep -q "bus: 5 large payloads taken over from the spool, 0 received in chunks" "$run_dir/logs/learner/rank0.log" ||
  { cat "$run_dir/logs/learner/rank0.log"; fail "the learner's versions did not go through the spool"; }
blobs=$(find "$run_dir/bus" -name '*.blob' | wc -l)
[ "$blobs" -eq 2 ] || fail "keep_last 2 should leave 2 payload files, found $blobs"
[ ! -e "$run_dir/bus/incoming" ] || fail "the spool outlived the run"
echo "weights_test: PASS"
