#!/usr/bin/env bash
# examples/pytorch_ddp: a stock torch.distributed DDP script (gloo on CPU) run
# as a 2-rank agent by `agentctl run`, unmodified: it only sees the torchrun
# variables. Skips (exit 77) where `import torch` fails for /usr/bin/python3.
#   pytorch_ddp_test.sh BUILD_DIR
set -euo pipefail
# shellcheck source=tests/examples/lib.sh
source "${AGENTRT_SOURCE_DIR:?}/tests/examples/lib.sh"
example_test pytorch_ddp_test "$1" torch torch.distributed
"$build/bin/agentctl" run --help >/dev/null 2>&1 || fail "agentctl has no run command"
cd "$tmp"  # anywhere: the config's train.py is found next to it
# The python with torch first on PATH; agent-worker-free: the config's command is python3 train.py.
export PATH="/usr/bin:$build/bin:$PATH"
timeout 300 "$build/bin/agentctl" run "$src/examples/pytorch_ddp/agents.yaml" --set run.dir="$tmp/runs" --quiet \
  >"$tmp/run.log" 2>&1 || { cat "$tmp/run.log"; cat "$tmp"/runs/*/logs/ddp/* 2>/dev/null; fail "agentctl run exited non-zero"; }
run_dir=$(ls -d "$tmp"/runs/pytorch-ddp-* | head -1)
summary=$(cat "$run_dir"/logs/ddp/* | grep '^{"world_size"' | head -1)
echo "summary: $summary"
python3 - "$summary" <<'PY' || fail "the DDP run did not train as expected"
import json, sys
s = json.loads(sys.argv[1])
assert s["world_size"] == 2, s
assert s["backend"] == "gloo", s
assert s["final_loss"] < 0.5 * s["first_loss"], s
assert s["max_weight_diff"] == 0.0, s   # the replicas agree: gradients were all-reduced
PY
echo "pytorch_ddp_test: PASS"
