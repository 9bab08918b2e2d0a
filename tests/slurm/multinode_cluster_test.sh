#!/usr/bin/env bash
# The multi-node test cluster (slurm/testcluster/start.sh --nodes 3): three real
# slurmd, each in its own network namespace on a private bridge, against its
# promises: every node idle with its own fake GPUs; a step across all three runs
# one task per node, each with its node's name, hostname and address; PMIx
# ranks span two nodes; a batch job's inner srun reaches both of its nodes; the
# stock PyTorch DDP example trains as one agent over two nodes through
# `agentctl run --backend slurm`; job-array tasks on two nodes reach the bus job
# by its node's address over TLS with the run's own CA, and a capture of the
# bridge meanwhile holds no token, secret or known payload; start.sh again is a no-op; stop.sh leaves no daemon,
# namespace or link behind.
# Its own cluster, beside the single-node one scripts/test.sh starts.
# Skips (77) where network namespaces cannot be made (not root, no CAP_NET_ADMIN).
set -uo pipefail
# shellcheck source=slurm/testcluster/multinode_lib.sh
source "${AGENTRT_SOURCE_DIR:?}/slurm/testcluster/multinode_lib.sh"
start_cluster 3 --gpus 2 --cpus 4 --gpu-types h100,b200

# 1. Three nodes, idle, two GPUs each: h100 on n1 and n3, b200 on n2.
for nt in n1:h100 n2:b200 n3:h100; do
  n=${nt%:*}
  line=$(timeout 20 scontrol show node "$n" -o) || fail "scontrol show node $n failed"
  grep -q "State=IDLE" <<<"$line" || fail "$n is not idle: $line"
  grep -q "Gres=gpu:${nt#*:}:2" <<<"$line" || fail "$n does not offer gpu:${nt#*:}:2: $line"
done

# 2. One task per node; each sees its own node name, hostname and address.
out=$(timeout 60 srun -N3 -n3 -t 1 bash -c \
  'echo "$SLURMD_NODENAME $(hostname) $(ip -4 -o addr show eth0 | awk "{print \$4}")"' | sort) \
  || fail "srun -N3 failed"
echo "$out"
[ "$(wc -l <<<"$out")" -eq 3 ] || fail "srun -N3 -n3 printed $(wc -l <<<"$out") lines, not 3"
while read -r name host addr; do
  [ "$name" = "$host" ] || fail "task on $name has hostname $host"
  want=$(node_addr "$name")
  [ "${addr%/*}" = "$want" ] || fail "task on $name runs on address $addr, the node's is $want"
done <<<"$out"
[ "$(cut -d' ' -f1 <<<"$out" | sort -u | tr '\n' ' ')" = "n1 n2 n3 " ] || fail "tasks did not land on n1, n2, n3"

# 3. GPUs are bound per node: one GPU per task on two nodes.
gpu_out=$(timeout 60 srun -N2 -n2 --gres=gpu:1 -t 1 bash -c 'echo "$SLURMD_NODENAME $CUDA_VISIBLE_DEVICES"' | sort) \
  || fail "srun --gres=gpu:1 on two nodes failed"
[ "$(wc -l <<<"$gpu_out")" -eq 2 ] && ! grep -qv ' [01]$' <<<"$gpu_out" \
  || fail "CUDA_VISIBLE_DEVICES per node: '$gpu_out'"

# 4. PMIx ranks across two nodes (each node's own PMIx scratch directory).
ranks=$(timeout 60 srun -N2 -n4 --mpi=pmix -t 1 bash -c 'echo "$PMIX_RANK $SLURMD_NODENAME"' | sort -n) \
  || fail "srun --mpi=pmix -N2 -n4 failed"
[ "$(cut -d' ' -f1 <<<"$ranks" | tr '\n' ' ')" = "0 1 2 3 " ] || fail "PMIx ranks: '$ranks'"
[ "$(cut -d' ' -f2 <<<"$ranks" | sort -u | wc -l)" -eq 2 ] || fail "PMIx ranks did not span two nodes: '$ranks'"

# 5. A batch job on two nodes: its script runs on the first, its srun reaches both.
job=$(timeout 20 sbatch --parsable -N2 -t 1 -o "$state/job.out" --wrap 'srun -N2 -n2 hostname') \
  || fail "sbatch -N2 failed"
wait_job_gone "$job"
[ "$(sort "$state/job.out" | tr '\n' ' ')" = "n1 n2 " ] || fail "the batch job's srun printed '$(cat "$state/job.out")'"

# 6. The stock PyTorch DDP example (gloo) as one agent over two nodes, unchanged:
# `agentctl run --backend slurm` plans it on two whole nodes, gives every rank
# MASTER_ADDR = the first node's address and the interface toward it.
if /usr/bin/python3 -c "import torch" >/dev/null 2>&1; then
  mkdir -p "$state/ddp"
  cat >"$state/ddp/agents.yaml" <<YAML
