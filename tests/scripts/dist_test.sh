#!/usr/bin/env bash
# The `make dist` tarball on a bare system: a minimal Debian 12 root made with
# `debootstrap --variant=minbase` (plus python3 and NumPy, what a Python agent
# needs; cached between runs) holds none of the build's packages. The tarball
# is unpacked there and, inside a chroot (its own mount and PID namespaces,
# so nothing it starts or mounts outlives the test), runs `agentctl validate`,
# `plan` and a 2-agent `run`: agent-worker (C++) and a Python agent importing
# agentrt (tests/scripts/dist_python_agent.py: bus, metrics, checkpoint).
# scripts/gpu_check.sh runs from the tarball too: in the root it stops within
# seconds saying there is no GPU; on this machine --rehearse goes through
# every step without one.
#
# Usage: dist_test.sh BUILD_DIR. Needs root (chroot, mounts) and Debian's
# archive (the first run downloads ~60 MB); AGENTRT_DIST_ROOT_CACHE (default
# /var/cache/agentrt/debian12-minbase) keeps the root, AGENTRT_DEBIAN_MIRROR
# names another mirror.
set -uo pipefail
src=$(cd "$(dirname "$0")/../.." && pwd)
here=$src/tests/scripts

fail() {
  echo "dist_test: FAIL: $*" >&2
  exit 1
}
check() {  # check CONDITION_STATUS WHAT
  if [ "$1" -ne 0 ]; then fail "$2"; fi
  echo "dist_test: ok: $2"
}

if [ "${1:-}" = "--in-namespace" ]; then
  # Inside `unshare --mount --pid --fork`: the root is an overlay over the
  # cached one (which stays untouched), with /proc of this PID namespace.
  work=$2 cache=$3
  root=$work/root
  mkdir -p "$work/upper" "$work/overlay-work" "$root"
  mount -t overlay overlay -o "lowerdir=$cache,upperdir=$work/upper,workdir=$work/overlay-work" "$root"
  mount -t proc proc "$root/proc"
  mount --rbind /dev "$root/dev"
  mount --rbind -o ro /sys "$root/sys"
  cp /etc/hosts "$root/etc/hosts"
  # Port leases are machine-wide (plan/port_lease.h): share them with runs outside.
  mkdir -p /run/lock "$root/run/lock"
  mount --bind /run/lock "$root/run/lock"
  mkdir -p "$root/opt"
  tar -xzf "$work/agentrt.tar.gz" -C "$root/opt"
  exec chroot "$root" /usr/bin/env -i HOME=/root PATH=/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8 \
    /bin/bash /opt/test/inside.sh
fi

if [ "${1:-}" = "--in-root" ]; then
  # In the chroot (copied there as /opt/test/inside.sh): a user who unpacked
  # the tarball in /opt and put its bin/ on PATH.
  bundle=$(ls -d /opt/agentrt-*/)
  bundle=${bundle%/}
  export PATH=$bundle/bin:$PATH
  cd /opt/test

  missing=$(for f in "$bundle"/bin/* "$bundle"/lib/libagentrt_c.so; do ldd "$f" | grep 'not found' || true; done)
  [ -z "$missing" ]
  check $? "every program and libagentrt_c.so finds all its libraries in the bare root${missing:+: $missing}"
  version=$(agentctl --version)
  check $? "agentctl --version: $version"

  agentctl validate agents.yaml >validate.txt 2>&1
  check $? "agentctl validate agents.yaml: $(tail -1 validate.txt)"
  agentctl plan agents.yaml >plan.txt 2>&1
  check $? "agentctl plan agents.yaml"
  grep -q "^cpp " plan.txt && grep -q "^py " plan.txt
  check $? "the plan places both agents: $(tr '\n' ' ' <plan.txt | cut -c1-300)"

  rc=0
  timeout -k 10 300 agentctl run agents.yaml >run.txt 2>&1 || rc=$?
  [ "$rc" -eq 0 ] || { cat run.txt; find runs -name '*.log' -exec sh -c 'echo "== $1"; tail -20 "$1"' _ {} \;; }
  check $rc "agentctl run agents.yaml: the C++ and the Python agent finished (exit $rc)"
  run_dir=$(ls -d runs/bare-*/ | head -1)
  grep -rq "py agent: ok" "$run_dir/logs/py/"
  check $? "the Python agent read the C++ agent's policy from the bus, saved and restored its checkpoint"
  grep -qE '"agent": *"py".*"loss"' "$run_dir/metrics.jsonl"
  check $? "the Python agent's metrics are in metrics.jsonl"
  grep -qE '"agent": *"cpp".*"env_steps"' "$run_dir/metrics.jsonl"
  check $? "the C++ agent's metrics are in metrics.jsonl"
  for agent in cpp py; do
    ls "$run_dir"/checkpoints/"$agent"/step-*/manifest.json >/dev/null 2>&1
    check $? "$agent has a committed checkpoint ($(ls "$run_dir/checkpoints/$agent" | tr '\n' ' '))"
  done
  procs=$(for p in /proc/[0-9]*; do
    [ "${p#/proc/}" -eq $$ ] || [ "${p#/proc/}" -eq 1 ] && continue
    tr '\0' ' ' <"$p/cmdline" 2>/dev/null
    echo
  done)
  left=$(grep -E 'agentctl|agent-worker|agentrt-|python3' <<<"$procs")
  [ -z "$left" ]
  check $? "no process of the run is left${left:+: $left}"

  # gpu_check.sh from the tarball, on a machine without GPU: stops at once, says why.
  start=$(date +%s)
  rc=0
  "$bundle/check/gpu_check.sh" /opt/test/gpu-out >gpu.txt 2>&1 || rc=$?
  took=$(($(date +%s) - start))
  [ "$rc" -eq 1 ] && [ "$took" -le 10 ] && grep -q "no NVIDIA driver" gpu.txt
  check $? "gpu_check.sh without a GPU: exit $rc in ${took}s: $(tail -1 gpu.txt)"
  exit 0
