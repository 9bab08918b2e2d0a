#!/usr/bin/env bash
# gpu_check.sh: agentrt on a GPU machine, from the `make dist` tarball, in at
# most 5 minutes, every result under OUT_DIR:
#
#   versions.txt        the NVIDIA driver, the GPUs (nvidia-smi), cudart and NCCL in use
#   inventory.txt/.json what `agentctl plan` detects on this machine
#   tests/<case>.log    each `gpu` test case on its own, under a timeout, NCCL_DEBUG=WARN
#   bench_gpu.jsonl     the GPU figures of bench_collectives (JSON lines)
#   torch_cuda.log      agentrt.torch's CUDA cases with this machine's python3
#   run_<example>/      examples/pytorch_ddp and the torch PPO agent on one GPU
#                       under `agentctl run` (the run directory and its output)
#   summary.txt         one line per step: PASS, FAIL or SKIP, seconds, why
#
# Usage:
#   check/gpu_check.sh OUT_DIR                   inside an unpacked tarball
#   scripts/gpu_check.sh --bundle B OUT_DIR      B: the tarball or its unpacked folder
#   ... --rehearse                               go on without a GPU: every GPU step then
#                                                fails or skips quickly and the examples
#                                                run on the CPU (gpus: 0): tries the script
# OUT_DIR defaults to $OUT. Exit 0 when every step passed, 1 otherwise; without
# an NVIDIA driver or GPU it says so and exits 1 within seconds.
set -uo pipefail

budget_s=300
started=$(date +%s)
bundle=""
rehearse=0
out="${OUT:-}"
while [ $# -gt 0 ]; do
  case "$1" in
    --bundle) bundle=$2; shift 2 ;;
    --rehearse) rehearse=1; shift ;;
    -h|--help) sed -n '2,22p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) echo "gpu_check: unknown option $1 (see --help)" >&2; exit 2 ;;
    *) out=$1; shift ;;
  esac
done
[ -n "$out" ] || { echo "gpu_check: name OUT_DIR (or set OUT)" >&2; exit 2; }
mkdir -p "$out" || exit 2
out=$(cd "$out" && pwd)
summary=$out/summary.txt
: >"$summary"

note() { echo "gpu_check: $*" | tee -a "$out/gpu_check.log" >&2; }
# record STEP PASS|FAIL|SKIP SECONDS WHY
record() { printf '%-28s %-4s %4ss  %s\n' "$1" "$2" "$3" "$4" | tee -a "$summary"; }
left() { echo $((budget_s - ($(date +%s) - started))); }
# limit WANTED: WANTED seconds, or what is left of the budget if less (at least 1).
limit() { local l; l=$(left); [ "$l" -lt "$1" ] && echo $((l > 1 ? l : 1)) || echo "$1"; }

# The bundle: given, or the folder above this script when it lies in one.
here=$(cd "$(dirname "$0")" && pwd)
if [ -z "$bundle" ] && [ -x "$here/../bin/agentctl" ]; then bundle=$(cd "$here/.." && pwd); fi
[ -n "$bundle" ] || { echo "gpu_check: no bundle: run check/gpu_check.sh from an unpacked tarball, or pass --bundle" >&2; exit 2; }
if [ -f "$bundle" ]; then
  mkdir -p "$out/bundle" && tar -xzf "$bundle" -C "$out/bundle" || { echo "gpu_check: cannot unpack $bundle" >&2; exit 2; }
  bundle=$(find "$out/bundle" -mindepth 1 -maxdepth 1 -type d | head -1)
fi
[ -x "$bundle/bin/agentctl" ] || { echo "gpu_check: $bundle holds no bin/agentctl" >&2; exit 2; }
bundle=$(cd "$bundle" && pwd)
export PATH=$bundle/bin:$PATH
note "bundle $bundle ($("$bundle/bin/agentctl" --version 2>&1)), results in $out"

# 1. A driver and a GPU, or stop here.
example_gpus=1
t0=$(date +%s)
driver=""
[ -r /proc/driver/nvidia/version ] && driver=$(head -1 /proc/driver/nvidia/version)
gpus=""
if command -v nvidia-smi >/dev/null; then
  gpus=$(timeout 20 nvidia-smi --query-gpu=index,name,memory.total,driver_version,pci.bus_id \
    --format=csv,noheader 2>&1) || gpus=""
