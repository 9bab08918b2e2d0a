#include "agent_runtime/sharded_adam.h"

#include <cmath>
#include <cstring>
#include <functional>
#include <new>
#include <string>
#include <utility>
#include <vector>

#include "agent_runtime/sharded_adam_ops.h"

namespace agentrt {
namespace internal {
namespace {

class HostShardOps final : public ShardOps {
 public:
  Result<float*> Alloc(size_t n) override {
    if (n == 0) return static_cast<float*>(nullptr);
    auto* p = new (std::nothrow) float[n]();
    if (p == nullptr) {
      return ResourceExhausted("ShardedAdam: cannot allocate " + std::to_string(n * sizeof(float)) +
                               " bytes of host memory");
    }
    return p;
  }
  void Free(float* p) override { delete[] p; }
  Status Copy(float* dst, const float* src, size_t n) override {
    if (n > 0 && dst != src) std::memmove(dst, src, n * sizeof(float));
    return Status::Ok();
  }
  Status ToHost(void* dst, const float* src, size_t n) override {
    return Copy(static_cast<float*>(dst), src, n);
  }
  Status FromHost(float* dst, const void* src, size_t n) override {
    return Copy(dst, static_cast<const float*>(src), n);
  }
  Result<double> SquaredNorm(const float* x, size_t n) override {
    return agentrt::SquaredNorm(x, n);
  }
  Status Update(float* params, const float* grads, float* m, float* v, size_t n,
                const AdamWScalars& s) override {
    AdamWUpdate(params, grads, m, v, n, s);
    return Status::Ok();
  }
};

}  // namespace

std::unique_ptr<ShardOps> MakeHostShardOps() { return std::make_unique<HostShardOps>(); }

}  // namespace internal

namespace {

constexpr char kStateMagic[8] = {'A', 'G', 'S', 'A', 'D', 'A', 'M', '1'};

// The fixed-size head of a saved state; m and v of the shard follow it.
struct StateHeader {
  char magic[8];
  uint32_t version;
  int32_t world_size;
  int32_t rank;
  int32_t reserved;
  uint64_t num_params;
  uint64_t shard_offset;
  uint64_t shard_size;
  int64_t step;
};

}  // namespace

// Layout: with block = num_params / N (rounded down), rank r owns the shard
// [r*block, (r+1)*block); the last num_params % N parameters (fewer than N)
// form a tail that every rank updates identically from all-reduced gradients.
// So no rank ever needs a padded copy of the gradients or parameters.
struct ShardedAdam::Impl {
  Group& group;
  AdamWOptions options;
  std::unique_ptr<internal::ShardOps> ops;
  size_t num_params = 0;
  size_t block = 0;   // shard length: num_params / N
  size_t offset = 0;  // this rank's first parameter: rank * block
  size_t tail = 0;    // num_params % N, at [N*block, num_params), on every rank
  int64_t step = 0;
  float* m = nullptr;           // block + tail elements: the shard's, then the tail's
  float* v = nullptr;           // block + tail elements
  float* shard_grad = nullptr;  // block elements: this rank's reduced gradients
  float* reduced = nullptr;     // tail + 1 elements: the tail's gradients, then the squared norm
  Status init_status;

  Impl(Group& g, size_t n, AdamWOptions o) : group(g), options(o), num_params(n) {}
  ~Impl() {
    for (float* p : {m, v, shard_grad, reduced}) {
      if (p != nullptr) ops->Free(p);
    }
  }

  size_t state_len() const { return block + tail; }

  std::string Where() const {
    return "ShardedAdam (rank " + std::to_string(group.rank()) + " of " +
           std::to_string(group.size()) + ", " + std::string(group.backend()) + ")";
  }

  Status Init() {
    if (group.device_buffers()) {
      const Group::DeviceBinding binding = group.device_binding();
      if (binding.api == nullptr) {
        return FailedPrecondition(Where() + ": the group uses device buffers but names no device");
      }
      AGENTRT_ASSIGN_OR_RETURN(ops, internal::MakeDeviceShardOps(binding.api, binding.device));
    } else {
      ops = internal::MakeHostShardOps();
    }
    const size_t world = static_cast<size_t>(group.size());
    block = num_params / world;
    tail = num_params - block * world;
    offset = static_cast<size_t>(group.rank()) * block;
    AGENTRT_ASSIGN_OR_RETURN(m, ops->Alloc(state_len()));
    AGENTRT_ASSIGN_OR_RETURN(v, ops->Alloc(state_len()));
    AGENTRT_ASSIGN_OR_RETURN(shard_grad, ops->Alloc(block));
    AGENTRT_ASSIGN_OR_RETURN(reduced, ops->Alloc(tail + 1));
    return Status::Ok();
  }