fi

# The test itself, on this machine.
build=${1:?usage: dist_test.sh BUILD_DIR}
build=$(cd "$build" && pwd)
if [ "$(id -u)" -ne 0 ]; then
  echo "dist_test: skipped: needs root (debootstrap, chroot and mounts)"
  exit 77
fi
for tool in debootstrap unshare chroot patchelf; do
  command -v "$tool" >/dev/null || fail "$tool not found (scripts/setup.sh installs it)"
done
if ! unshare --mount --pid --fork --propagation private /bin/true 2>/dev/null; then
  echo "dist_test: skipped: root here cannot make mount and PID namespaces (unshare failed)"
  exit 77
fi

work=$(mktemp -d /tmp/agentrt-dist-test.XXXXXX)
trap 'rm -rf "$work"' EXIT

tarball=$("$src/scripts/dist.sh" "$build" "$work")
check $? "make dist wrote $(basename "$tarball")"
ln "$tarball" "$work/agentrt.tar.gz"
name=$(basename "$tarball" .tar.gz)
listing=$(tar -tzf "$tarball")
for entry in bin/agentctl bin/agent-worker bin/agentrt-bus bin/agentrt-exec-rank bin/agentrt-preflight \
  lib/libagentrt_c.so python/agentrt/__init__.py README.md check/gpu_check.sh; do
  grep -qx "$name/$entry" <<<"$listing"
  check $? "the tarball holds $entry"
done
mkdir -p "$work/unpacked"
tar -xzf "$tarball" -C "$work/unpacked"
runpath=$(readelf -d "$work/unpacked/$name/bin/agentctl" | grep -o 'RUNPATH.*\[.*\]')
[[ $runpath == *'[$ORIGIN/../lib]'* ]]
check $? "agentctl finds lib/ through its RUNPATH ($runpath)"
grep -q "glibc [0-9]" "$work/unpacked/$name/README.md"
check $? "the tarball's README says which glibc it needs: $(grep -o 'glibc [0-9.]*' "$work/unpacked/$name/README.md" | head -1)"

