#!/usr/bin/env bash
# Starts a real SLURM on this one machine for tests: munged, slurmctld and
# slurmd from Debian's munge and slurm-wlm, everything (config, key, sockets,
# spool, state, logs, pid files) inside STATE_DIR, with fake GPUs.
#
#   slurm/testcluster/start.sh STATE_DIR [--nodes N] [--gpus G] [--cpus C] [--gpu-types T1,T2]
#                                        [--clock-shim LIB]
#   source STATE_DIR/env.sh        # SLURM_CONF for sinfo/srun/sbatch/...
#   slurm/testcluster/stop.sh STATE_DIR
#
# --nodes 1 (the default): one node named after this host, on 127.0.0.1.
# --nodes N > 1: nodes n1..nN, each a slurmd in its own network namespace with
# its own address on a private bridge that this script creates (and stop.sh
# removes, with the namespaces: only what STATE_DIR/net records, by name), its
# own hostname (a UTS namespace), and its own PMIx scratch directory and
# /run/lock, where agentrt leases ports (a private mount namespace; each
# bind-mounted over one shared path: see mpi.conf). munged and
# slurmctld run once, in this namespace, on the bridge's address. --gpus is per
# node. --gpu-types h100,b200 gives node I the type T((I-1) mod count): its gres
# is gpu:TYPE:G, as on a cluster with two kinds of GPU nodes.
#
# --clock-shim LIB (the build's tests/libagentrt_clock_offset.so): each node
# gets a wall clock of its own, which a test steps by writing the node's
# offset (a signed 64-bit count of nanoseconds, native byte order) into
# STATE_DIR/clock/NODE; all of a kernel's namespaces share one wall clock,
# so a TaskProlog gives every task of the node the shim (LD_PRELOAD) and its
# node's file (AGENTRT_TESTCLUSTER_CLOCK_FILE). SLURM's own daemons keep the
# host's clock.
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

usage() { echo "usage: $0 STATE_DIR [--nodes N] [--gpus G] [--cpus C] [--gpu-types T1,T2] [--clock-shim LIB]" >&2; exit 2; }
[ $# -ge 1 ] || usage
state_arg=$1; shift
gpus=${AGENTRT_TESTCLUSTER_GPUS:-8}
cpus=${AGENTRT_TESTCLUSTER_CPUS:-}
nodes=${AGENTRT_TESTCLUSTER_NODES:-1}
gpu_types=""
clock_shim=""
while [ $# -gt 0 ]; do
  case $1 in
    --gpus|--gpus-per-node) gpus=${2:?}; shift 2 ;;
    --cpus|--cpus-per-node) cpus=${2:?}; shift 2 ;;
    --nodes) nodes=${2:?}; shift 2 ;;
    --gpu-types) gpu_types=${2:?}; shift 2 ;;
    --clock-shim) clock_shim=${2:?}; shift 2 ;;
    *) usage ;;
  esac
done
[[ $gpus =~ ^[0-9]+$ ]] || { echo "testcluster: --gpus must be a number, got '$gpus'" >&2; exit 2; }
[[ $nodes =~ ^[1-9][0-9]?$ ]] || { echo "testcluster: --nodes must be 1 to 99, got '$nodes'" >&2; exit 2; }
[[ -z $gpu_types || $gpu_types =~ ^[a-z0-9]+(,[a-z0-9]+)*$ ]] \
  || { echo "testcluster: --gpu-types must be names like h100,b200, got '$gpu_types'" >&2; exit 2; }
IFS=, read -r -a type_list <<<"$gpu_types"
if [ -n "$clock_shim" ]; then
  [ -f "$clock_shim" ] || { echo "testcluster: --clock-shim: no such file '$clock_shim'" >&2; exit 2; }
  clock_shim=$(cd "$(dirname "$clock_shim")" && pwd -P)/$(basename "$clock_shim")
fi
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
tools=(munged slurmctld slurmd sinfo srun scontrol)
[ "$nodes" -gt 1 ] && tools+=(ip nsenter unshare)
for tool in "${tools[@]}"; do
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

