#!/usr/bin/env bash
# Acceptance: `kill -9` of one rank of a 2-rank agent-worker agent
# during a run. The controller tears the agent down and restarts it; the agent
# resumes from its newest checkpoint (step S > 0) and its learning curve goes
# on from S (the first report after the restart is S + one update), not from 0.
#   agent_worker_kill_test.sh BUILD_DIR
set -euo pipefail
build=$(cd "$1" && pwd)
src=${AGENTRT_SOURCE_DIR:?}
here=$(cd "$(dirname "$0")" && pwd)
fail() { echo "agent_worker_kill_test: FAIL: $*" >&2; [ -n "${run_dir:-}" ] && tail -n 15 "$run_dir"/logs/*/*.log >&2; exit 1; }
"$build/bin/agentctl" run --help >/dev/null 2>&1 || fail "agentctl has no run command yet"
tmp=$(mktemp -d /tmp/agentrt-kill.XXXXXX)
ctl=""
cleanup() { [ -n "$ctl" ] && kill -9 "$ctl" 2>/dev/null; rm -rf "$tmp"; }
trap cleanup EXIT
export PATH="$build/bin:$PATH"
json() { python3 -c "import json,sys; s=json.load(open(sys.argv[1])); $2" "$run_dir/status.json"; }
wait_for() {  # wait_for SECONDS DESCRIPTION COMMAND...
  local limit=$1 what=$2; shift 2
  for _ in $(seq 1 $((limit * 5))); do "$@" >/dev/null 2>&1 && return 0; sleep 0.2; done
  fail "timed out after ${limit}s waiting for $what"
}

agentctl run "$here/agent_worker_kill.yaml" --set run.dir="$tmp/runs" --quiet >"$tmp/run.log" 2>&1 &
ctl=$!
wait_for 60 "the run directory" bash -c "ls $tmp/runs/*/status.json"
run_dir=$(dirname "$(ls "$tmp"/runs/*/status.json | head -1)")
pred='[a for a in s["agents"] if a["name"]=="predator"][0]'
wait_for 180 "a committed checkpoint of predator" \
  json "$run_dir/status.json" "a=$pred; sys.exit(0 if a.get('last_checkpoint_step') else 1)"
ckpt_step=$(json "$run_dir/status.json" "a=$pred; print(a['last_checkpoint_step'])")
echo "predator checkpointed at env step $ckpt_step"

# Rank 1 of predator: the agent-worker process with that agent and rank in its environment.
victim=""
for p in $(pgrep -x agent-worker); do
  env_of=$(tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null || true)
  if grep -qx "AGENTRT_AGENT=predator" <<<"$env_of" && grep -Eqx "(RANK|OMPI_COMM_WORLD_RANK)=1" <<<"$env_of"; then
    victim=$p
  fi
done
[ -n "$victim" ] || fail "no agent-worker process of predator rank 1 found"
lines_before=$(wc -l <"$run_dir/metrics.jsonl")
max_before=$(python3 -c "
import json,sys
print(max([json.loads(l)['step'] for l in open(sys.argv[1]) if '\"predator\"' in l] or [0]))" "$run_dir/metrics.jsonl")
echo "kill -9 $victim (predator rank 1); predator had reported up to step $max_before"
kill -9 "$victim"

wait_for 120 "predator to be restarted" \
  json "$run_dir/status.json" "a=$pred; sys.exit(0 if a['restarts']>=1 and a['state']=='running' else 1)"
wait_for 120 "the restarted predator to resume" grep -q "resumed at env step" "$run_dir/logs/predator/rank0.log"
resumed=$(sed -n 's/.*resumed at env step \([0-9]*\).*/\1/p' "$run_dir/logs/predator/rank0.log" | tail -1)
echo "predator resumed at env step $resumed"
[ "$resumed" -ge "$ckpt_step" ] || fail "resumed at $resumed, before the checkpoint $ckpt_step seen earlier"
# Wait for two reports after the restart, then stop the run.
after() { python3 - "$run_dir/metrics.jsonl" "$lines_before" "$resumed" <<'PY'
import json, sys
lines = open(sys.argv[1]).read().splitlines()[int(sys.argv[2]):]
resumed = int(sys.argv[3])
steps = [json.loads(l)["step"] for l in lines if '"predator"' in l and '"rank":0' in l.replace(" ", "")]
post = [s for s in steps if s > resumed and s <= resumed + 4 * 1024]
sys.exit(0 if len(post) >= 2 else 1)
PY
}
wait_for 120 "metrics of the restarted predator" after
agentctl stop "$run_dir" >/dev/null
for _ in $(seq 1 300); do kill -0 "$ctl" 2>/dev/null || break; sleep 0.2; done
kill -0 "$ctl" 2>/dev/null && fail "agentctl run did not end within 60 s of agentctl stop"
wait "$ctl" || true
ctl=""

python3 - "$run_dir" "$lines_before" "$resumed" <<'PY' || fail "the curve does not continue from the checkpoint"
import json, os, sys
run, n0, resumed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
recs = [json.loads(l) for l in open(os.path.join(run, "metrics.jsonl")) if l.strip()]
pred = [r for r in recs[n0:] if r["agent"] == "predator" and r.get("rank", 0) == 0 and "updates" in r["metrics"]]
# Reports between the kill and the teardown may still come from the old incarnation;
# the restarted one starts at the first step that goes back.
restart_at = next((i for i in range(1, len(pred)) if pred[i]["step"] < pred[i - 1]["step"]), 0)
post = pred[restart_at:]
assert post, "no reports after the restart"
first = post[0]["step"]
print(f"first report after the restart: env step {first} (resumed at {resumed}, one update = 1024 steps)")
assert first == resumed + 1024, f"first post-restart report at {first}, expected {resumed + 1024}"
assert all(r["step"] > resumed for r in post), "a post-restart report went below the checkpointed step"
status = json.load(open(os.path.join(run, "status.json")))
a = [a for a in status["agents"] if a["name"] == "predator"][0]
assert a["restarts"] == 1, a
prey = [a for a in status["agents"] if a["name"] == "prey"][0]
assert prey["restarts"] == 0, f"the prey was restarted too: {prey}"
PY
# The bus side of the resume: the restarted predator subscribes to the
# prey's policy topic from the offset its checkpoint stored (less one: it re-reads
# the newest snapshot it had), not from the start of the log.
python3 - "$run_dir" "$resumed" <<'PY' || fail "the restarted predator did not resume its bus subscription from the checkpoint"
import glob, json, os, re, sys
run, resumed = sys.argv[1], int(sys.argv[2])
manifests = [json.load(open(m)) for m in glob.glob(os.path.join(run, "checkpoints", "predator", "step-*", "manifest.json"))]
meta = [m["metadata"] for m in manifests if m["metadata"].get("env_steps") == resumed]
assert meta, f"no checkpoint with env_steps {resumed} is left (keep_last) to compare with"
stored = meta[0]["bus_offsets"]["weights/prey"]
log = open(os.path.join(run, "logs", "predator", "rank0.log")).read()
after = log[log.rindex("resumed at env step"):]
m = re.search(r"subscription weights/prey: connected at offset (\d+)", after)
assert m, "no subscription line after the resume"
got = int(m.group(1))
print(f"checkpoint stored offset {stored} for weights/prey; the restarted predator subscribed at {got}")
assert stored > 1 and got == stored - 1, (stored, got)
PY
echo "agent_worker_kill_test: PASS"
