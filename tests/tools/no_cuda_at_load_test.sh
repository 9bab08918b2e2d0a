#!/usr/bin/env bash
# Nothing but a GPU agent needs CUDA: the programs and libagentrt_c.so list
# neither NCCL nor the CUDA runtime (nor the driver) among the libraries the
# dynamic linker loads at start, so they start on a node without CUDA. Only
# libagentrt_cuda.so (loaded when a device group is formed) needs them; where
# it was built it must, which shows the check can fail.
set -euo pipefail
bin=${AGENTRT_BIN_DIR:?}
lib=$bin/../lib
cuda_libs='lib(nccl|cudart|cuda)\.so'
failed=0
checked=0
for f in "$bin"/agentctl "$bin"/agent-worker "$bin"/agentrt-bus "$bin"/agentrt-exec-rank \
         "$bin"/agentrt-preflight "$lib"/libagentrt_c.so; do
  if [ ! -e "$f" ]; then
    echo "FAIL: $f was not built"
    failed=1
    continue
  fi
  needed=$(readelf -d "$f" | grep '(NEEDED)' | grep -oE "$cuda_libs[.0-9]*" || true)
  if [ -n "$needed" ]; then
    echo "FAIL: $(basename "$f") needs at load time: $(echo $needed)"
    failed=1
  fi
  checked=$((checked + 1))
done
if [ -e "$lib/libagentrt_cuda.so" ]; then
  gpu_needs=$(readelf -d "$lib/libagentrt_cuda.so" | grep '(NEEDED)' | grep -oE "$cuda_libs[.0-9]*" | sort -u)
  echo "libagentrt_cuda.so needs: $(echo $gpu_needs)"
  for want in libnccl.so.2 libcudart.so; do
    echo "$gpu_needs" | grep -q "^$want" || { echo "FAIL: libagentrt_cuda.so does not need $want"; failed=1; }
  done
fi
[ "$failed" -eq 0 ] || exit 1
echo "ok: $checked programs and libraries start without CUDA or NCCL"
