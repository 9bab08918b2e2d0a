#!/usr/bin/env bash
# bench_bus_cross_node: weight streams across two nodes of a multi-node test
# cluster (slurm/testcluster/start.sh: network namespaces on a bridge, veth
# links). bench_bus --cross-node runs in node n1's namespace: the broker and
# the publisher there, 4 subscribers in n2's namespace with
# AGENTRT_BUS_LOCAL_FILES=0 (every byte over the link, none read from the
# broker's files), until each holds a 256 MiB version; the anchor: ZeroMQ
# PUSH/PULL of the same bytes from n1 to 4 receivers on n2, same run.
# Needs root (network namespaces); says "skipped" and exits 0 otherwise.
# Prints one JSON line.   bench_bus_cross_node [--quick]
set -uo pipefail
MULTINODE_SKIP_CODE=${MULTINODE_SKIP_CODE:-0}
# shellcheck source=slurm/testcluster/multinode_lib.sh
source "${AGENTRT_SOURCE_DIR:?}/slurm/testcluster/multinode_lib.sh"
start_cluster 2 >/dev/null
addr() { ip -n "$1" -4 -o addr show dev eth0 | awk '{sub("/.*", "", $4); print $4}'; }
ns_a=art$tag-n1 # start.sh's names of the nodes' namespaces
ns_b=art$tag-n2
ip netns exec "$ns_a" "${AGENTRT_BENCH_BUS:?}" --cross-node "$ns_b" "$(addr "$ns_a")" "$(addr "$ns_b")" "$@"
