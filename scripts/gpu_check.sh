#!/usr/bin/env bash
# gpu_check.sh: agentrt on a GPU machine, from the `make dist` tarball, in at
# most 6 minutes. It writes, flat under OUT_DIR (few files, so that a runner
# that hands back a handful of files gets them all):
#
#   summary.txt         one line per step: PASS, FAIL or SKIP, seconds, why
#   versions.txt        the NVIDIA driver, the GPUs (nvidia-smi), cudart and NCCL in use
#   inventory.txt       what `agentctl plan` detects on this machine (table, then JSON)
#   bench_gpu.jsonl     the GPU figures of bench_collectives and of a 1 GiB
#                       checkpoint of GPU tensors (JSON lines)
#   gpu_check.log       what this script said
#   gpu_check-results.tar.gz   every log: each `gpu` test case (tests/case<N>.log),
#                       the bench's stderr, agentrt.torch's CUDA cases, and the run
#                       directories of examples/pytorch_ddp and the torch PPO agent
#
# Steps: the driver and GPUs (stop here without them); cudart and NCCL; the
# inventory; each `gpu` test case on its own under a timeout, NCCL_DEBUG=WARN;
# the GPU bench; agentrt.torch's CUDA cases with this machine's python3; the
# checkpoint of 1 GiB of GPU tensors (save, restore, async stall); the
# two PyTorch examples on one GPU under `agentctl run`, checked to have used
# NCCL on the GPU. On a machine with a GPU a skipped step counts as failed.
#
# Usage:
#   check/gpu_check.sh OUT_DIR                   inside an unpacked tarball
#   scripts/gpu_check.sh --bundle B OUT_DIR      B: the tarball or its unpacked folder
#   ... --rehearse                               go on without a GPU: the GPU steps then
#                                                fail or skip within seconds and the
#                                                examples train on the CPU (gpus: 0)
# OUT_DIR defaults to $OUT. Exit 0 when every step passed, 1 otherwise (2: bad
# usage); without an NVIDIA driver or GPU it says so and exits 1 within seconds.
set -uo pipefail

budget_s=360
started=$(date +%s)
bundle=""
rehearse=0
out="${OUT:-}"
while [ $# -gt 0 ]; do
  case "$1" in
    --bundle) bundle=${2:-}; shift 2 ;;
    --rehearse) rehearse=1; shift ;;
    -h|--help) sed -n '2,30p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) echo "gpu_check: unknown option $1 (see --help)" >&2; exit 2 ;;
    *) out=$1; shift ;;
  esac
done
[ -n "$out" ] || { echo "gpu_check: name OUT_DIR (or set OUT)" >&2; exit 2; }
mkdir -p "$out" || exit 2
out=$(cd "$out" && pwd)
# Everything bulky (the unpacked tarball, runs, logs) lives here; the logs are
# packed into OUT_DIR at the end.
scratch=$(mktemp -d /tmp/agentrt-gpu-check.XXXXXX) || exit 2
trap 'rm -rf "$scratch"' EXIT
logs=$scratch/results
mkdir -p "$logs/tests"
summary=$out/summary.txt
: >"$summary"
: >"$out/gpu_check.log"

gpu_found=0
note() { echo "gpu_check: $*" | tee -a "$out/gpu_check.log" >&2; }
# record STEP PASS|FAIL|SKIP SECONDS WHY. With a GPU, SKIP is a failure: the
# step did not run where it should have.
record() {
  local state=$2 why=$4
  if [ "$state" = SKIP ] && [ "$gpu_found" -eq 1 ]; then state=FAIL why="skipped on a GPU machine: $why"; fi
  printf '%-28s %-4s %4ss  %s\n' "$1" "$state" "$3" "$why" | tee -a "$summary"
}
since() { echo $(($(date +%s) - $1)); }
left() { echo $((budget_s - ($(date +%s) - started))); }
# limit WANTED GRACE: seconds for a step that may take WANTED plus GRACE to be
# killed, within what is left of the budget; 0 when nothing is left.
limit() {
  local l=$(($(left) - $2))
  if [ "$l" -le 0 ]; then echo 0; elif [ "$l" -lt "$1" ]; then echo "$l"; else echo "$1"; fi
}
no_time() { record "$1" FAIL 0 "no time left of the ${budget_s}s budget"; }

