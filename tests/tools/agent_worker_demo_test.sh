#!/usr/bin/env bash
# Acceptance of the demo (configs/demo.yaml through `agentctl run`):
#  - every agent finishes within the budget of time the issue gives (3 minutes);
#  - pursuit predators trained against the prey's snapshots capture at least 3x
#    as often as uniformly random predators against the same prey snapshot
#    (evaluated by each predator at the end; same episode seeds for both);
#  - the bus carried the snapshots: every agent received snapshots of the
#    others, and the bus stats count the published messages;
#  - the predators' learning curves go up, and scripts/plot_curves.py writes
#    one SVG per agent into the run directory.
#   agent_worker_demo_test.sh BUILD_DIR [CONFIG]
set -euo pipefail
build=$(cd "$1" && pwd)
src=${AGENTRT_SOURCE_DIR:?}
config=${2:-$src/configs/demo.yaml}
fail() { echo "agent_worker_demo_test: FAIL: $*" >&2; exit 1; }
"$build/bin/agentctl" run --help >/dev/null 2>&1 || fail "agentctl has no run command yet"
tmp=$(mktemp -d /tmp/agentrt-demo.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
export PATH="$build/bin:$PATH"
cd "$src"
start=$(date +%s)
timeout 400 agentctl run "$config" --set run.dir="$tmp/runs" --quiet >"$tmp/run.log" 2>&1 \
  || { cat "$tmp/run.log"; tail -n 20 "$tmp"/runs/*/logs/*/*.log; fail "agentctl run exited non-zero"; }
elapsed=$(( $(date +%s) - start ))
cat "$tmp/run.log"
run_dir=$(ls -d "$tmp"/runs/*/ | head -1)
echo "run took ${elapsed}s; run dir $run_dir"
[ "$elapsed" -le 180 ] || fail "the demo took ${elapsed}s (it must finish within 3 minutes on a 2-core machine)"
grep -h "evaluation over\|bus stats\|budget reached" "$run_dir"/logs/*/*.log || true

python3 - "$run_dir" <<'PY' || fail "acceptance checks"
import json, os, sys
run = sys.argv[1]
status = json.load(open(os.path.join(run, "status.json")))
assert status["state"] == "succeeded", f"run state {status['state']}"
lines = [json.loads(l) for l in open(os.path.join(run, "metrics.jsonl")) if l.strip()]
by_agent = {}
for rec in lines:
    if rec.get("rank", 0) == 0:
        by_agent.setdefault(rec["agent"], []).append(rec)
for a in status["agents"]:
    if a["restarts"]:  # not a failure by itself; shown to explain what follows
        print(f"note: {a['name']} was restarted {a['restarts']} time(s): {a.get('reason', '')}")
predators = [a["name"] for a in status["agents"] if a["name"].startswith("predator")]
assert predators, "no predator agents in the run"
for name in [a["name"] for a in status["agents"]]:
    recs = by_agent.get(name, [])
    curve = [r["metrics"]["episode_return_mean"] for r in recs if "updates" in r["metrics"]]
    assert len(curve) >= 5, f"{name}: only {len(curve)} metrics reports"
    got = [r["metrics"].get("snapshots_received", 0) for r in recs if "updates" in r["metrics"]]
    assert max(got) > 0, f"{name}: received no policy snapshots over the bus"
    n = max(1, len(curve) // 5)
    first, last = sum(curve[:n]) / n, sum(curve[-n:]) / n
    print(f"{name}: {len(curve)} reports, episode_return_mean {first:.3f} -> {last:.3f}, "
          f"snapshots received {max(got)}")
    if name in predators:
        assert last > first, f"{name}: the learning curve did not go up ({first:.3f} -> {last:.3f})"
        evals = [r["metrics"] for r in recs if "eval_capture_rate" in r["metrics"]]
        assert evals, f"{name}: no evaluation reported"
        e = evals[-1]
        print(f"{name}: captures/episode trained {e['eval_capture_rate']:.3f} vs random predators "
              f"{e['eval_random_capture_rate']:.3f} (x{e['eval_capture_ratio']:.2f}), bus published "
              f"{e.get('bus_messages_published')}")
        assert e["eval_prey_snapshot"] == 1, f"{name}: evaluated without a prey snapshot"
        assert e["eval_capture_rate"] >= 3 * e["eval_random_capture_rate"], f"{name}: {e}"
        assert e["eval_capture_rate"] > 0, f"{name}: no captures at all"
        # Bus stats: at least every snapshot this agent received was published.
        assert e["bus_messages_published"] >= max(got), f"{name}: bus stats {e}"
PY
/usr/bin/python3 "$src/scripts/plot_curves.py" "$run_dir" | tee "$tmp/plot.log" || fail "plot_curves.py failed"
for a in predator-0 predator-1 prey-0; do
  test -s "$run_dir/plots/$a.svg" || fail "no plot for $a"
  grep -q "<polyline" "$run_dir/plots/$a.svg" || fail "the plot of $a has no curve"
done
# With matplotlib (the test set-up installs it), every agent on one figure too.
if /usr/bin/python3 -c "import matplotlib" 2>/dev/null; then
  head -c 8 "$run_dir/plots/curves.png" | od -An -c | grep -q "P   N   G" || fail "no PNG of all agents"
  grep -q "all agents: .*curves.png" "$tmp/plot.log" || fail "plot_curves.py did not name the figure"
else
  echo "agent_worker_demo_test: no matplotlib here: the figure of all agents is not checked"
fi
echo "agent_worker_demo_test: PASS"
