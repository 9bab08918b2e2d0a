// agentrt-preflight: one rank of `agentctl check` (tools/agentctl/cmd_check.cc).
// Started by the controller like any agent, so it runs on exactly the agent's
// partition (its GPUs, its ranks, its nodes, its port block):
//   1. ports: the first rank on each node binds every port of AGENTRT_PORTS;
//   2. the group: all-reduce, reduce-scatter and all-gather from 8 B to
//      --max-bytes (x4 steps) through Runtime::group(), on buffers of the
//      group's kind (device memory of the rank's GPU for NCCL), time per call, algbw and
//      busbw with the nccl-tests formulas (agent_runtime/bandwidth.h); agentctl
//      check compares the largest with the agent's link;
//   3. the bus: connect and authenticate with the agent's token, from each node;
//   4. the checkpoint directory: write + fsync --ckpt-probe-bytes, MB/s;
//   5. clock skew between the ranks (an all-gather of their clocks).
// Rank 0 writes $AGENTRT_WORKDIR/preflight.json (a PreflightReport, plan/records.h) and
// every rank exits 0, also when a probe failed: the verdict is agentctl check's.
#include <fcntl.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <array>
#include <chrono>
#include <cstring>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "agent_runtime/bandwidth.h"
#include "agent_runtime/device_api.h"
#include "agent_runtime/runtime.h"
#include "common/file_util.h"
#include "plan/port_lease.h"
#include "plan/records.h"
#include "plan/run_dir.h"

namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

// Ports of [first, last] a server cannot bind now.
std::vector<int> UnbindablePorts(int first, int last) {
  std::vector<int> bad;
  for (int port = first; port > 0 && port <= last; ++port) {
    if (!agentrt::PortBindable(port)) bad.push_back(port);
  }
  return bad;
}

// MB/s of writing `bytes` to a file in `dir` and fsyncing it; -1 when it fails.
double WriteProbe(const std::string& dir, size_t bytes, std::string* error) {
  const std::string path = dir + "/.preflight-probe";
  std::vector<char> chunk(std::min<size_t>(bytes, 4u << 20), 'x');
  const auto t0 = Clock::now();
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) {
    *error = "cannot create " + path + ": " + std::strerror(errno);
    return -1;
  }
  bool ok = true;
  for (size_t done = 0; ok && done < bytes;) {
    const size_t n = std::min(chunk.size(), bytes - done);
    const ssize_t w = ::write(fd, chunk.data(), n);
    ok = w > 0;
    if (ok) done += static_cast<size_t>(w);
  }
  ok = ok && ::fsync(fd) == 0;
  if (!ok) *error = "cannot write and fsync " + path + ": " + std::strerror(errno);
  ::close(fd);
  ::unlink(path.c_str());
  const double s = Seconds(Clock::now() - t0);
  return ok && s > 0 ? static_cast<double>(bytes) / s / 1e6 : -1;
}

// The buffers of the sweep, of the group's kind: host memory, or device
// memory on the group's GPU for a device (NCCL) group, so that the sweep times
// the same collectives training runs. Small host values (the iteration count,
// clocks, failure counts) travel through a staging buffer of the same kind.
class SweepMemory {
 public:
  SweepMemory(agentrt::Group& group, size_t bytes) : group_(group), bytes_(bytes) {}
  ~SweepMemory() {
    if (api_ == nullptr) return;
    agentrt::device::DeviceGuard guard(api_, device_);
    for (void* p : {send_, recv_, stage_}) api_->Free(p);
  }

  agentrt::Status Init() {
    if (!group_.device_buffers()) {
      host_send_.assign(bytes_ / sizeof(float) + 1, 1.0f);
      host_recv_.assign(host_send_.size(), 0.0f);
      send_ = host_send_.data();
      recv_ = host_recv_.data();
      return agentrt::Status::Ok();
    }
    const agentrt::Group::DeviceBinding binding = group_.device_binding();
    if (binding.api == nullptr) {
      return agentrt::FailedPrecondition("the device group names no device");
    }
    api_ = binding.api;
    device_ = binding.device;
    agentrt::device::DeviceGuard guard(api_, device_);
    AGENTRT_RETURN_IF_ERROR(guard.status());
    const size_t n = bytes_ + sizeof(float);
    for (void** p : {&send_, &recv_, &stage_}) {
      AGENTRT_ASSIGN_OR_RETURN(*p, api_->Malloc(p == &stage_ ? kStageBytes : n));
    }
    std::vector<float> ones(n / sizeof(float), 1.0f);
    AGENTRT_RETURN_IF_ERROR(api_->CopyAsync(send_, ones.data(), ones.size() * sizeof(float),
                                            agentrt::device::CopyKind::kHostToDevice, nullptr));
    AGENTRT_RETURN_IF_ERROR(api_->MemsetAsync(recv_, 0, n, nullptr));
    return api_->SynchronizeStream(nullptr);
  }