run: {name: ddp2, dir: $state/ddp/runs}
agents:
  - name: ddp
    gpus: 4     # two whole nodes of two GPUs: two ranks on each
    ranks: 4
    command: [/usr/bin/python3, $src/examples/pytorch_ddp/train.py, --epochs, "3"]
    env: {PYTHONUNBUFFERED: "1", OMP_NUM_THREADS: "1"}
YAML
  (cd "$state/ddp" && timeout 180 "${AGENTRT_BIN_DIR:?}/agentctl" run agents.yaml --backend slurm --quiet \
    >"$state/ddp/run.log" 2>&1) || { cat "$state/ddp/run.log"; cat "$state"/ddp/runs/*/logs/ddp/*.log; \
    fail "the DDP agent over two nodes failed"; }
  run_dir=$(ls -d "$state"/ddp/runs/ddp2-* | head -1)
  summary=$(grep -h '^{"world_size"' "$run_dir"/logs/ddp/rank0.log)
  echo "DDP over two nodes: $summary"
  /usr/bin/python3 - "$summary" "$run_dir/logs/ddp" <<'PY' || fail "the DDP agent did not train across two nodes"
import json, sys
s = json.loads(sys.argv[1])
assert s["world_size"] == 4 and s["backend"] == "gloo", s
assert s["final_loss"] < 0.5 * s["first_loss"] and s["max_weight_diff"] == 0.0, s
nodes = [json.load(open("%s/rank%d.exit" % (sys.argv[2], r)))["node"] for r in range(4)]
assert nodes == ["n1", "n1", "n2", "n2"], "ranks 0-3 ran on %s" % nodes
PY
else
  echo "multinode_cluster_test: the DDP part skipped: /usr/bin/python3 has no torch"
fi
# What each rank of a 2-node agent is given: MASTER_ADDR is n1's address (not
# localhost), and NCCL/gloo are pointed at the interface toward it.
mkdir -p "$state/envs"
cat >"$state/envs/agents.yaml" <<YAML
run: {name: envs, dir: $state/envs/runs}
agents:
  - name: wide
    gpus: 4
    ranks: 4
    command: [/bin/sh, -c, 'echo "RANKENV \$RANK \$SLURMD_NODENAME \$MASTER_ADDR \$GLOO_SOCKET_IFNAME \$NCCL_SOCKET_IFNAME"']
YAML
(cd "$state/envs" && timeout 120 "${AGENTRT_BIN_DIR:?}/agentctl" run agents.yaml --backend slurm --quiet \
  >"$state/envs/run.log" 2>&1) || { cat "$state/envs/run.log"; fail "the 2-node env agent failed"; }
n1_addr=$(node_addr n1)
seen=$(cat "$state"/envs/runs/envs-*/logs/wide/rank*.log | grep '^RANKENV' | sort)
echo "$seen"
want=$(printf 'RANKENV 0 n1 %s eth0 =eth0\nRANKENV 1 n1 %s eth0 =eth0\nRANKENV 2 n2 %s eth0 =eth0\nRANKENV 3 n2 %s eth0 =eth0' \
  "$n1_addr" "$n1_addr" "$n1_addr" "$n1_addr")
[ "$seen" = "$want" ] || fail "rank environments over two nodes: got
$seen
want
$want"

# gpu_type: an agent asking for b200 runs on n2, the only b200 node, through a
# typed GRES request; a type no node has is refused at plan time, naming the agent
# and the types present.
mkdir -p "$state/typed"
cat >"$state/typed/agents.yaml" <<YAML
run: {name: typed, dir: $state/typed/runs}
agents:
  - name: fast
    gpus: 1
    gpu_type: b200
    command: [/bin/sh, -c, 'echo "TYPED \$SLURMD_NODENAME \$CUDA_VISIBLE_DEVICES"']
YAML
(cd "$state/typed" && timeout 120 "${AGENTRT_BIN_DIR:?}/agentctl" run agents.yaml --backend slurm --quiet \
  >"$state/typed/run.log" 2>&1) || { cat "$state/typed/run.log"; fail "the b200 agent failed"; }
typed=$(grep -h '^TYPED' "$state"/typed/runs/typed-*/logs/fast/rank0.log)
[ "${typed% *}" = "TYPED n2" ] || fail "the b200 agent ran as '$typed', not on n2"
grep -q -- "^#SBATCH --gres=gpu:b200:1$" "$state"/typed/runs/typed-*/alloc.sbatch \
  || fail "the allocation did not ask for the typed GRES gpu:b200:1"