# The bundle: given, or the folder above this script when it lies in one.
here=$(cd "$(dirname "$0")" && pwd)
if [ -z "$bundle" ] && [ -x "$here/../bin/agentctl" ]; then bundle=$(cd "$here/.." && pwd); fi
[ -n "$bundle" ] || { echo "gpu_check: no bundle: run check/gpu_check.sh from an unpacked tarball, or pass --bundle" >&2; exit 2; }
if [ -f "$bundle" ]; then
  mkdir -p "$scratch/bundle" && tar -xzf "$bundle" -C "$scratch/bundle" || { echo "gpu_check: cannot unpack $bundle" >&2; exit 2; }
  bundle=$(find "$scratch/bundle" -mindepth 1 -maxdepth 1 -type d | head -1)
fi
[ -n "$bundle" ] && [ -x "$bundle/bin/agentctl" ] || { echo "gpu_check: ${bundle:-the tarball} holds no bin/agentctl" >&2; exit 2; }
bundle=$(cd "$bundle" && pwd)
export PATH=$bundle/bin:$PATH
note "bundle $bundle ($(timeout 20 "$bundle/bin/agentctl" --version 2>&1)), results in $out"

# 1. A driver and a GPU, or stop here. The driver is there when /proc says so,
# nvidia-smi answers, or the linker knows libcuda.so.1 (some sandboxes serve
# their own /proc).
t0=$(date +%s)
proc_driver=""
[ -r /proc/driver/nvidia/version ] && proc_driver=$(head -1 /proc/driver/nvidia/version)
smi=""
if command -v nvidia-smi >/dev/null; then
  smi=$(timeout 20 nvidia-smi --query-gpu=index,name,memory.total,driver_version,pci.bus_id \
    --format=csv,noheader </dev/null 2>&1) || smi=""
fi
libcuda=$(ldconfig -p 2>/dev/null | awk '$1 == "libcuda.so.1" {print $NF; exit}')
{
  echo "driver (/proc): ${proc_driver:-none}"
  echo "libcuda.so.1: ${libcuda:-not in the linker cache}"
  echo "gpus (nvidia-smi): ${smi:-none}"
} >"$out/versions.txt"
if [ -z "$proc_driver" ] && [ -z "$smi" ] && [ -z "$libcuda" ]; then
  why="no NVIDIA GPU here: no NVIDIA driver (no /proc/driver/nvidia/version, no nvidia-smi, no libcuda.so.1)"
elif [ -z "$smi" ]; then
  why="no NVIDIA GPU here: an NVIDIA driver is installed but nvidia-smi lists no GPU"
else
  why=""
fi
example_gpus=1
if [ -n "$why" ]; then
  record driver FAIL "$(since "$t0")" "$why"
  if [ "$rehearse" -eq 0 ]; then
    note "$why; nothing else to check (--rehearse runs every step anyway)"
    exit 1
  fi
  note "$why; rehearsing every step anyway (the examples on the CPU)"
  example_gpus=0
else
  gpu_found=1
  record driver PASS "$(since "$t0")" "$(echo "$smi" | grep -c .) GPU(s): $(echo "$smi" | head -1)"
fi