  void* send() { return send_; }
  void* recv() { return recv_; }

  // Runs `collective(buffer)` on `bytes` of host memory at `host`, in place.
  template <typename Collective>
  agentrt::Status OnHost(void* host, size_t bytes, Collective collective) {
    if (api_ == nullptr) return collective(host);
    if (bytes > kStageBytes) return agentrt::InvalidArgument("staged value too large");
    agentrt::device::DeviceGuard guard(api_, device_);
    AGENTRT_RETURN_IF_ERROR(guard.status());
    // Enqueued on the legacy stream, which the group orders its collectives after.
    AGENTRT_RETURN_IF_ERROR(
        api_->CopyAsync(stage_, host, bytes, agentrt::device::CopyKind::kHostToDevice, nullptr));
    AGENTRT_RETURN_IF_ERROR(collective(stage_));
    AGENTRT_RETURN_IF_ERROR(
        api_->CopyAsync(host, stage_, bytes, agentrt::device::CopyKind::kDeviceToHost, nullptr));
    return api_->SynchronizeStream(nullptr);
  }

 private:
  static constexpr size_t kStageBytes = 64 * 1024;
  agentrt::Group& group_;
  size_t bytes_;
  agentrt::device::Api* api_ = nullptr;
  int device_ = -1;
  std::vector<float> host_send_;
  std::vector<float> host_recv_;
  void* send_ = nullptr;
  void* recv_ = nullptr;
  void* stage_ = nullptr;
};

struct Point {
  agentrt::CollectiveOp op;
  size_t bytes;
  double seconds;  // per call
};

// One rank's check, step by step; rank 0 writes the agent's report.
class Preflight {
 public:
  Preflight(agentrt::Runtime& rt, size_t max_bytes, size_t ckpt_probe_bytes)
      : rt_(rt), env_(rt.env()), max_bytes_(max_bytes), ckpt_probe_bytes_(ckpt_probe_bytes) {
    result_.agent = env_.agent;
    result_.ranks = env_.world_size;
  }

  int Run() {
    CheckPorts();  // before the group: NCCL's store takes MASTER_PORT
    CheckBus();
    auto group = rt_.group();
    if (!group.ok()) {
      Error("the group did not form: " + group.status().ToString());
    } else if ((*group)->size() > 1) {
      SweepMemory memory(**group, max_bytes_);
      if (agentrt::Status m = memory.Init(); !m.ok()) {
        Error("the " + std::string((*group)->backend()) +
              " sweep cannot allocate its buffers: " + m.ToString());
      } else {
        Sweep(**group, memory);
        MeasureSkew(**group, memory);
        CountFailuresElsewhere(**group, memory);
      }
    }
    ReportFailuresElsewhere();
    if (env_.rank != 0) return 0;
    CheckCheckpointDir();
    return Write();
  }

 private:
  void Error(const std::string& what) {
    result_.errors.push_back(what);
    std::cerr << "agentrt-preflight " << env_.agent << " rank " << env_.rank << ": " << what
              << std::endl;
  }

  // 1. Every port of the agent's block, from each node (its first rank).
  void CheckPorts() {
    if (env_.local_rank != 0) return;
    for (int p : UnbindablePorts(env_.ports_first, env_.ports_last)) {
      Error("port " + std::to_string(p) + " of the agent's block " +
            std::to_string(env_.ports_first) + "-" + std::to_string(env_.ports_last) +
            " cannot be bound on this node (in use?)");
      ++failed_here_[0];
    }
  }