sed -i 's/gpu_type: b200/gpu_type: a100/' "$state/typed/agents.yaml"
refused=$(cd "$state/typed" && "${AGENTRT_BIN_DIR:?}/agentctl" plan agents.yaml --scontrol - 2>&1)
rc=$?
[ $rc -eq 2 ] && grep -q "fast asks for gpu_type 'a100'" <<<"$refused" && grep -q "b200 (1 node)" <<<"$refused" \
  && grep -q "h100 (2 nodes)" <<<"$refused" || fail "an impossible gpu_type: rc $rc, '$refused'"
echo "gpu_type: b200 ran on n2; a100 refused: $refused"

# Job arrays across nodes: each agent needs a whole node (2 GPUs), so its
# array task runs on a node of its own; both reach the bus job, which
# advertises its node's NodeAddr (node names do not resolve here), and each
# trains against the other's policy snapshots.
mkdir -p "$state/arrays"
cat >"$state/arrays/agents.yaml" <<YAML
run: {name: arrays, dir: $state/arrays/runs}
bus: {mtls: true}  # tls is auto (on: the bus job is on another node); agents show certificates too
slurm: {time: "00:05:00"}
agents:
  - {name: predator, gpus: 2, backend: mpi, command: [${AGENTRT_BIN_DIR:?}/agent-worker],
     args: {env: pursuit, role: predator, algo: ppo, steps: 20000, num_envs: 8, rollout_steps: 64,
            snapshot_every: 1, eval_episodes: 30}}
  - {name: prey, gpus: 2, backend: mpi, command: [${AGENTRT_BIN_DIR:?}/agent-worker],
     args: {env: pursuit, role: prey, algo: ppo, steps: 20000, num_envs: 8, rollout_steps: 64,
            snapshot_every: 1}}
channels:
  - {topic: "weights/{agent}", publishers: ["*"], subscribers: ["*"]}
  - {topic: results, publishers: ["*"], subscribers: ["*"]}
YAML
arun=$state/arrays/run
# On the wire: the bridge between the nodes is captured while the agents trade
# policies. The bus crosses nodes, so bus.tls (auto) is on with the run's own CA,
# and with bus.mtls each agent shows the certificate the CA signed for it.
capture=$state/arrays/wire.pcap
tcpdump_pid=""
if command -v tcpdump >/dev/null 2>&1; then
  tcpdump -i "artb$tag" -w "$capture" -U -Z root -s 0 -n tcp >"$state/arrays/tcpdump.log" 2>&1 &
  tcpdump_pid=$!
  for _ in $(seq 100); do grep -q "listening on" "$state/arrays/tcpdump.log" && break; sleep 0.1; done
  grep -q "listening on" "$state/arrays/tcpdump.log" || fail "tcpdump did not start: $(cat "$state/arrays/tcpdump.log")"
else
  echo "multinode_cluster_test: the wire capture skipped: no tcpdump"
fi
(cd "$state/arrays" && timeout 60 "${AGENTRT_BIN_DIR:?}/agentctl" sbatch agents.yaml -o "$arun" --submit \
  >"$state/arrays/submit.log" 2>&1) || { cat "$state/arrays/submit.log"; fail "agentctl sbatch --submit failed"; }
for j in $(cat "$arun/arrays.jobids"); do wait_job_gone "$j"; done
grep -q '"tls": *"on"' "$arun/plan.json" && grep -q '"run_ca": *true' "$arun/plan.json" \
  || fail "the array run's bus is not TLS with the run's CA: $(grep -o '"tls"[^,]*' "$arun/plan.json")"
grep -q 'agentrt-bus: serving on .*, mutual TLS)' "$arun"/logs/arrays-bus-*.out \
  || fail "the bus job did not serve mutual TLS: $(grep -h 'serving on' "$arun"/logs/arrays-bus-*.out)"
if [ -n "$tcpdump_pid" ]; then
  kill -INT "$tcpdump_pid"; wait "$tcpdump_pid" 2>/dev/null
  bus_port=$(cut -d: -f2 "$arun/bus.address" 2>/dev/null || grep -ho 'serving on [^ ]*' "$arun"/logs/arrays-bus-*.out | cut -d: -f2)
  bus_packets=$(tcpdump -r "$capture" -n "tcp port $bus_port" 2>/dev/null | wc -l)
  [ "$bus_packets" -gt 20 ] || fail "the capture holds $bus_packets packets of the bus (port $bus_port): it saw no traffic"
  /usr/bin/python3 - "$capture" "$arun/secrets" <<'PY' || fail "the wire between the nodes carries readable secrets or payload"
import glob, json, os, sys
wire = open(sys.argv[1], "rb").read()
secrets = sys.argv[2]
needles = {"run secret": open(os.path.join(secrets, "run.secret"), "rb").read()}
for path in glob.glob(os.path.join(secrets, "*.token")):
    needles["token of " + os.path.basename(path)] = json.load(open(path))["token"].encode()
