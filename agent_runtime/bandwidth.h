// Collective bandwidth as NVIDIA's nccl-tests report it, so agentrt's figures
// compare one-to-one with `all_reduce_perf` and friends:
//   algbw = bytes / time, bytes = the size of the whole buffer (S);
//   busbw = algbw * factor: all-reduce 2(n-1)/n, reduce-scatter and
//   all-gather (n-1)/n, broadcast and reduce 1: the bandwidth each link
//   must carry, comparable with the link's peak whatever n is.
// Used by agentrt-preflight (`agentctl check`) and bench/collectives.
#pragma once

#include "agent_runtime/group.h"

namespace agentrt {

// bytes / seconds, in GB/s (1e9 bytes per second).
inline double AlgBandwidthGBps(double bytes, double seconds) {
  return seconds > 0 ? bytes / seconds / 1e9 : 0.0;
}

// nccl-tests' bus-bandwidth factor of `op` over `ranks` ranks.
inline double BusBandwidthFactor(CollectiveOp op, int ranks) {
  if (ranks <= 1) return 0.0;
  const double n = ranks;
  switch (op) {
    case CollectiveOp::kAllReduce:
      return 2.0 * (n - 1) / n;
    case CollectiveOp::kReduceScatter:
    case CollectiveOp::kAllGather:
      return (n - 1) / n;
    case CollectiveOp::kBroadcast:
      return 1.0;
    case CollectiveOp::kBarrier:
      return 0.0;
  }
  return 0.0;
}

}  // namespace agentrt