fi
{
  echo "driver: ${driver:-none (no /proc/driver/nvidia/version)}"
  echo "gpus (nvidia-smi): ${gpus:-none}"
} >"$out/versions.txt"
if [ -z "$driver" ] || [ -z "$gpus" ]; then
  why="no NVIDIA GPU here: $([ -z "$driver" ] && echo "no NVIDIA driver (/proc/driver/nvidia/version absent)" || echo "nvidia-smi lists no GPU")"
  record driver FAIL $(($(date +%s) - t0)) "$why"
  if [ "$rehearse" -eq 0 ]; then
    note "$why; nothing else to check (--rehearse runs every step anyway)"
    exit 1
  fi
  note "$why; rehearsing every step anyway (the examples on the CPU)"
  example_gpus=0
else
  record driver PASS $(($(date +%s) - t0)) "$(echo "$gpus" | wc -l) GPU(s); $driver"
fi

# cudart and NCCL: the machine's own, where the linker or /usr/local/cuda has them.
libdirs=$(ls -d /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib \
  /usr/local/cuda-*/targets/x86_64-linux/lib 2>/dev/null | tr '\n' ':')
export LD_LIBRARY_PATH=${libdirs}${LD_LIBRARY_PATH:-}
find_lib() {
  local dir
  for dir in ${LD_LIBRARY_PATH//:/ }; do
    [ -e "$dir/$1" ] && { readlink -f "$dir/$1"; return; }
  done
  ldconfig -p 2>/dev/null | awk -v n="$1" '$1 == n {print $NF; exit}' | xargs -r readlink -f
}
t0=$(date +%s)
cudart=$(find_lib libcudart.so.13)
nccl=$(find_lib libnccl.so.2)
{
  echo "cudart: ${cudart:-not found}"
  echo "nccl: ${nccl:-not found}"
} >>"$out/versions.txt"
if [ -n "$cudart" ] && [ -n "$nccl" ]; then
  record libraries PASS $(($(date +%s) - t0)) "$(basename "$cudart"), $(basename "$nccl")"
else
  record libraries FAIL $(($(date +%s) - t0)) "cudart ${cudart:-not found}, NCCL ${nccl:-not found}"
fi

# 2. What agentctl plan detects: one agent asking for every GPU nvidia-smi lists.
work=$out/work
mkdir -p "$work"
count=$(echo "$gpus" | grep -c . || true)
[ "$count" -gt 0 ] || count=1
cat >"$work/inventory.yaml" <<EOF
run: {name: gpu-check, dir: $work/runs}
agents:
  - {name: probe, gpus: $count, command: [agent-worker], backend: single, ranks: 1}
EOF
t0=$(date +%s)
if timeout "$(limit 30)" agentctl plan "$work/inventory.yaml" >"$out/inventory.txt" 2>&1 &&
  timeout "$(limit 30)" agentctl plan "$work/inventory.yaml" --json >"$out/inventory.json" 2>>"$out/inventory.txt"; then
  record inventory PASS $(($(date +%s) - t0)) "$(head -1 "$out/inventory.txt")"
else
  record inventory FAIL $(($(date +%s) - t0)) "$(tail -1 "$out/inventory.txt")"
fi

# 3. Each `gpu` test case on its own (Catch2: exit 77 is the program's "no GPU" skip).
export NCCL_DEBUG=WARN
mkdir -p "$out/tests"
tests=$bundle/check/group_nccl_test
if [ ! -x "$tests" ]; then
  record gpu-tests FAIL 0 "the bundle has no check/group_nccl_test (not a CUDA build)"
else
  "$tests" --list-test-names-only 2>/dev/null | grep -v '^$' >"$out/tests/cases.txt"
  n=0
  while read -r case_name; do
    n=$((n + 1))
    t0=$(date +%s)
    timeout -k 5 "$(limit 60)" "$tests" "${case_name//,/\\,}" >"$out/tests/case$n.log" 2>&1
    rc=$?
    case $rc in
      0) state=PASS why="" ;;
      77) state=SKIP why="$(tail -1 "$out/tests/case$n.log")" ;;
      124|137) state=FAIL why="timed out" ;;
      *) state=FAIL why="exit $rc: $(grep -m1 -E 'FAILED|REQUIRE|error' "$out/tests/case$n.log")" ;;
    esac
    record "test $n" "$state" $(($(date +%s) - t0)) "$case_name${why:+: $why}"
  done <"$out/tests/cases.txt"
  [ "$n" -gt 0 ] || record gpu-tests FAIL 0 "group_nccl_test listed no cases"
