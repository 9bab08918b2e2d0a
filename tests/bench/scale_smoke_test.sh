#!/usr/bin/env bash
# bench_scale, shortened: 2,000 simulated agents against the real controller
# (and the views of that run timed), 100 real agentrt-test-agent agents under
# `agentctl run`, and 20 real agents reporting 100 times a second (and, as its
# anchor, every 100th step). Every
# simulated agent must be heard, every figure must be there, and every figure
# line must carry the seven keys.
#   scale_smoke_test.sh BUILD_DIR
set -euo pipefail
build=$(cd "$1" && pwd)
out=$(mktemp /tmp/agentrt-scale-smoke.XXXXXX)
trap 'rm -f "$out"' EXIT
fail() { echo "scale_smoke_test: FAIL: $*" >&2; cat "$out" >&2; exit 1; }

timeout 280 "$build/bench/bench_scale" --real 100 --simulated 2000 --flood 20 --window-s 2 >"$out" ||
  fail "bench_scale exited with $?"
/usr/bin/python3 - "$out" <<'PY' || fail "figures"
import json, sys
figures = {}
for line in open(sys.argv[1]):
    if not line.startswith("{"):
        continue
    f = json.loads(line)
    keys = ["bench", "metric", "value", "unit", "anchor", "anchor_value", "ratio"]
    assert list(f) == keys, "figure keys %s" % list(f)
    figures[f["metric"]] = f
need = ["controller_cpu_2000_simulated", "controller_rss_2000_simulated",
        "agents_heard_2000_simulated", "launch_rate_100_real", "controller_cpu_100_real",
        "controller_rss_100_real", "status_2000_simulated", "status_json_2000_simulated",
        "dashboard_cold_load_2000_simulated", "dashboard_first_load_2000_simulated",
        "metrics_endpoint_2000_simulated", "export_csv_2000_simulated",
        "agent_rate_min_20_real_100hz", "controller_rss_20_real_100hz"]
missing = [m for m in need if m not in figures]
assert not missing, "missing figures: %s" % missing
heard = figures["agents_heard_2000_simulated"]["value"]
assert heard == 2000, "the controller heard %s of 2000 simulated agents" % heard
assert figures["launch_rate_100_real"]["anchor"] == "fork/exec"
assert figures["launch_rate_100_real"]["anchor_value"] > 0
assert figures["agent_rate_min_20_real_100hz"]["value"] > 0, "a flooding agent made no steps"
flood = figures["agent_rate_min_20_real_100hz"]
assert flood["anchor"] == "the same agents reporting every 100th step", flood["anchor"]
assert flood["anchor_value"] > 0, "the flood's anchor run made no steps"
print("scale_smoke_test: ok:", ", ".join("%s=%s" % (m, figures[m]["value"]) for m in need))
PY