  // 3. The bus, with the agent's own credential, from each node (its first rank).
  void CheckBus() {
    if (env_.bus.empty() || env_.local_rank != 0) return;
    auto bus = rt_.bus();
    agentrt::Status s = bus.ok() ? (*bus)->WaitForReady(std::chrono::seconds(10)) : bus.status();
    if (s.ok()) s = (*bus)->Stats().status();
    if (!s.ok()) {
      Error("the bus at " + env_.bus + " is not usable from here: " + s.ToString());
      failed_here_[1] = 1;
    }
  }

  // One timed collective of the sweep: as many calls as fit in ~50 ms (at
  // least 3; rank 0's count for everyone), after a warm-up.
  agentrt::Status TimeCollective(agentrt::Group& g, SweepMemory& memory, agentrt::CollectiveOp op,
                                 size_t count) {
    const auto n = static_cast<size_t>(g.size());
    auto call = [&]() -> agentrt::Status {
      switch (op) {
        case agentrt::CollectiveOp::kAllReduce:
          return g.AllReduce(memory.send(), count, agentrt::DataType::kFloat32,
                             agentrt::ReduceOp::kSum);
        case agentrt::CollectiveOp::kReduceScatter:
          return g.ReduceScatter(memory.send(), memory.recv(), count / n,
                                 agentrt::DataType::kFloat32, agentrt::ReduceOp::kSum);
        default:
          return g.AllGather(memory.send(), memory.recv(), count / n, agentrt::DataType::kFloat32);
      }
    };
    agentrt::Status s = call();  // warm-up
    int64_t iters = 3;
    const auto t0 = Clock::now();
    for (int64_t i = 0; s.ok() && i < iters; ++i) s = call();
    if (!s.ok()) return s;
    double once = Seconds(Clock::now() - t0) / static_cast<double>(iters);
    iters = std::clamp<int64_t>(static_cast<int64_t>(0.05 / std::max(once, 1e-7)), 3, 1000);
    s = memory.OnHost(&iters, sizeof iters,
                      [&](void* buf) { return g.Broadcast(buf, 1, agentrt::DataType::kInt64, 0); });
    const auto t1 = Clock::now();
    for (int64_t i = 0; s.ok() && i < iters; ++i) s = call();
    if (!s.ok()) return s;
    once = Seconds(Clock::now() - t1) / static_cast<double>(iters);
    points_.push_back({op, count * sizeof(float), once});
    return s;
  }

  // 2. All-reduce, reduce-scatter and all-gather from 8 B, x4 each step, and
  // --max-bytes last. Every rank runs the same calls: a failure on one rank
  // ends the sweep on all (the collective fails).
  void Sweep(agentrt::Group& g, SweepMemory& memory) {
    const auto n = static_cast<size_t>(g.size());
    const agentrt::CollectiveOp ops[] = {agentrt::CollectiveOp::kAllReduce,
                                         agentrt::CollectiveOp::kReduceScatter,
                                         agentrt::CollectiveOp::kAllGather};
    for (size_t bytes = std::min<size_t>(8, max_bytes_);; bytes = std::min(bytes * 4, max_bytes_)) {
      for (agentrt::CollectiveOp op : ops) {
        // Elements of the whole buffer, a multiple of n for the scatter/gather ops.
        size_t count = std::max<size_t>(bytes / sizeof(float), n);
        count -= count % n;
        if (agentrt::Status s = TimeCollective(g, memory, op, count); !s.ok()) {
          Error(std::string(agentrt::CollectiveOpName(op)) + " failed: " + s.ToString());
          return;
        }
      }
      if (bytes == max_bytes_) return;
    }
  }

  // 5. Clock skew: every rank reads its clock as it leaves one barrier.
  void MeasureSkew(agentrt::Group& g, SweepMemory& memory) {
    std::vector<int64_t> clocks(static_cast<size_t>(g.size()), 0);
    if (!g.Barrier().ok()) return;
    clocks[static_cast<size_t>(g.rank())] = static_cast<int64_t>(agentrt::UnixTimeSeconds() * 1e6);
    const agentrt::Status gathered =
        memory.OnHost(clocks.data(), clocks.size() * sizeof(int64_t), [&](void* buf) {
          return g.AllGather(static_cast<int64_t*>(buf) + g.rank(), buf, 1,
                             agentrt::DataType::kInt64);
        });
    if (gathered.ok()) {
      const auto [lo, hi] = std::minmax_element(clocks.begin(), clocks.end());
      result_.clock_skew_ms = static_cast<double>(*hi - *lo) / 1e3;
    }
  }

