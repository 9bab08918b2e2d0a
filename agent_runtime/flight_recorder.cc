#include "agent_runtime/flight_recorder.h"

#include <utility>

#include "common/enum_names.h"
#include "comms/telemetry.h"  // UnixTimeSeconds

namespace agentrt {
namespace {

constexpr EnumName<CollectiveRecord::State> kStateNames[] = {
    {CollectiveRecord::State::kRunning, "running"},
    {CollectiveRecord::State::kDone, "done"},
    {CollectiveRecord::State::kFailed, "failed"}};

std::string_view StateName(CollectiveRecord::State s) { return NameIn(kStateNames, s); }

// Records each call of the wrapped group; adds nothing else.
class RecordingGroup final : public Group {
 public:
  RecordingGroup(std::unique_ptr<Group> inner, FlightRecorder* recorder)
      : inner_(std::move(inner)), recorder_(recorder) {}

  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  std::string_view backend() const override { return inner_->backend(); }
  bool device_buffers() const override { return inner_->device_buffers(); }
  void* native_stream() const override { return inner_->native_stream(); }
  void set_caller_stream(void* stream) override { inner_->set_caller_stream(stream); }
  DeviceBinding device_binding() const override { return inner_->device_binding(); }

  Status AllReduce(void* buf, size_t count, DataType type, ReduceOp op, Timeout timeout) override {
    return Recorded(CollectiveOp::kAllReduce, count, type,
                    [&] { return inner_->AllReduce(buf, count, type, op, timeout); });
  }
  Status ReduceScatter(const void* send, void* recv, size_t recv_count, DataType type, ReduceOp op,
                       Timeout timeout) override {
    return Recorded(
        CollectiveOp::kReduceScatter, recv_count * static_cast<size_t>(size()), type,
        [&] { return inner_->ReduceScatter(send, recv, recv_count, type, op, timeout); });
  }
  Status AllGather(const void* send, void* recv, size_t send_count, DataType type,
                   Timeout timeout) override {
    return Recorded(CollectiveOp::kAllGather, send_count * static_cast<size_t>(size()), type,
                    [&] { return inner_->AllGather(send, recv, send_count, type, timeout); });
  }
  Status Broadcast(void* buf, size_t count, DataType type, int root, Timeout timeout) override {
    return Recorded(CollectiveOp::kBroadcast, count, type,
                    [&] { return inner_->Broadcast(buf, count, type, root, timeout); });
  }
  Status Barrier(Timeout timeout) override {
    return Recorded(CollectiveOp::kBarrier, 0, DataType::kFloat32,
                    [&] { return inner_->Barrier(timeout); });
  }

 private:
  template <typename Call>
  Status Recorded(CollectiveOp op, size_t count, DataType type, Call&& call) {
    const uint64_t seq = recorder_->Begin(op, count * DataTypeSize(type), type);
    Status s = call();
    recorder_->End(seq, s.ok());
    return s;
  }

  std::unique_ptr<Group> inner_;
  FlightRecorder* recorder_;
};

}  // namespace

uint64_t FlightRecorder::Begin(CollectiveOp op, uint64_t bytes, DataType dtype) {
  const double now = UnixTimeSeconds();
  const auto steady = std::chrono::steady_clock::now();
  std::lock_guard<std::mutex> lock(mu_);
  const uint64_t seq = ++last_seq_;
  ring_[seq % kCapacity] = {seq, op, dtype,  bytes,
                            now, 0,  steady, CollectiveRecord::State::kRunning};
  return seq;
}

void FlightRecorder::End(uint64_t seq, bool ok) {
  const double now = UnixTimeSeconds();
  const auto steady = std::chrono::steady_clock::now();
  std::lock_guard<std::mutex> lock(mu_);
  CollectiveRecord& r = ring_[seq % kCapacity];
  if (r.seq != seq) return;
  r.end_unix_s = now;
  r.state = ok ? CollectiveRecord::State::kDone : CollectiveRecord::State::kFailed;
  busy_s_ += std::chrono::duration<double>(steady - r.start_steady).count();
}

CollectiveSnapshot FlightRecorder::Snapshot(size_t recent) const {
  std::array<CollectiveRecord, kCapacity> copy;
  uint64_t last = 0;
  double busy = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    copy = ring_;
    last = last_seq_;
    busy = busy_s_;
  }
  const auto steady = std::chrono::steady_clock::now();
  CollectiveSnapshot s;
  s.seq = last;
  s.busy_s = busy;
  if (last > 0) {
    const CollectiveRecord& current = copy[last % kCapacity];
    s.in = current.state == CollectiveRecord::State::kRunning;
    s.op = CollectiveOpName(current.op);
    s.since = current.start_unix_s;
    if (s.in) s.in_for_s = std::chrono::duration<double>(steady - current.start_steady).count();
  }
  const uint64_t n = std::min<uint64_t>({recent, kCapacity, last});
  for (uint64_t seq = last - n + 1; n > 0 && seq <= last; ++seq) {
    const CollectiveRecord& r = copy[seq % kCapacity];
    if (r.seq != seq) continue;
    s.recent.push_back({.seq = r.seq,
                        .op = std::string(CollectiveOpName(r.op)),
                        .bytes = r.bytes,
                        .dtype = std::string(DataTypeName(r.dtype)),
                        .start = r.start_unix_s,
                        .end = r.end_unix_s,
                        .state = std::string(StateName(r.state))});
  }
  return s;
}

std::unique_ptr<Group> RecordCollectives(std::unique_ptr<Group> group, FlightRecorder* recorder) {
  return std::make_unique<RecordingGroup>(std::move(group), recorder);
}

}  // namespace agentrt
