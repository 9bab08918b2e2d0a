#!/usr/bin/env bash
# examples/custom_env end to end: install agentrt into a temporary prefix, build
# the example OUTSIDE the tree against it (find_package(agentrt)), run it as an
# agent with the installed `agentctl run` and the example's own agents.yaml, and
# check that it trained (return went up), checkpointed and finished.
#   custom_env_test.sh BUILD_DIR
set -euo pipefail
# shellcheck source=tests/examples/lib.sh
source "${AGENTRT_SOURCE_DIR:?}/tests/examples/lib.sh"
example_test custom_env_test "$1"

echo "== install into $tmp/prefix"
cmake --install "$build" --prefix "$tmp/prefix" >"$tmp/install.log" 2>&1 || { cat "$tmp/install.log"; fail "cmake --install"; }
test -f "$tmp/prefix/lib/cmake/agentrt/agentrtConfig.cmake" || fail "no agentrtConfig.cmake installed"
test -x "$tmp/prefix/bin/agentctl" || fail "agentctl not installed"
test -x "$tmp/prefix/bin/agentrt-exec-rank" || fail "agentrt-exec-rank not installed"

echo "== only the public headers are installed, and each one compiles on its own"
inc="$tmp/prefix/include/agentrt"
for internal in agent_runtime/group_internal.h agent_runtime/group_half.h agent_runtime/mpi_group.h \
                agent_runtime/sharded_adam_ops.h comms/broker.h comms/bus_server.h scheduler/planner.h; do
  test ! -e "$inc/$internal" || fail "internal header $internal is installed"
done
export AGENTRT_HDR_FLAGS="-std=c++20 -fsyntax-only -I$inc $(pkg-config --cflags protobuf) -I/usr/include/eigen3"
(cd "$inc" && find . -name '*.h' ! -name '*.pb.h' | sed 's|^\./||' | sort) |
  xargs -P 2 -I{} sh -c 'echo "#include \"{}\"" | g++ $AGENTRT_HDR_FLAGS -x c++ - >/dev/null 2>&1 ||
                         { echo "installed header {} does not compile on its own"; exit 255; }' \
  || fail "an installed header is not self-contained (see above)"

echo "== configure + build the example outside the tree"
cp -r "$src/examples/custom_env" "$tmp/custom_env"   # a copy: nothing of the agentrt tree is visible
generator=()
command -v ninja >/dev/null && generator=(-G Ninja)
launcher=()
command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
cmake -S "$tmp/custom_env" -B "$tmp/build" "${generator[@]}" "${launcher[@]}" \
  -DCMAKE_PREFIX_PATH="$tmp/prefix" >"$tmp/configure.log" 2>&1 || { cat "$tmp/configure.log"; fail "configure"; }
cmake --build "$tmp/build" -j2 >"$tmp/build.log" 2>&1 || { cat "$tmp/build.log"; fail "build"; }
test -x "$tmp/build/corridor-agent" || fail "corridor-agent not built"

export PATH="$tmp/build:$tmp/prefix/bin:$PATH"
cd "$tmp/custom_env"
echo "== agentctl run agents.yaml (installed agentctl)"
timeout 300 agentctl run agents.yaml --set run.dir="$tmp/runs" --quiet >"$tmp/run.log" 2>&1 \
  || { cat "$tmp/run.log"; fail "agentctl run exited non-zero"; }
run_dir=$(ls -d "$tmp"/runs/custom-env-* | head -1)
test -d "$run_dir" || fail "no run directory under $tmp/runs"
log=$(cat "$run_dir"/logs/corridor/rank0.log)
metrics="$run_dir/metrics.jsonl"
ckpt="$run_dir/checkpoints/corridor"
echo "$log"
grep -q "done at step 2[0-9]\{4\}" <<<"$log" || fail "the agent did not report reaching its budget"
# The plan's checkpoint policy (interval_s: 2 in agents.yaml) reaches the agent
# through its Runtime: over a ~5 s run the interval fires at least twice.
due=$(grep -c "checkpoint due at step" <<<"$log" || true)
[ "$due" -ge 2 ] || fail "only $due interval-triggered checkpoints; the plan's interval_s: 2 did not reach the agent"
ls "$ckpt" | grep -q '^step-' || fail "no checkpoint in $ckpt"
python3 - "$metrics" <<'PY' || fail "the learning curve did not go up"
import json, sys
vals = [json.loads(l)["metrics"]["episode_return_mean"] for l in open(sys.argv[1])
        if '"corridor"' in l and "episode_return_mean" in l]
assert len(vals) >= 5, f"only {len(vals)} metrics lines"
print(f"episode_return_mean: first {vals[0]:.3f}, last {vals[-1]:.3f} ({len(vals)} reports)")
# A random walk seldom reaches the end of the 12-cell corridor within 48 steps
# (return about -0.4); the greedy path returns 0.89, epsilon-greedy about 0.85.
assert vals[-1] > vals[0] and vals[-1] >= 0.8, "no learning"
PY
echo "== a Python agent of the installed agentctl imports agentrt with no set-up"
mkdir -p "$tmp/py"
cat >"$tmp/py/agent.py" <<'PY'
import agentrt
with agentrt.Runtime() as rt:
    print("agentrt from", agentrt.__file__, "library", agentrt.library_path(), flush=True)
    rt.report(1, imported=1)
PY
cat >"$tmp/py/agents.yaml" <<'YAML'
run: {name: py-installed, dir: runs}
agents:
  - name: py
    command: [/usr/bin/python3, agent.py]
YAML
(cd "$tmp/py" && env -u PYTHONPATH -u AGENTRT_C_LIBRARY timeout 120 "$tmp/prefix/bin/agentctl" run agents.yaml --quiet \
  >"$tmp/py/run.log" 2>&1) || { cat "$tmp/py/run.log"; cat "$tmp"/py/runs/*/logs/py/rank0.log; fail "the Python agent failed"; }
pylog=$(cat "$tmp"/py/runs/py-installed-*/logs/py/rank0.log)
echo "$pylog"
grep -q "agentrt from $tmp/prefix/lib.*/agentrt/python/agentrt/__init__.py library $tmp/prefix/lib" <<<"$pylog" \
  || fail "the agent did not import the installed package and library"
test -f "$(ls -d "$tmp"/prefix/lib*/agentrt/python/agentrt | head -1)/bus.pyi" || fail "the type stubs are not installed"
echo "custom_env_test: PASS"
