#!/usr/bin/env bash
# The multi-node test cluster's stepped wall clock (tests/slurm/clock_offset_shim.cc):
# a process given the shim reads the host's wall clock moved by its node's offset,
# its steady clock unmoved; its waits until a wall-clock instant last as long as
# asked (clock_waits); telemetry's numbering survives a step back; and the bus
# (bus_grpc_test: a broker and its clients, restarts and reconnects, all in one
# process) works while that offset steps between -60 s and +60 s every 0.7 s.
# Before the shim moved the instants of Abseil's futex waits (gRPC's mutexes),
# a constant +90 s made three of its cases fail (each such wait lasted 90 s
# longer).
set -euo pipefail
: "${AGENTRT_CLOCK_SHIM:?the shim library (set by CTest)}"
: "${AGENTRT_BUS_GRPC_TEST:?bus_grpc_test (set by CTest)}"
: "${AGENTRT_CLOCK_WAITS:?clock_waits (set by CTest)}"
: "${AGENTRT_TELEMETRY_TEST:?comms_telemetry_test (set by CTest)}"
py=/usr/bin/python3
dir=$(mktemp -d /tmp/agentrt-clock.XXXXXX)
stepper=""
cleanup() {
  [ -n "$stepper" ] && kill "$stepper" 2>/dev/null
  rm -rf "$dir"
}
trap cleanup EXIT
clock=$dir/n1
fail() { echo "FAIL: $*" >&2; exit 1; }
tests=${AGENTRT_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}/tests
set_offset() { $py -c "import sys; sys.path.insert(0, sys.argv[1]); import agentrt_testing as t; t.set_clock_offset(sys.argv[2], float(sys.argv[3]))" "$tests" "$clock" "$1"; }
head -c 8 /dev/zero >"$clock"
shimmed() { AGENTRT_TESTCLUSTER_CLOCK_FILE=$clock LD_PRELOAD=$AGENTRT_CLOCK_SHIM "$@"; }
# wall and steady seconds, as one process reads them
clocks='import time; print(time.time(), time.monotonic())'

for offset in 3600 -3600 0; do
  set_offset "$offset"
  read -r host_wall host_steady < <($py -c "$clocks")
  read -r wall steady < <(shimmed $py -c "$clocks")
  date_s=$(shimmed date +%s)
  $py - "$offset" "$host_wall" "$host_steady" "$wall" "$steady" "$date_s" <<'PY' || exit 1
import sys
offset, host_wall, host_steady, wall, steady, date_s = map(float, sys.argv[1:])
moved = wall - host_wall
assert abs(moved - offset) < 2, "time.time() moved by %.1f s, not the node's %d s" % (moved, offset)
assert abs(date_s - host_wall - offset) < 2, "date +%%s moved by %.1f s, not %d s" % (date_s - host_wall, offset)
assert 0 <= steady - host_steady < 2, "the steady clock moved by %.1f s" % (steady - host_steady)
print("ok: offset %+d s: the wall clock reads %+.2f s from the host's, the steady clock %+.2f s"
      % (offset, moved, steady - host_steady))
PY
done
# Without the variable the shim leaves the clock alone.
set_offset 3600
read -r host_wall _ < <($py -c "$clocks")
read -r wall _ < <(LD_PRELOAD=$AGENTRT_CLOCK_SHIM $py -c "$clocks")
$py -c "import sys; assert abs(float(sys.argv[1]) - float(sys.argv[2])) < 2, 'moved without a clock file'" \
  "$wall" "$host_wall" || fail "the shim moved a clock it was given no file for"
echo "ok: without AGENTRT_TESTCLUSTER_CLOCK_FILE the wall clock is the host's"

# Waits until a wall-clock instant 200 ms ahead last 200 ms whatever the offset.
for offset in 3600 -3600; do
  set_offset "$offset"
  shimmed timeout 60 "$AGENTRT_CLOCK_WAITS" >"$dir/waits.log" 2>&1 \
    || { cat "$dir/waits.log" >&2; fail "a wait until a wall-clock instant was off at $offset s"; }
  echo "ok: offset $offset s: $(grep -c '^ok' "$dir/waits.log") waits until a wall-clock instant took 200 ms"
done

# Telemetry: a second sender of a rank in one process, made after the clock stepped back, is
# not refused as a replay of the first (the test steps the clock itself).
set_offset 0
shimmed timeout 60 "$AGENTRT_TELEMETRY_TEST" "[clock_step]" >"$dir/telemetry.log" 2>&1 \
  || { cat "$dir/telemetry.log" >&2; fail "comms_telemetry_test [clock_step] failed"; }
grep -q "All tests passed" "$dir/telemetry.log" || { cat "$dir/telemetry.log" >&2; fail "no [clock_step] test ran"; }
echo "ok: telemetry of a sender made after a 60 s step back is taken"

# The bus while the node's clock steps back and forth.
set_offset 0
$py - "$tests" "$clock" <<'PY' &
import sys, time
sys.path.insert(0, sys.argv[1])
import agentrt_testing
sign = 1
while True:  # killed by the test when bus_grpc_test is done
    agentrt_testing.set_clock_offset(sys.argv[2], sign * 60)
    sign = -sign
    time.sleep(0.7)
PY
stepper=$!
start=$(date +%s)
shimmed timeout 150 "$AGENTRT_BUS_GRPC_TEST" >"$dir/bus.log" 2>&1 \
  || { tail -n 40 "$dir/bus.log" >&2; fail "bus_grpc_test failed while the clock stepped by +-60 s"; }
echo "ok: bus_grpc_test passed while the clock stepped by +-60 s every 0.7 s ($(( $(date +%s) - start )) s)"
