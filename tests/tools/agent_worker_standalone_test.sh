#!/usr/bin/env bash
# agent-worker as a program, started with a hand-made agent environment (no
# agentctl): it reaches its budget and checkpoints; a second start resumes from
# that checkpoint; SIGTERM makes it checkpoint and exit 0; two ranks under a
# real mpirun train as one MPI group (one shard per rank), and when one rank
# alone reads a bad chunk both restore the older checkpoint; a multi-agent env
# without a bus trains anyway and says so.
#   agent_worker_standalone_test.sh BUILD_DIR
set -euo pipefail
build=$(cd "$1" && pwd)
worker="$build/bin/agent-worker"
tmp=$(mktemp -d /tmp/agentrt-worker.XXXXXX)
pids=()
cleanup() { for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done; rm -rf "$tmp"; }
trap cleanup EXIT
fail() { echo "agent_worker_standalone_test: FAIL: $*" >&2; exit 1; }

# plan DIR AGENTS_JSON: a complete plan.json (tests/agentrt_testing.py) for the
# agents [{"name", "ranks", "backend", "args"}, ...].
plans() {
  mkdir -p "$1"
  /usr/bin/python3 - "$1/plan.json" "$2" <<'PY'
import json, os, sys
sys.path.insert(0, os.path.join(os.environ["AGENTRT_SOURCE_DIR"], "tests"))
from agentrt_testing import test_plan
json.dump(test_plan("t", json.loads(sys.argv[2])), open(sys.argv[1], "w"))
PY
}
plan() {  # plan DIR NAME RANKS BACKEND ARGS_JSON: one agent
  plans "$1" "[{\"name\": \"$2\", \"ranks\": $3, \"backend\": \"$4\", \"args\": $5}]"
}
agent_env() {  # agent_env DIR NAME
  echo AGENTRT_RUN_DIR="$1" AGENTRT_AGENT="$2" AGENTRT_AGENT_INDEX=0 AGENTRT_CKPT_DIR="$1/ckpt"
}

echo "== budget, checkpoint, resume (cartpole, 1 rank)"
d="$tmp/cp"
plan "$d" cp 1 single '{"env": "cartpole", "steps": 8192, "num_envs": 4, "rollout_steps": 128}'
out=$(env $(agent_env "$d" cp) RANK=0 WORLD_SIZE=1 timeout 120 "$worker" 2>&1) || { echo "$out"; fail "first run exited non-zero"; }
echo "$out"
grep -q "no checkpoint: fresh start" <<<"$out" || fail "first run did not start fresh"
grep -q "budget reached at env step 8192" <<<"$out" || fail "first run did not reach its budget"
test -f "$d/ckpt/step-8192/manifest.json" || fail "no committed checkpoint step-8192"
plan "$d" cp 1 single '{"env": "cartpole", "steps": 16384, "num_envs": 4, "rollout_steps": 128}'
out=$(env $(agent_env "$d" cp) RANK=0 WORLD_SIZE=1 timeout 120 "$worker" 2>&1) || { echo "$out"; fail "second run exited non-zero"; }
echo "$out"
grep -q "resumed at env step 8192 (update 16," <<<"$out" || fail "second run did not resume from step 8192"
grep -q "budget reached at env step 16384 (8192 this run" <<<"$out" || fail "second run did not continue to 16384"

echo "== SIGTERM: checkpoint and exit 0"
d="$tmp/term"
plan "$d" term 1 single '{"env": "cartpole", "steps": 100000000}'
env $(agent_env "$d" term) RANK=0 WORLD_SIZE=1 "$worker" >"$d.log" 2>&1 &
pid=$!; pids+=("$pid")
for _ in $(seq 1 600); do grep -q "fresh start" "$d.log" 2>/dev/null && break; sleep 0.1; done
sleep 1
kill -TERM "$pid"
rc=0
for _ in $(seq 1 600); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
kill -0 "$pid" 2>/dev/null && fail "the worker did not exit within 60 s of SIGTERM"
wait "$pid" || rc=$?
cat "$d.log"
[ "$rc" = 0 ] || fail "exit status $rc after SIGTERM"
step=$(sed -n 's/.*stopped at env step \([0-9]*\).*/\1/p' "$d.log")
[ -n "$step" ] && [ "$step" -gt 0 ] || fail "no 'stopped at env step' line"
test -f "$d/ckpt/step-$step/manifest.json" || fail "no checkpoint at the stop step $step"

echo "== two ranks under mpirun: one MPI group, one shard per rank"
d="$tmp/mpi"
plan "$d" mpi 2 mpi '{"env": "cartpole", "steps": 8192, "num_envs": 4, "rollout_steps": 128}'
out=$(env $(agent_env "$d" mpi) OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
      timeout 180 mpirun --oversubscribe --allow-run-as-root --bind-to none -np 2 \
        -x AGENTRT_RUN_DIR -x AGENTRT_AGENT -x AGENTRT_AGENT_INDEX -x AGENTRT_CKPT_DIR "$worker" 2>&1) \
  || { echo "$out"; fail "mpirun -np 2 agent-worker exited non-zero"; }