# The bare root, made once and kept (under a lock: two runs share it).
cache=${AGENTRT_DIST_ROOT_CACHE:-/var/cache/agentrt/debian12-minbase}
mirror=${AGENTRT_DEBIAN_MIRROR:-http://deb.debian.org/debian}
mkdir -p "$(dirname "$cache")"
(
  flock -w 900 9 || fail "waited 15 min for $cache.lock"
  if [ ! -e "$cache/.agentrt-complete" ]; then
    rm -rf "$cache" "$cache.partial"
    echo "dist_test: debootstrap --variant=minbase bookworm (python3, NumPy) into $cache"
    # In a mount namespace of its own: what it mounts in the root goes with it.
    unshare --mount --propagation private debootstrap --variant=minbase --include=python3,python3-numpy \
      bookworm "$cache.partial" "$mirror" >"$work/debootstrap.log" 2>&1 ||
      { tail -20 "$work/debootstrap.log"; fail "debootstrap from $mirror failed"; }
    mv "$cache.partial" "$cache"
    touch "$cache/.agentrt-complete"
  fi
) 9>"$cache.lock" || exit 1
build_deps=$(find "$cache/usr/lib" "$cache/lib" \( -name 'libgrpc*' -o -name 'libprotobuf*' -o -name 'libzmq*' \
  -o -name 'libyaml-cpp*' -o -name 'libmpi*' -o -name 'libisal*' -o -name 'libfmt*' -o -name 'libcares*' \) 2>/dev/null | head -5)
[ -z "$build_deps" ]
check $? "the bare root holds none of the build's libraries${build_deps:+: $build_deps}"

# The run the Python and the C++ agent do there.
mkdir -p "$work/upper/opt/test"
cp "$0" "$work/upper/opt/test/dist_test.sh"
printf '#!/bin/bash\nexec /bin/bash /opt/test/dist_test.sh --in-root\n' >"$work/upper/opt/test/inside.sh"
cp "$here/dist_python_agent.py" "$work/upper/opt/test/agent.py"
cat >"$work/upper/opt/test/agents.yaml" <<'EOF'
run: {name: bare, dir: runs}
bus: {port: auto}
defaults:
  restart: {max_restarts: 0}
  checkpoint: {interval_s: 1, keep_last: 2}
agents:
  - name: cpp
    command: [agent-worker]
    args: {env: pursuit, role: prey, steps: 4000, num_envs: 8, rollout_steps: 64, snapshot_every: 1}
  - name: py
    command: [python3, agent.py]
channels:
  - {topic: "weights/{agent}", publishers: ["*"], subscribers: ["*"]}
  - {topic: notes, publishers: ["*"], subscribers: ["*"]}
EOF
rc=0
timeout -k 10 420 unshare --mount --pid --fork --propagation private \
  /bin/bash "$0" --in-namespace "$work" "$cache" || rc=$?
check $rc "the tarball ran in the bare Debian root (exit $rc)"

# gpu_check.sh rehearsed on this machine (CUDA libraries, no GPU): every GPU
# step fails or skips quickly, the examples train on the CPU with Debian's
# python3 and PyTorch, and the script ends well inside its 6 minutes.
start=$(date +%s)
rc=0
PATH=/usr/bin:$PATH "$src/scripts/gpu_check.sh" --bundle "$tarball" --rehearse "$work/gpu-out" >"$work/gpu.txt" 2>&1 || rc=$?
took=$(($(date +%s) - start))
summary=$work/gpu-out/summary.txt
steps=$(awk '{print $1}' "$summary" | sort -u | tr '\n' ' ')
[ "$rc" -eq 1 ] && [ "$took" -le 360 ]
check $? "gpu_check.sh --rehearse without a GPU: exit $rc in ${took}s"
for step in driver libraries inventory "test|gpu-tests" bench torch-cuda checkpoint-cuda run; do
  grep -qE "^($step)" "$summary"
  check $? "gpu_check.sh reported its $step step ($steps)"
done
grep -q "^driver .* FAIL .*no NVIDIA driver" "$summary"
check $? "gpu_check.sh says there is no NVIDIA driver"
for example in pytorch-ddp torch-ppo; do
  grep -q "^run $example .* PASS " "$summary"
  check $? "gpu_check.sh ran $example under agentctl run (on the CPU here): $(grep "^run $example" "$summary")"
done
for kept in versions.txt inventory.txt gpu_check.log gpu_check-results.tar.gz; do
  [ -s "$work/gpu-out/$kept" ]
  check $? "gpu_check.sh wrote $kept"
done
secrets=$(tar -tzf "$work/gpu-out/gpu_check-results.tar.gz" | grep -E 'secrets/|\.token$|run\.secret' || true)
[ -z "$secrets" ]
check $? "the packed logs hold no secret${secrets:+: $secrets}"
cat "$work/gpu-out/summary.txt"
echo "dist_test: passed"