# cudart and NCCL: the machine's own. Where the linker's cache lacks them, the
# CUDA folders go on LD_LIBRARY_PATH of agentrt's own programs only (`cuda`
# below), never of the PyTorch agents, whose CUDA libraries are their own.
cache_has() { ldconfig -p 2>/dev/null | awk -v n="$1" '$1 == n {print $NF; exit}'; }
cuda_dirs=""
found=""
find_lib() {  # sets found to the library's real file; adds its folder to cuda_dirs when needed
  local dir
  found=$(cache_has "$1")
  if [ -z "$found" ]; then
    for dir in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib \
      /usr/local/cuda-*/targets/x86_64-linux/lib /usr/local/cuda-*/lib64; do
      if [ -e "$dir/$1" ]; then
        found=$dir/$1
        case ":$cuda_dirs:" in *":$dir:"*) ;; *) cuda_dirs=${cuda_dirs:+$cuda_dirs:}$dir ;; esac
        break
      fi
    done
  fi
  [ -z "$found" ] || found=$(readlink -f "$found")
}
t0=$(date +%s)
find_lib libcudart.so.13
cudart=$found
find_lib libnccl.so.2
nccl=$found
user_ld_path=${LD_LIBRARY_PATH:-}
cuda() { LD_LIBRARY_PATH=${cuda_dirs}${LD_LIBRARY_PATH:+${cuda_dirs:+:}$LD_LIBRARY_PATH} "$@"; }
{
  echo "cudart: ${cudart:-not found}"
  echo "nccl: ${nccl:-not found}"
  echo "added to LD_LIBRARY_PATH of agentrt's programs: ${cuda_dirs:-nothing}"
} >>"$out/versions.txt"
if [ -n "$cudart" ] && [ -n "$nccl" ]; then
  record libraries PASS "$(since "$t0")" "$(basename "$cudart"), $(basename "$nccl")"
else
  record libraries FAIL "$(since "$t0")" "cudart ${cudart:-not found}, NCCL ${nccl:-not found}"
fi

# 2. What agentctl plan detects: one agent asking for every GPU nvidia-smi lists.
work=$scratch/work
mkdir -p "$work"
count=$(echo "$smi" | grep -c . || true)
[ "$count" -gt 0 ] || count=1
cat >"$work/inventory.yaml" <<EOF
run: {name: gpu-check, dir: "$work/runs"}
agents:
  - {name: probe, gpus: $count, command: [agent-worker], backend: single, ranks: 1}
EOF
t0=$(date +%s)
s=$(limit 30 5)
if [ "$s" -eq 0 ]; then
  no_time inventory
elif cuda timeout -k 5 "$s" agentctl plan "$work/inventory.yaml" >"$out/inventory.txt" 2>&1 </dev/null &&
  cuda timeout -k 5 "$s" agentctl plan "$work/inventory.yaml" --json >>"$out/inventory.txt" 2>/dev/null </dev/null; then
  record inventory PASS "$(since "$t0")" "$(grep -m1 '^inventory:' "$out/inventory.txt")"
else
  record inventory FAIL "$(since "$t0")" "$(tail -1 "$out/inventory.txt")"
fi

# 3. Each `gpu` test case on its own. Exit 77 is the program's "no GPU" skip;
# -w NoTests makes a name that matches no case an error, not a pass.
export NCCL_DEBUG=WARN
tests=$bundle/check/group_nccl_test
if [ ! -x "$tests" ]; then
  record gpu-tests FAIL 0 "the bundle has no check/group_nccl_test (not a CUDA build)"
else
  cuda timeout 20 "$tests" --list-test-names-only </dev/null 2>&1 | grep -v '^$' >"$logs/tests/cases.txt"
  n=0
  while read -r case_name; do
    n=$((n + 1))
    t0=$(date +%s)
    s=$(limit 60 5)
    if [ "$s" -eq 0 ]; then no_time "test $n"; continue; fi
    cuda timeout -k 5 "$s" "$tests" -w NoTests "${case_name//,/\\,}" >"$logs/tests/case$n.log" 2>&1 </dev/null
    rc=$?
    case $rc in
      0) state=PASS why="" ;;
      77) state=SKIP why="$(tail -1 "$logs/tests/case$n.log")" ;;
      124|137) state=FAIL why="timed out after ${s}s" ;;
      *) state=FAIL why="exit $rc: $(grep -m1 -E 'FAILED|REQUIRE|error|No test' "$logs/tests/case$n.log")" ;;
    esac
    record "test $n" "$state" "$(since "$t0")" "$case_name${why:+: $why}"
  done <"$logs/tests/cases.txt"
  [ "$n" -gt 0 ] || record gpu-tests FAIL 0 "group_nccl_test listed no cases: $(head -1 "$logs/tests/cases.txt")"