echo "$out"
grep -q "mpi rank 0: .*2 rank(s) on a mpi group" <<<"$out" || fail "rank 0 did not join a 2-rank MPI group"
grep -q "mpi rank 1: budget reached at env step 8192" <<<"$out" || fail "rank 1 did not reach the group budget"
test -f "$d/ckpt/step-8192/rank-0.shard" -a -f "$d/ckpt/step-8192/rank-1.shard" -a \
     -f "$d/ckpt/step-8192/manifest.json" || fail "the 2-rank checkpoint lacks a shard or its manifest"

echo "== a bad chunk that one rank alone reads: both ranks go back to the older checkpoint"
# Wide layers make each shard many 1 MiB verification chunks: rank 1's holds
# its slice of the parameters (which rank 0 reads too), then its blocks of
# Adam's moments, whose last elements (the tail) every rank reads; a chunk
# inside its first moment's block, before that block's last chunk, only
# rank 1 reads, so only rank 1 can see a flipped byte there.
d="$tmp/mpibad"
mpi2() {  # mpi2 STEPS: agent mpibad, 2 ranks, to STEPS env steps; its output in $out
  plan "$d" mpibad 2 mpi "{\"env\": \"cartpole\", \"steps\": $1, \"num_envs\": 4, \"rollout_steps\": 128, \"hidden\": 1024, \"eval_episodes\": 0}"
  out=$(env $(agent_env "$d" mpibad) OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
        timeout 180 mpirun --oversubscribe --allow-run-as-root --bind-to none -np 2 \
          -x AGENTRT_RUN_DIR -x AGENTRT_AGENT -x AGENTRT_AGENT_INDEX -x AGENTRT_CKPT_DIR "$worker" 2>&1) \
    || { echo "$out"; fail "mpirun -np 2 agent-worker to $1 steps exited non-zero"; }
}
flip_rank1_only() {  # flip_rank1_only STEP: a byte only rank 1 reads; its offset in $at
  at=$(/usr/bin/python3 - "$d/ckpt/step-$1/manifest.json" <<'PY'
import json, sys
shard = json.load(open(sys.argv[1]))["shards"][1]
m = next(e for e in shard["entries"] if e["name"] == "ppo.adam.m")
first, last = -(-m["offset"] // 2**20), (m["offset"] + m["bytes"]) // 2**20 - 1
print(first * 2**20 + 4096 if first < last else -1)  # a whole chunk of it, not its last
PY
)
  [ "$at" -gt 0 ] || fail "rank 1's block of Adam's first moment spans no chunk of its own"
  printf '\xff' | dd of="$d/ckpt/step-$1/rank-1.shard" bs=1 seek="$at" conv=notrunc status=none
}
mpi2 1024
mpi2 2048
flip_rank1_only 2048
mpi2 3072
echo "$out"
for r in 0 1; do
  grep -q "mpibad rank $r: restored step 1024.*skipped step 2048" <<<"$out" || fail "rank $r did not pass over step 2048"
  grep -q "mpibad rank $r: resumed at env step 1024 " <<<"$out" || fail "rank $r did not resume at step 1024"
done
grep -q "mpibad rank 1: restored step 1024.*rank-1.shard: bytes $((at - 4096))\.\..*checksum mismatch" <<<"$out" \
  || fail "rank 1 does not name the bad chunk"
grep -q "mpibad rank 0: restored step 1024.*another rank of the agent read a bad chunk" <<<"$out" \
  || fail "rank 0 does not say that another rank found it"
# The only checkpoint bad so: both ranks loaded part of it before they knew,
# so both start from a new trainer, and train from step 0.
d="$tmp/mpibad-only"
mpi2 1024
flip_rank1_only 1024
mpi2 2048
echo "$out"
for r in 0 1; do
  grep -q "mpibad rank $r: no intact checkpoint after step 1024: the trainer starts afresh" <<<"$out" \
    || fail "rank $r did not start afresh"
  grep -q "mpibad rank $r: budget reached at env step 2048 (2048 this run" <<<"$out" \
    || fail "rank $r did not train from step 0"
done

echo "== pursuit without a bus"
d="$tmp/pursuit"
plans "$d" '[{"name": "predator-0", "args": {"env": "pursuit", "role": "predator", "steps": 4096, "eval_episodes": 20}},
            {"name": "prey-0", "args": {"env": "pursuit", "role": "prey", "steps": 4096}}]'
out=$(env $(agent_env "$d" predator-0) RANK=0 WORLD_SIZE=1 timeout 120 "$worker" 2>&1) || { echo "$out"; fail "pursuit run exited non-zero"; }
echo "$out"
grep -q "this agent plays seat 0; seats played by others: 2=prey-0" <<<"$out" || fail "wrong seating"
grep -q "no bus (AGENTRT_BUS is not set)" <<<"$out" || fail "the log does not say that it runs without a bus"
grep -q "evaluation over 20 episodes against prey playing at random" <<<"$out" || fail "no evaluation"

echo "== a typo in args fails at start-up, naming the key"
d="$tmp/typo"
plan "$d" typo 1 single '{"env": "cartpole", "stepz": 10}'
rc=0; out=$(env $(agent_env "$d" typo) RANK=0 WORLD_SIZE=1 timeout 60 "$worker" 2>&1) || rc=$?
echo "$out"
[ "$rc" = 78 ] || fail "exit status $rc for a bad args key (want 78, EX_CONFIG: not worth a restart)"
grep -q "agent typo args: unknown parameter 'stepz'" <<<"$out" || fail "the error does not name the key"
echo "agent_worker_standalone_test: PASS"
