// The MPI worker modes of bench_collectives (run under mpirun).
#include <mpi.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include "agent_runtime/adamw.h"
#include "agent_runtime/bandwidth.h"
#include "agent_runtime/mpi_group.h"
#include "agent_runtime/sharded_adam.h"
#include "bench.h"

namespace agentrt::bench {
namespace {

using Clock = std::chrono::steady_clock;

bool FullRun() {
  const char* v = std::getenv("AGENTRT_BENCH_FULL");
  return v != nullptr && v[0] == '1';
}

std::unique_ptr<Group> MakeWorldGroup(const char* agent) {
  GroupOptions o;
  o.backend = GroupBackend::kMpi;
  o.agent = agent;
  auto g = MakeMpiGroup(o);
  if (!g.ok()) {
    std::fprintf(stderr, "bench_collectives: %s\n", g.status().ToString().c_str());
    std::exit(1);
  }
  return std::move(g).value();
}

// Seconds `fn` took on the slowest rank, every rank starting together.
template <typename Fn>
double TimeMax(MPI_Comm comm, Fn fn) {
  MPI_Barrier(comm);
  const auto t0 = Clock::now();
  fn();
  double s = std::chrono::duration<double>(Clock::now() - t0).count();
  MPI_Allreduce(MPI_IN_PLACE, &s, 1, MPI_DOUBLE, MPI_MAX, comm);
  return s;
}

void Check(const Status& s) {
  if (!s.ok()) {
    std::fprintf(stderr, "bench_collectives: %s\n", s.ToString().c_str());
    std::exit(1);
  }
}

}  // namespace

int RunAllReduceBench(int, char**) {
  auto group = MakeWorldGroup("bench-allreduce");  // initialises MPI
  MPI_Comm raw;
  MPI_Comm_dup(MPI_COMM_WORLD, &raw);
  const int rank = group->rank();
  const int np = group->size();
  const bool full = FullRun();
  std::vector<std::string> figures;
  for (size_t bytes = size_t{1} << 10; bytes <= size_t{256} << 20; bytes *= 4) {
    const size_t count = bytes / sizeof(float);
    std::vector<float> buf(count, 0.0f);  // zeros stay zeros: no overflow, no denormals
    // Enough calls per sample to span a few milliseconds; fewer samples at big sizes.
    const int iters =
        static_cast<int>(std::max<size_t>(1, std::min<size_t>(200, (size_t{8} << 20) / bytes)));
    const int samples = full ? 15
                             : (bytes >= (size_t{64} << 20)  ? 3
                                : bytes >= (size_t{1} << 20) ? 5
                                                             : 9);
    auto raw_call = [&] {
      for (int i = 0; i < iters; ++i) {
        MPI_Allreduce(MPI_IN_PLACE, buf.data(), static_cast<int>(count), MPI_FLOAT, MPI_SUM, raw);
      }
    };
    auto group_call = [&] {
      for (int i = 0; i < iters; ++i) {
        Check(group->AllReduce(buf.data(), count, DataType::kFloat32, ReduceOp::kSum));
      }
    };
    raw_call();  // warm-up: connections, buffers
    group_call();
    std::vector<double> t_raw;
    std::vector<double> t_group;
    for (int s = 0; s < samples; ++s) {
      // Alternate the order so neither side always runs on a warmer cache.
      if (s % 2 == 0) {
        t_raw.push_back(TimeMax(raw, raw_call));
        t_group.push_back(TimeMax(raw, group_call));
      } else {
        t_group.push_back(TimeMax(raw, group_call));
        t_raw.push_back(TimeMax(raw, raw_call));
      }
    }
    // nccl-tests' busbw (agent_runtime/bandwidth.h): comparable with all_reduce_perf.
    const double factor = agentrt::BusBandwidthFactor(agentrt::CollectiveOp::kAllReduce, np);
    const double gbps_raw =
        agentrt::AlgBandwidthGBps(static_cast<double>(bytes), Median(t_raw) / iters) * factor;
    const double gbps_group =
        agentrt::AlgBandwidthGBps(static_cast<double>(bytes), Median(t_group) / iters) * factor;
    if (rank == 0) {
      std::fprintf(stderr,
                   "allreduce np=%d %8s  busbw raw %8.3f GB/s  group %8.3f GB/s  ratio %.3f\n", np,
                   SizeName(bytes).c_str(), gbps_raw, gbps_group, gbps_group / gbps_raw);
      figures.push_back(
          FigureJson("allreduce_busbw_mpi_np" + std::to_string(np) + "_" + SizeName(bytes),
                     gbps_group, "GB/s", "raw_MPI_Allreduce", gbps_raw));
    }
  }
  if (rank == 0) {
    std::fflush(stderr);
    for (const auto& f : figures) std::printf("%s\n", f.c_str());
    std::fflush(stdout);
  }
  MPI_Comm_free(&raw);
  return 0;
}

int RunAdamBench(int, char**) {
  auto group = MakeWorldGroup("bench-adam");
  MPI_Comm raw;
  MPI_Comm_dup(MPI_COMM_WORLD, &raw);
  const size_t n = 100'000'000;
  const int samples = FullRun() ? 7 : 3;
  std::vector<float> params(n);
  std::vector<float> grads_src(n);
  std::vector<float> grads(n);
  for (size_t i = 0; i < n; ++i) {
    params[i] = static_cast<float>(i % 1000) * 1e-3f;
    grads_src[i] =
        static_cast<float>((i * 7 + static_cast<size_t>(group->rank())) % 1000) * 1e-4f - 0.05f;
  }
  AdamWOptions o;
  o.lr = 1e-4f;
  o.weight_decay = 0.01f;
  o.max_grad_norm = 1.0f;

  std::vector<double> t_sharded;
  size_t sharded_state = 0;
  {
    ShardedAdam opt(*group, n, o);
    for (int s = 0; s <= samples; ++s) {  // step 0 is the warm-up
      std::memcpy(grads.data(), grads_src.data(), n * sizeof(float));
      const double t = TimeMax(raw, [&] { Check(opt.Step(params.data(), grads.data())); });
      if (s > 0) t_sharded.push_back(t);
    }
    sharded_state = opt.state_bytes();
  }
  std::vector<double> t_plain;
  size_t plain_state = 0;
  {
    AdamW opt(n, o);
    for (int s = 0; s <= samples; ++s) {
      std::memcpy(grads.data(), grads_src.data(), n * sizeof(float));
      const double t = TimeMax(raw, [&] {
        Check(group->AllReduce(grads.data(), n, DataType::kFloat32, ReduceOp::kSum));
        opt.Step(params.data(), grads.data());
      });
      if (s > 0) t_plain.push_back(t);
    }
    plain_state = opt.state_bytes();
  }
  if (group->rank() == 0) {
    const double ms_sharded = Median(t_sharded) * 1e3;
    const double ms_plain = Median(t_plain) * 1e3;
    std::fprintf(stderr,
                 "adam 100M np=%d  sharded %.1f ms (state %zu MB/rank)  unsharded+allreduce %.1f "
                 "ms (state %zu MB/rank)\n",
                 group->size(), ms_sharded, sharded_state >> 20, ms_plain, plain_state >> 20);
    std::fflush(stderr);
    std::printf("%s\n", FigureJson("sharded_adam_step_100M_np" + std::to_string(group->size()),
                                   ms_sharded, "ms", "adamw_plus_allreduce_step", ms_plain)
                            .c_str());
    std::printf("%s\n",
                FigureJson("sharded_adam_state_per_rank_100M_np" + std::to_string(group->size()),
                           static_cast<double>(sharded_state) / 1e6, "MB", "adamw_state",
                           static_cast<double>(plain_state) / 1e6)
                    .c_str());
    std::fflush(stdout);
  }
  MPI_Comm_free(&raw);
  return 0;
}

}  // namespace agentrt::bench