fi

# 4. The GPU bench.
t0=$(date +%s)
s=$(limit 90 5)
if [ ! -x "$bundle/check/bench_collectives" ]; then
  record bench FAIL 0 "the bundle has no check/bench_collectives (not a CUDA build)"
elif [ "$s" -eq 0 ]; then
  no_time bench
else
  cuda timeout -k 5 "$s" "$bundle/check/bench_collectives" --gpu-only >"$out/bench_gpu.jsonl" 2>"$logs/bench_gpu.log" </dev/null
  rc=$?
  figures=$(grep -c '^{' "$out/bench_gpu.jsonl" || true)
  if [ "$rc" -eq 0 ] && [ "$figures" -gt 0 ]; then
    record bench PASS "$(since "$t0")" "$figures figures"
  else
    record bench FAIL "$(since "$t0")" "exit $rc, $figures figures: $(tail -1 "$logs/bench_gpu.log")"
  fi
fi

# 5. agentrt.torch's CUDA cases with this machine's own python3 and PyTorch
# (among them a CUDA model's weights through a weight stream: read back in
# the process, and GPU to GPU by another through CUDA IPC).
export PYTHONPATH=$bundle/python${PYTHONPATH:+:$PYTHONPATH}
export AGENTRT_C_LIBRARY=$bundle/lib/libagentrt_c.so
t0=$(date +%s)
s=$(limit 90 5)
if ! command -v python3 >/dev/null; then
  record torch-cuda FAIL 0 "no python3 on PATH"
elif [ "$s" -eq 0 ]; then
  no_time torch-cuda
else
  AGENTRT_BIN_DIR=$bundle/bin timeout -k 5 "$s" python3 "$bundle/check/python/agentrt_torch_test.py" cuda \
    >"$logs/torch_cuda.log" 2>&1 </dev/null
  rc=$?
  case $rc in
    0) record torch-cuda PASS "$(since "$t0")" "$(python3 -c 'import torch; print("torch", torch.__version__, "CUDA", torch.version.cuda)' 2>&1 | tail -1)" ;;
    77) record torch-cuda SKIP "$(since "$t0")" "$(tail -1 "$logs/torch_cuda.log")" ;;
    *) record torch-cuda FAIL "$(since "$t0")" "exit $rc: $(tail -1 "$logs/torch_cuda.log")" ;;
  esac
fi

# 6. A checkpoint of 1 GiB of GPU tensors through agentrt.torch: the save
# against torch.save + fsync, the restore, and the async save's stall.
t0=$(date +%s)
s=$(limit 75 5)
if [ "$s" -eq 0 ]; then
  no_time checkpoint-cuda
else
  before=$(grep -c '^{' "$out/bench_gpu.jsonl" 2>/dev/null || true)
  AGENTRT_BENCH_DIR=$scratch timeout -k 5 "$s" python3 "$bundle/check/python/python_bench.py" checkpoint_cuda \
    >>"$out/bench_gpu.jsonl" 2>"$logs/checkpoint_cuda.log" </dev/null
  rc=$?
  figures=$(($(grep -c '^{' "$out/bench_gpu.jsonl" 2>/dev/null || true) - ${before:-0}))
  if [ "$rc" -eq 0 ] && [ "$figures" -gt 0 ]; then
    record checkpoint-cuda PASS "$(since "$t0")" "$figures figures"
  elif [ "$rc" -eq 0 ]; then
    record checkpoint-cuda SKIP "$(since "$t0")" "$(tail -1 "$logs/checkpoint_cuda.log")"
  else
    record checkpoint-cuda FAIL "$(since "$t0")" "exit $rc: $(tail -1 "$logs/checkpoint_cuda.log")"
  fi
fi

