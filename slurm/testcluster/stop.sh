#!/usr/bin/env bash
# Stops the test cluster that start.sh started in STATE_DIR: cancels its jobs
# (so no slurmstepd is left behind), then ends exactly the daemons whose pids
# start.sh recorded in STATE_DIR/pids: TERM, a bounded wait, then KILL.
# Idempotent: nothing recorded or nothing alive is not an error.
#
#   slurm/testcluster/stop.sh STATE_DIR
set -uo pipefail
[ $# -eq 1 ] || { echo "usage: $0 STATE_DIR" >&2; exit 2; }
[ -d "$1" ] || { echo "testcluster: nothing to stop in $1 (no such directory)"; exit 0; }
state=$(cd "$1" && pwd -P)
pids=$state/pids
[ -f "$pids" ] || { echo "testcluster: nothing to stop in $state"; exit 0; }

# Jobs first, while slurmctld and slurmd are still up to end their steps.
if [ -f "$state/slurm.conf" ]; then
  export SLURM_CONF=$state/slurm.conf
  if timeout 5 scontrol ping 2>/dev/null | grep -q UP; then
    timeout 10 scancel --quiet --user="$(id -un)" >/dev/null 2>&1 || true
    for _ in $(seq 50); do
      [ -z "$(timeout 5 squeue -h -o %A 2>/dev/null)" ] && break
      sleep 0.2
    done
  fi
fi

# Daemons in reverse start order: slurmd, slurmctld, munged.
alive=()
while read -r name pid; do
  if kill -0 "$pid" 2>/dev/null; then
    kill -TERM "$pid" 2>/dev/null && alive+=("$name:$pid")
  fi
done < <(tac "$pids")
for _ in $(seq 100); do
  still=()
  for entry in "${alive[@]}"; do kill -0 "${entry#*:}" 2>/dev/null && still+=("$entry"); done
  [ ${#still[@]} -eq 0 ] && break
  alive=("${still[@]}")
  sleep 0.1
done
for entry in "${alive[@]}"; do
  if kill -0 "${entry#*:}" 2>/dev/null; then
    echo "testcluster: ${entry%%:*} (pid ${entry#*:}) ignored SIGTERM for 10 s; killing it" >&2
    kill -KILL "${entry#*:}" 2>/dev/null || true
  fi
done
rm -f "$pids"

# A multi-node cluster's network: what start.sh recorded, by name. Whatever still
# runs in a node's namespace goes with it (a job's leftovers); deleting the
# namespace removes its veth pair.
if [ -f "$state/net" ]; then
  while read -r kind name; do
    case $kind in
      netns)
        if ip netns list 2>/dev/null | grep -qw "^$name"; then
          for pid in $(ip netns pids "$name" 2>/dev/null); do kill -KILL "$pid" 2>/dev/null || true; done
          ip netns del "$name" 2>/dev/null || echo "testcluster: could not delete namespace $name" >&2
        fi ;;
      bridge)
        if ip link show "$name" >/dev/null 2>&1; then
          ip link del "$name" 2>/dev/null || echo "testcluster: could not delete bridge $name" >&2
        fi ;;
    esac
  done < <(tac "$state/net")
  rm -f "$state/net"
fi
echo "testcluster: stopped in $state"
