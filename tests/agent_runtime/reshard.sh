#!/bin/sh
# reshard.sh MPIEXEC TEST FROM TO DIR: runs TEST under FROM ranks to save a
# checkpoint into DIR, then under TO ranks to resume it (re-sharded).
set -eu
mpiexec=$1 test=$2 from=$3 to=$4 dir=$5
rm -rf "$dir"
export AGENTRT_TEST_DIR="$dir" OMPI_MCA_btl_vader_single_copy_mechanism=none
AGENTRT_TEST_PHASE=save "$mpiexec" --oversubscribe --allow-run-as-root -np "$from" "$test"
AGENTRT_TEST_PHASE=resume "$mpiexec" --oversubscribe --allow-run-as-root -np "$to" "$test"
rm -rf "$dir"