for known in (b"weights/predator", b"weights/prey", b"policy_params", b"obs_size", b"evaluation",
              b"application/json", b"authorization", b"x-agentrt"):
    needles["payload or header bytes " + known.decode()] = known
found = [name for name, b in needles.items() if b and b in wire]
assert not found, "found on the wire: %s" % found
print("wire capture: %d bytes, none of %d secrets, tokens and known payloads" % (len(wire), len(needles)))
PY
fi
bus_addr=$(grep -ho 'agentrt-bus: serving on [^ ]*' "$arun"/logs/arrays-bus-*.out | awk '{print $4}')
[[ "$bus_addr" =~ ^10\.211\.[0-9]+\.[0-9]+:[0-9]+$ ]] || fail "the bus job advertised '$bus_addr', not its node's address"
pred_log=$(grep -h "^agent-worker predator" "$arun"/logs/arrays-gpu2-*.out)
prey_log=$(grep -h "^agent-worker prey" "$arun"/logs/arrays-gpu2-*.out)
grep -q "against prey prey@update" <<<"$pred_log" \
  || { tail -n 20 "$arun"/logs/*.out; fail "the predator's array task did not receive the prey's policy over the bus"; }
grep -q "subscribed to the policies of" <<<"$prey_log" || fail "the prey's array task did not reach the bus"
nodes=$(for j in $(cat "$arun/arrays.jobids"); do timeout 10 scontrol show job "$j" -o; done \
  | grep -o ' NodeList=[^ ]*' | cut -d= -f2 | sort -u | tr '\n' ' ')
[ "$(wc -w <<<"$nodes")" -eq 2 ] || fail "the two array tasks did not run on two nodes: '$nodes'"
echo "job arrays over nodes $nodes, bus at $bus_addr: $(grep -o 'against prey prey@update[0-9]*' <<<"$pred_log")"

# Preflight on the cluster: `agentctl check --backend slurm` runs every agent's
# checks as job steps on its own nodes; the 2-node MPI agent's sweep crosses the
# network between n1 and n2.
mkdir -p "$state/check"
cat >"$state/check/agents.yaml" <<YAML
run: {name: chk, dir: $state/check/runs}
slurm: {time: "00:05:00"}
preflight: {max_bytes: 1048576, checkpoint_probe_bytes: 1048576}
agents:
  - {name: wide, gpus: 4, ranks: 4, backend: mpi, command: [agent-worker], args: {env: cartpole}}
  - {name: solo, gpus: 1, backend: single, command: [agent-worker], args: {env: cartpole}}
YAML
(cd "$state/check" && timeout 120 "${AGENTRT_BIN_DIR:?}/agentctl" check agents.yaml --backend slurm --json \
  >"$state/check/report.json" 2>"$state/check/err.log") || { cat "$state/check/report.json" "$state/check/err.log"; \
  fail "agentctl check --backend slurm failed"; }
/usr/bin/python3 - "$state/check/report.json" <<'PY' || fail "the preflight report over two nodes is not what the plan gives"
import json, sys
rows = {r["agent"]: r for r in json.load(open(sys.argv[1]))["agents"]}
wide, solo = rows["wide"], rows["solo"]
assert len(wide["nodes"].split(",")) == 2 and wide["link"] == "network" and wide["ranks"] == 4, wide
assert {p["op"] for p in wide["sweep"]} == {"all_reduce", "reduce_scatter", "all_gather"}, wide["sweep"]
assert wide["largest_busbw_gbps"] > 0 and wide["bus"]["ok"] and not wide["errors"], wide
assert solo["verdict"] == "ok" and solo["nodes"] not in wide["nodes"].split(","), solo
print("check over nodes %s: busbw %.3f GB/s, skew %.2f ms" % (wide["nodes"], wide["largest_busbw_gbps"], wide["clock_skew_ms"]))
PY

# 7. start.sh again changes nothing.
again=$("$src/slurm/testcluster/start.sh" "$state" --nodes 3 2>&1) || fail "start.sh again failed: $again"
grep -q "already running" <<<"$again" || fail "start.sh again did not notice the running cluster: $again"

# 8. stop.sh removes exactly what start.sh made.
"$src/slurm/testcluster/stop.sh" "$state" || fail "stop.sh failed"
left=$(ip netns list | grep -c "^art$tag-" || true)
[ "$left" -eq 0 ] || fail "$left network namespace(s) of the cluster left: $(ip netns list)"
ip link show "artb$tag" >/dev/null 2>&1 && fail "the bridge artb$tag is still there"
for f in "$state"/run/*.pid; do
  [ -f "$f" ] && kill -0 "$(cat "$f")" 2>/dev/null && fail "a daemon of $f still runs"
done
echo "multinode_cluster_test: PASS"
