#!/usr/bin/env bash
# Starts a real single-host SLURM for tests: munged, slurmctld and slurmd from
# Debian's munge and slurm-wlm, everything (config, key, sockets, spool, state,
# logs, pid files) inside STATE_DIR, with N fake GPUs.
#
#   slurm/testcluster/start.sh STATE_DIR [--gpus N] [--cpus N]
#   source STATE_DIR/env.sh        # SLURM_CONF for sinfo/srun/sbatch/...
#   slurm/testcluster/stop.sh STATE_DIR
#
# The fake GPUs are character devices (major 1, minor 3: the same device as
# /dev/null) named in gres.conf, so SLURM's GRES accounting and its
# CUDA_VISIBLE_DEVICES binding are the real ones; nothing reads the devices.
# The node declares --cpus CPUs (default: 16, or nproc if larger) whatever the
# machine has (SlurmdParameters=config_overrides), so several small jobs can
# run side by side on a 2-core test machine.
#
# Idempotent: when the daemons recorded in STATE_DIR still run and answer, it
# says so and exits 0. Exits non-zero with the daemon's log tail when
# something does not start. Needs root (slurmd runs jobs as their user).
set -euo pipefail

usage() { echo "usage: $0 STATE_DIR [--gpus N] [--cpus N]" >&2; exit 2; }
[ $# -ge 1 ] || usage
state_arg=$1; shift
gpus=${AGENTRT_TESTCLUSTER_GPUS:-8}
cpus=${AGENTRT_TESTCLUSTER_CPUS:-}
while [ $# -gt 0 ]; do
  case $1 in
    --gpus) gpus=${2:?}; shift 2 ;;
    --cpus) cpus=${2:?}; shift 2 ;;
    *) usage ;;
  esac
done
[[ $gpus =~ ^[0-9]+$ ]] || { echo "testcluster: --gpus must be a number, got '$gpus'" >&2; exit 2; }
if [ -z "$cpus" ]; then cpus=$(( $(nproc) > 16 ? $(nproc) : 16 )); fi
[[ $cpus =~ ^[1-9][0-9]*$ ]] || { echo "testcluster: --cpus must be a positive number, got '$cpus'" >&2; exit 2; }

here=$(cd "$(dirname "$0")" && pwd)
started=0
# Fails with a message; what this run had started already is stopped again.
die() {
  echo "testcluster: $*" >&2
  if [ "$started" = 1 ]; then "$here/stop.sh" "$state" >/dev/null 2>&1 || true; fi
  exit 1
}
[ "$(id -u)" -eq 0 ] || die "must run as root (slurmd starts job steps as their user)"
for tool in munged slurmctld slurmd sinfo srun scontrol; do
  command -v "$tool" >/dev/null || die "'$tool' not found; install the Debian packages slurm-wlm and munge (scripts/setup.sh)"
done

mkdir -p "$state_arg"
state=$(cd "$state_arg" && pwd -P)  # daemons need absolute paths (a relative -f hangs slurmstepd)
conf=$state/slurm.conf
pids=$state/pids

# Prints the tail of a daemon log, for the error message.
log_tail() {
  if [ -f "$1" ]; then { echo "---- last lines of $1:"; tail -n 25 "$1"; } >&2; fi
}

# True when every pid recorded by an earlier start.sh is alive and SLURM answers.
already_running() {
  [ -f "$pids" ] || return 1
  local name pid
  while read -r name pid; do
    kill -0 "$pid" 2>/dev/null || return 1
  done <"$pids"
  SLURM_CONF=$conf timeout 10 sinfo -h -o %T >/dev/null 2>&1
}
if already_running; then
  echo "testcluster: already running in $state (source $state/env.sh)"
  exit 0
fi
# Something half-started earlier: end what it recorded before starting afresh.
if [ -f "$pids" ]; then
  "$here/stop.sh" "$state" >/dev/null 2>&1 || true
fi

mkdir -p "$state"/{munge,spool/slurmd,spool/ctld,log,run,dev}
chmod 0700 "$state/munge"
: >"$pids"
started=1
record() { echo "$1 $2" >>"$pids"; }

# A free TCP port in [20000, 60000): not listening now.
free_port() {
  local p
  for _ in $(seq 200); do
    p=$(( 20000 + RANDOM % 40000 ))
    if [ -z "$(ss -Htln "sport = :$p" 2>/dev/null)" ]; then echo "$p"; return 0; fi
  done
  die "no free TCP port found for the SLURM daemons"
}

# --- munge: its own key and socket, so no /run/munge or /etc/munge is touched.
key=$state/munge/munge.key
if [ ! -s "$key" ]; then
  dd if=/dev/urandom of="$key" bs=1 count=1024 status=none
  chmod 0400 "$key"
fi
socket=$state/munge/munge.socket
rm -f "$state/munge/munged.pid"
munged --force --socket="$socket" --key-file="$key" --pid-file="$state/munge/munged.pid" \
  --log-file="$state/log/munged.log" --seed-file="$state/munge/munged.seed" </dev/null >/dev/null 2>&1 \
  || { log_tail "$state/log/munged.log"; die "munged did not start"; }