# A free TCP port for a daemon: above the kernel's ephemeral range (where
# outgoing connections take their local ports; a port in use by one, though
# not listening, makes slurmctld's bind fail) when there is room, and in no
# socket of any state now.
free_port() {
  local p lo=20000 hi=60000 eph_hi
  eph_hi=$(awk '{print $2}' /proc/sys/net/ipv4/ip_local_port_range 2>/dev/null || echo 60999)
  if [ "$eph_hi" -lt 64000 ]; then lo=$((eph_hi + 1)) hi=65535; fi
  for _ in $(seq 200); do
    p=$(( lo + RANDOM % (hi - lo) ))
    if [ -z "$(ss -Htan "sport = :$p" 2>/dev/null)" ]; then echo "$p"; return 0; fi
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

# --- the network of a multi-node cluster: a bridge with an address here, one
# namespace per node with a veth on it. Everything made is named in $state/net
# (before it is made) so stop.sh removes exactly that.
net=$state/net
ctld_addr=127.0.0.1
node_names=("$host")
node_addrs=(127.0.0.1)
if [ "$nodes" -gt 1 ]; then
  tag=$(printf '%s' "$state" | md5sum | cut -c1-4)
  bridge=artb$tag
  k=$(( 0x$tag % 250 ))
  for _ in $(seq 250); do  # a /24 in 10.211.0.0/16 that no interface here uses
    prefix=10.211.$k
    ip -4 -o addr show | grep -q " $prefix\." || break
    k=$(( (k + 1) % 250 ))
  done
  ! ip link show "$bridge" >/dev/null 2>&1 || die "a link named $bridge exists already (another test cluster in $state?)"
  echo "bridge $bridge" >>"$net"
  ip link add "$bridge" type bridge || die "cannot create the bridge $bridge (needs CAP_NET_ADMIN)"
  ip addr add "$prefix.1/24" dev "$bridge" && ip link set "$bridge" up || die "cannot bring up $bridge"
  ctld_addr=$prefix.1
  node_names=()
  node_addrs=()
  for ((i = 1; i <= nodes; i++)); do
    ns=art$tag-n$i
    echo "netns $ns" >>"$net"
    ip netns add "$ns" || die "cannot create the network namespace $ns"
    ip link add "arth$tag$i" type veth peer name "artc$tag$i" || die "cannot create a veth pair for n$i"
    ip link set "artc$tag$i" netns "$ns" && ip link set "arth$tag$i" master "$bridge" up \
      && ip -n "$ns" link set "artc$tag$i" name eth0 \
      && ip -n "$ns" addr add "$prefix.$((10 + i))/24" dev eth0 \
      && ip -n "$ns" link set eth0 up && ip -n "$ns" link set lo up \
      && ip -n "$ns" route add default via "$prefix.1" || die "cannot wire n$i into $bridge"
    node_names+=("n$i")
    node_addrs+=("$prefix.$((10 + i))")
  done
fi
node_list=$(IFS=,; echo "${node_names[*]}")
type_of() { echo "${type_list[$(( $1 % ${#type_list[@]} ))]}"; }  # node index (0-based) -> GPU type
node_spool=$state/spool/slurmd
node_pidfile=$state/run/slurmd.pid
if [ "$nodes" -gt 1 ]; then
  node_spool=$state/spool/slurmd-%n
  node_pidfile=$state/run/slurmd-%n.pid
fi

cat >"$conf" <<CONF
# Written by slurm/testcluster/start.sh: a $nodes-node SLURM for agentrt's tests.
ClusterName=agentrt-test
SlurmctldHost=$host($ctld_addr)
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
# cred_expire also sets how long a requeued job waits before it may start again (default 120 s).
AuthInfo=socket=$socket,cred_expire=10
StateSaveLocation=$state/spool/ctld
SlurmdSpoolDir=$node_spool
SlurmctldPidFile=$state/run/slurmctld.pid
SlurmdPidFile=$node_pidfile
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
$([ -n "$clock_shim" ] && echo "TaskProlog=$state/task-prolog.sh")
ReturnToService=2
JobRequeue=1
KillWait=5
InactiveLimit=0
SlurmdTimeout=60
SlurmctldTimeout=60
$(for ((i = 0; i < ${#node_names[@]}; i++)); do
  gres=$gres_node
  [ "$gpus" -gt 0 ] && [ ${#type_list[@]} -gt 0 ] && gres="Gres=gpu:$(type_of "$i"):$gpus"
  echo "NodeName=${node_names[$i]} NodeAddr=${node_addrs[$i]} NodeHostname=${node_names[$i]} CPUs=$cpus Boards=1 SocketsPerBoard=1 CoresPerSocket=$cpus ThreadsPerCore=1 RealMemory=1000 $gres State=UNKNOWN"
done)
PartitionName=debug Nodes=$node_list Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
CONF
# --clock-shim: each node's wall-clock offset (0 to start), and the TaskProlog
# that gives every task of a node the shim and its node's file (its "export"
# lines set the task's environment).
if [ -n "$clock_shim" ]; then
  mkdir -p "$state/clock"
  for name in "${node_names[@]}"; do
    head -c 8 /dev/zero >"$state/clock/$name"
    chmod 0644 "$state/clock/$name"
  done
  cat >"$state/task-prolog.sh" <<PROLOG
#!/bin/sh
echo "export LD_PRELOAD=$clock_shim\${LD_PRELOAD:+:\$LD_PRELOAD}"
echo "export AGENTRT_TESTCLUSTER_CLOCK_FILE=$state/clock/\$SLURMD_NODENAME"
PROLOG
  chmod 0755 "$state/task-prolog.sh"
fi
# PMIx: every node's step daemons make their scratch directories under this one
# path, which each node bind-mounts over with its own (the nodes share /tmp).
mkdir -p "$state/pmix-tmp"
echo "PMIxCliTmpDirBase=$state/pmix-tmp" >"$state/mpi.conf"
: >"$state/plugstack.conf"
{
  echo "# Fake GPUs: character devices (1,3) made by start.sh."
  echo "AutoDetect=off"
  if [ "$gpus" -gt 0 ] && [ ${#type_list[@]} -gt 0 ]; then
    for ((i = 0; i < ${#node_names[@]}; i++)); do
      echo "NodeName=${node_names[$i]} Name=gpu Type=$(type_of "$i") File=$state/dev/fakegpu[0-$((gpus - 1))]"
    done
  elif [ "$gpus" -gt 0 ]; then
    echo "NodeName=$node_list Name=gpu File=$state/dev/fakegpu[0-$((gpus - 1))]"
  fi
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
if [ "$nodes" -eq 1 ]; then
  start_daemon slurmd "$state/log/slurmd-$host.log" slurmd -D -f "$conf" -N "$host"
else
  for ((i = 1; i <= nodes; i++)); do
    # Only the network namespace is entered (a new mount namespace from `ip netns
    # exec` would remount /sys); its own hostname, PMIx scratch directory and
    # /run/lock (where agentrt leases ports: each real node has its own).
    # The command is kept in $state/slurmd-n$i.sh: a test that killed the node
    # brings it back with it (multinode_lib.sh's revive_node).
    mkdir -p "$state/pmix/n$i" "$state/run-lock/n$i"
    cat >"$state/slurmd-n$i.sh" <<NODE
#!/bin/sh
exec nsenter --net=/run/netns/art$tag-n$i unshare --uts --mount --propagation private \\
  sh -c "hostname n$i && mount --bind '$state/pmix/n$i' '$state/pmix-tmp' && mount --bind '$state/run-lock/n$i' /run/lock && exec slurmd -D -f '$conf' -N n$i"
NODE
    chmod +x "$state/slurmd-n$i.sh"
    start_daemon "slurmd-n$i" "$state/log/slurmd-n$i.log" "$state/slurmd-n$i.sh"
  done
fi

# Bounded wait until every node is idle, then prove a step runs end to end on all.
for name in "${node_names[@]}"; do
  node_state=""
  for _ in $(seq 150); do
    node_state=$(timeout 5 sinfo -h -n "$name" -o %T 2>/dev/null || true)
    [ "$node_state" = idle ] && break
    sleep 0.2
  done
  [ "$node_state" = idle ] || { log_tail "$state/log/slurmd-$name.log"; log_tail "$state/log/slurmctld.log"; \
    die "node $name is '${node_state:-unknown}', not idle, after 30 s"; }
done
timeout 60 srun -N"$nodes" -n"$nodes" -t 1 true </dev/null \
  || { log_tail "$state/log/slurmd-${node_names[0]}.log"; die "'srun -N$nodes true' failed on the test cluster"; }

cat >"$state/env.sh" <<ENV
# Written by slurm/testcluster/start.sh; source it to use the test cluster.
export SLURM_CONF=$conf
export AGENTRT_TESTCLUSTER_DIR=$state
export AGENTRT_TESTCLUSTER_GPUS=$gpus
export AGENTRT_TESTCLUSTER_NODES=$nodes
ENV
echo "testcluster: up in $state: node(s) $node_list ($(IFS=,; echo "${node_addrs[*]}")), $cpus CPUs and $gpus fake GPUs each, slurmctld $ctld_addr:$ctld_port (source $state/env.sh)"