  // What the port and bus probes found on the agent's other nodes.
  void CountFailuresElsewhere(agentrt::Group& g, SweepMemory& memory) {
    failed_elsewhere_ = failed_here_;
    const agentrt::Status summed =
        memory.OnHost(failed_elsewhere_.data(), sizeof failed_elsewhere_, [&](void* buf) {
          return g.AllReduce(buf, 2, agentrt::DataType::kInt64, agentrt::ReduceOp::kSum);
        });
    if (!summed.ok())
      Error("the per-node failure counts could not be summed: " + summed.ToString());
    for (size_t k = 0; k < 2; ++k) failed_elsewhere_[k] -= failed_here_[k];
  }

  void ReportFailuresElsewhere() {
    if (failed_elsewhere_[0] > 0) {
      Error(std::to_string(failed_elsewhere_[0]) +
            " port(s) of the agent's block cannot be bound on its other nodes (see their logs)");
    }
    if (failed_elsewhere_[1] > 0) {
      Error("the bus at " + env_.bus + " is not usable from " +
            std::to_string(failed_elsewhere_[1]) + " other node(s) of the agent (see their logs)");
    }
    if (!env_.bus.empty()) {
      result_.bus = {.address = env_.bus, .ok = failed_here_[1] + failed_elsewhere_[1] == 0};
    }
  }

  // 4. The checkpoint directory.
  void CheckCheckpointDir() {
    std::string why;
    const double mbps = WriteProbe(env_.ckpt_dir, ckpt_probe_bytes_, &why);
    result_.checkpoint = {.dir = env_.ckpt_dir, .write_mb_s = mbps};
    if (mbps < 0) Error(why);
  }

  int Write() {
    for (const Point& p : points_) {
      const double algbw = agentrt::AlgBandwidthGBps(static_cast<double>(p.bytes), p.seconds);
      const double busbw = algbw * agentrt::BusBandwidthFactor(p.op, env_.world_size);
      const auto bytes = static_cast<int64_t>(p.bytes);
      result_.sweep.push_back({.op = std::string(agentrt::CollectiveOpName(p.op)),
                               .bytes = bytes,
                               .time_us = p.seconds * 1e6,
                               .algbw_gbps = algbw,
                               .busbw_gbps = busbw});
      if (p.op == agentrt::CollectiveOp::kAllReduce && bytes >= result_.largest_bytes) {
        result_.largest_bytes = bytes;
        result_.largest_busbw_gbps = busbw;
      }
    }
    const agentrt::Status written = agentrt::WriteFileAtomic(agentrt::PreflightFile(env_.workdir),
                                                             result_.ToJson().dump(1) + "\n");
    if (!written.ok()) {
      std::cerr << "agentrt-preflight: " << written.ToString() << std::endl;
      return 1;
    }
    return 0;
  }

  agentrt::Runtime& rt_;
  const agentrt::AgentEnv& env_;
  const size_t max_bytes_;
  const size_t ckpt_probe_bytes_;
  agentrt::PreflightReport result_;
  std::vector<Point> points_;
  // Failed port and bus probes ([0], [1]) on this rank's node, then on the others.
  std::array<int64_t, 2> failed_here_ = {0, 0};
  std::array<int64_t, 2> failed_elsewhere_ = {0, 0};
};

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"agentrt-preflight: one rank of `agentctl check`"};
  size_t max_bytes = 64u << 20;
  size_t ckpt_probe_bytes = 16u << 20;
  app.add_option("--max-bytes", max_bytes, "largest collective buffer");
  app.add_option("--ckpt-probe-bytes", ckpt_probe_bytes,
                 "bytes written to probe the checkpoint dir");
  CLI11_PARSE(app, argc, argv);

  agentrt::RuntimeOptions options;
  options.install_signal_handlers = true;
  auto rt = agentrt::Runtime::FromEnvironment(options);
  if (!rt.ok()) {
    std::cerr << "agentrt-preflight: " << rt.status().ToString() << std::endl;
    return 2;
  }
  return Preflight(**rt, max_bytes, ckpt_probe_bytes).Run();
}