for _ in $(seq 50); do [ -s "$state/munge/munged.pid" ] && [ -S "$socket" ] && break; sleep 0.1; done
[ -S "$socket" ] || { log_tail "$state/log/munged.log"; die "munged did not create its socket $socket"; }
record munged "$(cat "$state/munge/munged.pid")"

# --- fake GPUs
rm -f "$state"/dev/fakegpu*
for ((i = 0; i < gpus; i++)); do
  mknod "$state/dev/fakegpu$i" c 1 3 || die "mknod $state/dev/fakegpu$i failed (needs CAP_MKNOD)"
done

host=$(hostname -s)
ctld_port=$(free_port)
slurmd_port=$(free_port)
[ "$ctld_port" != "$slurmd_port" ] || slurmd_port=$((ctld_port + 1))
gres_node=""
[ "$gpus" -gt 0 ] && gres_node="Gres=gpu:$gpus"

cat >"$conf" <<CONF
# Written by slurm/testcluster/start.sh: a one-node SLURM for agentrt's tests.
ClusterName=agentrt-test
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
# cred_expire also sets how long a requeued job waits before it may start again (default 120 s).
AuthInfo=socket=$socket,cred_expire=10
StateSaveLocation=$state/spool/ctld
SlurmdSpoolDir=$state/spool/slurmd
SlurmctldPidFile=$state/run/slurmctld.pid
SlurmdPidFile=$state/run/slurmd.pid
SlurmctldLogFile=$state/log/slurmctld.log
SlurmdLogFile=$state/log/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
PlugStackConfig=$state/plugstack.conf
# No systemd, no cgroup delegation here: track processes by /proc, bind nothing.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
# No slurmdbd: sacct has no data. Finished jobs stay visible to
# 'scontrol show job' for MinJobAge seconds; completions are logged as text.
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/filetxt
JobCompLoc=$state/log/jobcomp.log
MinJobAge=600
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=1,bf_interval=1
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
GresTypes=gpu
SlurmdParameters=config_overrides
MpiDefault=none
ReturnToService=2
JobRequeue=1
KillWait=5
InactiveLimit=0
SlurmdTimeout=60
SlurmctldTimeout=60
NodeName=$host NodeAddr=127.0.0.1 CPUs=$cpus Boards=1 SocketsPerBoard=1 CoresPerSocket=$cpus ThreadsPerCore=1 RealMemory=1000 $gres_node State=UNKNOWN
PartitionName=debug Nodes=$host Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
CONF
: >"$state/plugstack.conf"
{
  echo "# Fake GPUs: character devices (1,3) made by start.sh."
  echo "AutoDetect=off"
  [ "$gpus" -gt 0 ] && echo "NodeName=$host Name=gpu File=$state/dev/fakegpu[0-$((gpus - 1))]"
} >"$state/gres.conf"
cat >"$state/cgroup.conf" <<CONF
# Unused (proctrack/linuxproc, task/none); present so no daemon looks in /etc/slurm.
CgroupAutomount=no
CONF

# --- slurmctld and slurmd in the foreground of their own sessions, so the pids
# we record are the daemons themselves.
start_daemon() {  # name log command...
  local name=$1 log=$2; shift 2
  setsid "$@" </dev/null >>"$state/log/$name.out" 2>&1 &
  local pid=$!
  record "$name" "$pid"
  sleep 0.5
  kill -0 "$pid" 2>/dev/null || { log_tail "$log"; log_tail "$state/log/$name.out"; die "$name exited at start"; }
}
start_daemon slurmctld "$state/log/slurmctld.log" slurmctld -D -c -i -f "$conf"
export SLURM_CONF=$conf
for _ in $(seq 100); do timeout 5 scontrol ping 2>/dev/null | grep -q UP && break; sleep 0.2; done
timeout 5 scontrol ping 2>/dev/null | grep -q UP \
  || { log_tail "$state/log/slurmctld.log"; die "slurmctld does not answer on port $ctld_port"; }
start_daemon slurmd "$state/log/slurmd-$host.log" slurmd -D -f "$conf" -N "$host"

# Bounded wait until the node is idle, then prove a step runs end to end.
node_state=""
for _ in $(seq 150); do
  node_state=$(timeout 5 sinfo -h -n "$host" -o %T 2>/dev/null || true)
  [ "$node_state" = idle ] && break
  sleep 0.2
done
[ "$node_state" = idle ] || { log_tail "$state/log/slurmd-$host.log"; log_tail "$state/log/slurmctld.log"; \
  die "node $host is '${node_state:-unknown}', not idle, after 30 s"; }
timeout 60 srun -N1 -n1 -t 1 true </dev/null \
  || { log_tail "$state/log/slurmd-$host.log"; die "'srun -N1 true' failed on the test cluster"; }

cat >"$state/env.sh" <<ENV
# Written by slurm/testcluster/start.sh; source it to use the test cluster.
export SLURM_CONF=$conf
export AGENTRT_TESTCLUSTER_DIR=$state
export AGENTRT_TESTCLUSTER_GPUS=$gpus
ENV
echo "testcluster: up in $state: node $host, $cpus CPUs, $gpus fake GPUs, slurmctld port $ctld_port (source $state/env.sh)"