# 7. The PyTorch examples under agentctl run, one GPU each (the CPU when
# rehearsing): the agent's own log must say it used NCCL on the GPU (gloo when
# rehearsing), and the PPO agent must have reported metrics and checkpointed.
expect=$([ "$example_gpus" -eq 1 ] && echo nccl || echo gloo)
agent_ld_path=""
[ -z "$cuda_dirs" ] || agent_ld_path=", LD_LIBRARY_PATH: \"$user_ld_path\""
run_example() {  # NAME SECONDS PATTERN_IN_RANK0_LOG COMMAND_YAML [ARGS_YAML]
  local name=$1 seconds=$2 pattern=$3 command=$4 args=${5:-} dir=$logs/run_$1 rc s run_dir
  mkdir -p "$dir"
  cat >"$dir/agents.yaml" <<EOF
run: {name: $name, dir: "$dir"}
bus: {port: auto}
defaults:
  checkpoint: {interval_s: 5, keep_last: 2}
  env: {PYTHONUNBUFFERED: "1", OMP_NUM_THREADS: "1"$agent_ld_path}
agents:
  - name: $name
    gpus: $example_gpus
    command: $command
${args:+    args: $args}
channels:
  - {topic: "weights/{agent}", publishers: ["*"], subscribers: ["*"]}
EOF
  t0=$(date +%s)
  s=$(limit "$seconds" 15)
  if [ "$s" -eq 0 ]; then no_time "run $name"; return; fi
  # agentctl itself may need the CUDA folders (its GPU inventory); its agents
  # get this machine's LD_LIBRARY_PATH as it was (agents.yaml env above).
  cuda timeout -k 10 "$s" agentctl run "$dir/agents.yaml" >"$dir/output.txt" 2>&1 </dev/null
  rc=$?
  run_dir=$(find "$dir" -mindepth 1 -maxdepth 1 -type d -name "$name-*" | head -1)
  local log=${run_dir:-$dir}/logs/$name/rank0.log
  local metrics checkpoints
  metrics=$(cat "${run_dir:-$dir}/metrics.jsonl" 2>/dev/null | grep -c .)
  checkpoints=$(ls -d "${run_dir:-$dir}"/checkpoints/*/step-*/manifest.json 2>/dev/null | wc -l)
  local facts="$metrics metric lines, $checkpoints checkpoints, $(grep -m1 -o "$pattern" "$log" 2>/dev/null || echo "no '$pattern' in its log")"
  if [ "$rc" -ne 0 ]; then
    record "run $name" FAIL "$(since "$t0")" "exit $rc ($facts): $(tail -1 "$dir/output.txt")"
  elif ! grep -q "$pattern" "$log" 2>/dev/null; then
    record "run $name" FAIL "$(since "$t0")" "finished, but its log does not say '$pattern' ($facts)"
  elif [ "$name" = torch-ppo ] && { [ "$metrics" -eq 0 ] || [ "$checkpoints" -eq 0 ]; }; then
    record "run $name" FAIL "$(since "$t0")" "finished without metrics or a checkpoint ($facts)"
  else
    record "run $name" PASS "$(since "$t0")" "$facts"
  fi
}
run_example pytorch-ddp 60 "\"backend\": \"$expect\"" \
  "[python3, \"$bundle/examples/pytorch_ddp/train.py\", --epochs, \"3\"]"
run_example torch-ppo 90 "($expect on " "[python3, \"$bundle/examples/torch_ppo/train.py\"]" \
  "{env: pursuit, role: prey, steps: 6000, num_envs: 16, rollout_steps: 64, snapshot_every: 2}"

# The runs' secrets (bus tokens, the run secret) stay behind.
tar -C "$scratch" --exclude=secrets -czf "$out/gpu_check-results.tar.gz" results 2>/dev/null ||
  note "could not pack the logs into $out/gpu_check-results.tar.gz"
failed=$(grep -c ' FAIL ' "$summary" || true)
note "done in $(since "$started") s: $(grep -c ' PASS ' "$summary" || true) passed, $failed failed, $(grep -c ' SKIP ' "$summary" || true) skipped ($summary)"
[ "$failed" -eq 0 ]