fi

# 4. The GPU bench.
t0=$(date +%s)
if [ -x "$bundle/check/bench_collectives" ]; then
  timeout -k 5 "$(limit 90)" "$bundle/check/bench_collectives" --gpu-only >"$out/bench_gpu.jsonl" 2>"$out/bench_gpu.log"
  rc=$?
  figures=$(grep -c '^{' "$out/bench_gpu.jsonl" || true)
  if [ "$rc" -eq 0 ] && [ "$figures" -gt 0 ]; then
    record bench PASS $(($(date +%s) - t0)) "$figures figures"
  else
    record bench FAIL $(($(date +%s) - t0)) "exit $rc, $figures figures: $(tail -1 "$out/bench_gpu.log")"
  fi
else
  record bench FAIL 0 "the bundle has no check/bench_collectives (not a CUDA build)"
fi

# 5. agentrt.torch's CUDA cases with this machine's own python3 and PyTorch.
export PYTHONPATH=$bundle/python${PYTHONPATH:+:$PYTHONPATH}
export AGENTRT_C_LIBRARY=$bundle/lib/libagentrt_c.so
t0=$(date +%s)
if command -v python3 >/dev/null; then
  timeout -k 5 "$(limit 90)" python3 "$bundle/check/python/agentrt_torch_test.py" cuda >"$out/torch_cuda.log" 2>&1
  rc=$?
  case $rc in
    0) record torch-cuda PASS $(($(date +%s) - t0)) "" ;;
    77) record torch-cuda SKIP $(($(date +%s) - t0)) "$(tail -1 "$out/torch_cuda.log")" ;;
    *) record torch-cuda FAIL $(($(date +%s) - t0)) "exit $rc: $(tail -1 "$out/torch_cuda.log")" ;;
  esac
else
  record torch-cuda FAIL 0 "no python3 on PATH"
fi

# 6. The PyTorch examples on one GPU under agentctl run (NCCL, checkpoints, metrics).
run_example() {  # NAME SECONDS COMMAND_YAML ARGS_YAML
  local name=$1 seconds=$2 command=$3 args=$4 dir=$out/run_$1 rc
  mkdir -p "$dir"
  cat >"$dir/agents.yaml" <<EOF
run: {name: $name, dir: $dir}
bus: {port: auto}
defaults:
  checkpoint: {interval_s: 5, keep_last: 2}
  env: {PYTHONUNBUFFERED: "1", OMP_NUM_THREADS: "1"}
agents:
  - name: $name
    gpus: $example_gpus
    command: $command
${args:+    args: $args}
channels:
  - {topic: "policies/{agent}", publishers: ["*"], subscribers: ["*"]}
EOF
  t0=$(date +%s)
  timeout -k 10 "$(limit "$seconds")" agentctl run "$dir/agents.yaml" >"$dir/output.txt" 2>&1
  rc=$?
  local run_dir
  run_dir=$(find "$dir" -mindepth 1 -maxdepth 1 -type d -name "$name-*" | head -1)
  local facts="run dir ${run_dir:-none}"
  if [ -n "$run_dir" ]; then
    facts="$(cat "$run_dir/metrics.jsonl" 2>/dev/null | grep -c .) metric lines, $(ls -d "$run_dir"/checkpoints/*/step-*/manifest.json 2>/dev/null | wc -l) checkpoints, backend $(grep -o '"backend": *"[a-z]*"' "$run_dir/plan.json" | head -1 | grep -o '"[a-z]*"$')"
  fi
  if [ "$rc" -eq 0 ]; then
    record "run $name" PASS $(($(date +%s) - t0)) "$facts"
  else
    record "run $name" FAIL $(($(date +%s) - t0)) "exit $rc ($facts): $(tail -1 "$dir/output.txt")"
  fi
}
run_example pytorch-ddp 60 "[python3, $bundle/examples/pytorch_ddp/train.py, --epochs, \"3\"]" ""
run_example torch-ppo 90 "[python3, $bundle/examples/torch_ppo/train.py]" \
  "{env: pursuit, role: prey, steps: 6000, num_envs: 16, rollout_steps: 64, snapshot_every: 2}"

failed=$(grep -c ' FAIL ' "$summary" || true)
note "done in $(($(date +%s) - started)) s: $(grep -c ' PASS ' "$summary" || true) passed, $failed failed, $(grep -c ' SKIP ' "$summary" || true) skipped ($summary)"
[ "$failed" -eq 0 ]