  Status Step(float* params, float* grads, float* grad_norm) {
    if (num_params == 0) return Status::Ok();
    const size_t world = static_cast<size_t>(group.size());
    const size_t tail_at = block * world;
    // 1. Reduce-scatter (sum) the shards' gradients, straight from `grads`.
    if (block > 0) {
      AGENTRT_RETURN_IF_ERROR(
          group.ReduceScatter(grads, shard_grad, block, DataType::kFloat32, ReduceOp::kSum));
    }
    // 2. One all-reduce carries the tail's gradients and the shards' squared
    // norms (in a buffer of the group's kind: device memory for nccl).
    AGENTRT_ASSIGN_OR_RETURN(const double shard_sq, ops->SquaredNorm(shard_grad, block));
    const float shard_sq_f = static_cast<float>(shard_sq);
    AGENTRT_RETURN_IF_ERROR(ops->Copy(reduced, grads + tail_at, tail));
    AGENTRT_RETURN_IF_ERROR(ops->FromHost(reduced + tail, &shard_sq_f, 1));
    AGENTRT_RETURN_IF_ERROR(group.AllReduce(reduced, tail + 1, DataType::kFloat32, ReduceOp::kSum));
    float shards_sq = 0.0f;
    AGENTRT_RETURN_IF_ERROR(ops->ToHost(&shards_sq, reduced + tail, 1));
    AGENTRT_ASSIGN_OR_RETURN(const double tail_sq, ops->SquaredNorm(reduced, tail));
    const float avg = options.average_grads ? 1.0f / static_cast<float>(world) : 1.0f;
    const float norm = std::sqrt(shards_sq + static_cast<float>(tail_sq)) * avg;
    if (grad_norm != nullptr) *grad_norm = norm;
    // 3. AdamW on this rank's shard, and on the tail (the same on every rank).
    ++step;
    const AdamWScalars s =
        MakeAdamWScalars(options, step, avg * ClipScale(options.max_grad_norm, norm));
    AGENTRT_RETURN_IF_ERROR(ops->Update(params + offset, shard_grad, m, v, block, s));
    AGENTRT_RETURN_IF_ERROR(ops->Update(params + tail_at, reduced, m + block, v + block, tail, s));
    // 4. All-gather the updated shards (in place: each rank's block is its own shard).
    if (block == 0) return Status::Ok();
    return group.AllGather(params + offset, params, block, DataType::kFloat32);
  }
};

ShardedAdam::ShardedAdam(Group& group, size_t num_params, AdamWOptions options)
    : impl_(std::make_unique<Impl>(group, num_params, options)) {
  impl_->init_status = impl_->Init();
}

ShardedAdam::~ShardedAdam() = default;

Status ShardedAdam::Step(float* params, float* grads, float* grad_norm) {
  if (!impl_->init_status.ok()) return impl_->init_status;
  Status s = impl_->Step(params, grads, grad_norm);
  return s.ok() ? s : s.WithContext(impl_->Where() + " step " + std::to_string(impl_->step));
}

size_t ShardedAdam::num_params() const { return impl_->num_params; }
size_t ShardedAdam::shard_offset() const { return impl_->offset; }
size_t ShardedAdam::shard_size() const { return impl_->block; }
size_t ShardedAdam::tail_size() const { return impl_->tail; }
int64_t ShardedAdam::step_count() const { return impl_->step; }
size_t ShardedAdam::state_bytes() const { return 2 * impl_->state_len() * sizeof(float); }
AdamWOptions& ShardedAdam::options() { return impl_->options; }

std::vector<uint8_t> ShardedAdam::SaveState() const {
  const Impl& d = *impl_;
  StateHeader h{};
  std::memcpy(h.magic, kStateMagic, sizeof(h.magic));
  h.version = 1;
  h.world_size = d.group.size();
  h.rank = d.group.rank();
  h.num_params = d.num_params;
  h.shard_offset = d.offset;
  h.shard_size = d.block;
  h.step = d.step;
  const size_t len = d.state_len();
  const size_t vec_bytes = len * sizeof(float);
  std::vector<uint8_t> out(sizeof(h) + 2 * vec_bytes);
  std::memcpy(out.data(), &h, sizeof(h));
  if (!d.init_status.ok()) return {};
  if (len > 0) {
    // A state that cannot be read back from the device is not saved at all: an
    // empty result, which LoadState rejects, rather than zeros that look valid.
    if (!d.ops->ToHost(out.data() + sizeof(h), d.m, len).ok() ||
        !d.ops->ToHost(out.data() + sizeof(h) + vec_bytes, d.v, len).ok()) {
      return {};
    }
  }
  return out;
}

Status ShardedAdam::LoadState(std::span<const uint8_t> state) {
  Impl& d = *impl_;
  if (!d.init_status.ok()) return d.init_status;
  const std::string where = d.Where() + ": LoadState";
  StateHeader h{};
  if (state.size() < sizeof(h)) {
    return DataLoss(where + ": state is " + std::to_string(state.size()) +
                    " bytes, shorter than its header (" + std::to_string(sizeof(h)) + ")");
  }
  std::memcpy(&h, state.data(), sizeof(h));
  if (std::memcmp(h.magic, kStateMagic, sizeof(h.magic)) != 0 || h.version != 1) {
    return DataLoss(where + ": not a ShardedAdam state (bad magic or version)");
  }
  if (h.world_size != d.group.size() || h.num_params != d.num_params) {
    return FailedPrecondition(
        where + ": state was saved with world size " + std::to_string(h.world_size) + " and " +
        std::to_string(h.num_params) + " parameters; this optimizer has world size " +
        std::to_string(d.group.size()) + " and " + std::to_string(d.num_params) + " parameters");
  }
  if (h.rank != d.group.rank() || h.shard_offset != d.offset || h.shard_size != d.block) {
    return FailedPrecondition(where + ": state belongs to rank " + std::to_string(h.rank) +
                              ", not rank " + std::to_string(d.group.rank()));
  }
  const size_t len = d.state_len();
  const size_t vec_bytes = len * sizeof(float);
  if (state.size() != sizeof(h) + 2 * vec_bytes) {
    return DataLoss(where + ": state is " + std::to_string(state.size()) + " bytes, expected " +
                    std::to_string(sizeof(h) + 2 * vec_bytes));
  }
  if (len > 0) {
    AGENTRT_RETURN_IF_ERROR(d.ops->FromHost(d.m, state.data() + sizeof(h), len));
    AGENTRT_RETURN_IF_ERROR(d.ops->FromHost(d.v, state.data() + sizeof(h) + vec_bytes, len));
  }
  d.step = h.step;
  return Status::Ok();
}

void ShardedAdam::AddTo(CheckpointState& state, const std::string& prefix) const {
  const Impl& d = *impl_;
  const bool last = d.group.rank() == d.group.size() - 1;
  // The last rank's shard and the tail are adjacent in m and v and globally.
  const uint64_t count = d.block + (last ? d.tail : 0);
  const std::vector<int64_t> shape = {static_cast<int64_t>(d.num_params)};
  for (const auto& [name, buf] : {std::pair{"m", d.m}, std::pair{"v", d.v}}) {
    if (d.ops->api() != nullptr) {  // staged from the device by the checkpointer's side stream
      state.AddDeviceSlice(prefix + name, buf, "float32", sizeof(float), shape, d.offset, count,
                           {d.ops->api(), d.ops->device(), d.ops->stream()});
    } else {
      state.AddSlice(prefix + name, buf, "float32", sizeof(float), shape, d.offset, count);
    }
  }
  if (d.group.rank() == 0)
    state.AddSlice(prefix + "step", &d.step, "int64", sizeof d.step, {1}, 0, 1);
}

Status ShardedAdam::LoadFrom(const SavedStep& saved, const std::string& prefix) {
  Impl& d = *impl_;
  if (!d.init_status.ok()) return d.init_status;
  const std::string where = d.Where() + ": restore from " + saved.path();
  for (const char* name : {"m", "v"}) {
    const SavedStep::Array* a = saved.Find(prefix + name);
    if (a == nullptr) return NotFound(where + ": no \"" + prefix + name + "\" in the checkpoint");
    if (a->elements != d.num_params || a->element_bytes != sizeof(float)) {
      return FailedPrecondition(where + ": \"" + prefix + name + "\" holds " +
                                std::to_string(a->elements) + " elements of " +
                                std::to_string(a->element_bytes) + " bytes; this optimizer has " +
                                std::to_string(d.num_params) + " float32 parameters");
    }
  }
  const size_t len = d.state_len();
  const size_t tail_at = d.num_params - d.tail;
  std::vector<float> host;
  for (const auto& [name, buf] : {std::pair{"m", d.m}, std::pair{"v", d.v}}) {
    float* dst = buf;
    if (d.group.device_buffers()) {
      host.resize(len);
      dst = host.data();
    }
    AGENTRT_RETURN_IF_ERROR(saved.Read(prefix + name, d.offset, d.block, dst).WithContext(where));
    AGENTRT_RETURN_IF_ERROR(
        saved.Read(prefix + name, tail_at, d.tail, dst + d.block).WithContext(where));
    if (d.group.device_buffers()) AGENTRT_RETURN_IF_ERROR(d.ops->FromHost(buf, dst, len));
  }
  int64_t step = 0;
  AGENTRT_RETURN_IF_ERROR(saved.Read(prefix + "step", 0, 1, &step).WithContext(where));
  d.step = step;
  return Status::Ok();
}

}  // namespace agentrt
