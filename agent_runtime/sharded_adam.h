// agentrt::ShardedAdam — ZeRO-1 style AdamW over one flat parameter buffer.
//
// Every rank holds the full parameters and computes a full gradient. Step():
//   1. reduce-scatter the gradients (summed; averaged when options.average_grads),
//   2. clip by the global gradient norm (one small all-reduce of the shard norms²),
//   3. run AdamW on this rank's 1/N shard only (its m and v are 1/N of the whole),
//   4. all-gather the updated parameters into every rank's full buffer.
// With block = num_params / N (rounded down), shard r covers
// [shard_offset(), shard_offset() + shard_size()) = [r*block, (r+1)*block). When
// N does not divide num_params, the last tail_size() = num_params % N (< N)
// parameters ride along in step 2's all-reduce and every rank updates them
// identically, keeping their (tiny) state replicated: no padded copies.
//
// Buffers live where the group says (host for mpi/single, device for nccl).
// Errors of construction (out of memory) are returned by the first Step or
// LoadState. Not thread-safe; one instance per rank.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "agent_runtime/adamw.h"  // AdamWOptions
#include "agent_runtime/checkpointer.h"
#include "agent_runtime/group.h"
#include "common/status.h"

namespace agentrt {

class ShardedAdam {
 public:
  ShardedAdam(Group& group, size_t num_params, AdamWOptions options);
  ~ShardedAdam();
  ShardedAdam(const ShardedAdam&) = delete;
  ShardedAdam& operator=(const ShardedAdam&) = delete;

  // One optimizer step. `params` and `grads` both hold num_params floats; `grads`
  // is used as scratch and is unspecified afterwards. Returns the global
  // gradient norm before clipping through `grad_norm` when non-null.
  Status Step(float* params, float* grads, float* grad_norm = nullptr);

  size_t num_params() const;
  size_t shard_offset() const;
  size_t shard_size() const;
  // Parameters at the end (fewer than N) updated by every rank; see above.
  size_t tail_size() const;
  int64_t step_count() const;
  // Bytes of optimizer state this rank holds: m and v of its shard and the tail.
  size_t state_bytes() const;
  AdamWOptions& options();

  // Optimizer state of this rank (step count, m, v of its shard) as bytes for
  // the checkpoint, and back. LoadState refuses a state saved with another
  // world size, parameter count or rank. SaveState returns an empty vector
  // when the state cannot be read (device error, failed construction).
  std::vector<uint8_t> SaveState() const;
  Status LoadState(std::span<const uint8_t> state);

  // The optimizer state as slices of global arrays, which restore at any
  // world size: "<prefix>m" and "<prefix>v" (num_params float32 each; this
  // rank's shard, and the tail from the last rank only) and "<prefix>step"
  // (int64, rank 0). Device state is copied to the host when the save
  // snapshots it. The state must outlive the save's snapshot.
  void AddTo(CheckpointState& state, const std::string& prefix) const;
  // Loads this rank's part of a state saved by AddTo at any world size: its
  // shard and the tail, bitwise as saved. Refuses another parameter count.
  Status LoadFrom(const SavedStep& saved, const std::string& prefix);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace agentrt
