// The NCCL group's host logic over a fake CUDA/NCCL layer (label unit): the
// backend rule, device choice, ordering after the caller's stream, polling
// with back-off, abort that does not wait, one deadline for start-up, the
// rendezvous key, and ShardedAdam on the group's own device. The same code
// runs over the real library on a GPU (group_nccl_test, label gpu).
#include "agent_runtime/nccl_group.h"

#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "agent_runtime/checkpointer.h"
#include "agent_runtime/group.h"
#include "agent_runtime/sharded_adam.h"
#include "plan/config.h"
#include "tests/agent_runtime/fake_device.h"
#include "tests/agent_runtime/free_port.h"
#include "tests/common/temp_dir.h"

namespace agentrt {
namespace {

using Catch::Matchers::Contains;
using testing::FakeDevice;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

double SecondsSince(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

GroupOptions DeviceOptions(FakeDevice& fake, const char* agent, int rank = 0, int world = 1) {
  GroupOptions o;
  o.agent = agent;
  o.rank = rank;
  o.world_size = world;
  o.local_rank = rank;
  o.visible_gpus = 1;
  o.device_api = &fake;
  o.init_timeout = std::chrono::seconds(10);
  return o;
}

std::unique_ptr<Group> MustMake(const GroupOptions& o) {
  auto g = MakeGroup(o);
  if (!g.ok()) FAIL(g.status().ToString());
  return std::move(g).value();
}

// Device memory of the fake (host memory it owns), freed at scope end.
struct FakeBuffer {
  FakeBuffer(FakeDevice& f, size_t n) : fake(f), count(n) {
    ptr = static_cast<float*>(*fake.Malloc(n * sizeof(float)));
  }
  ~FakeBuffer() { fake.Free(ptr); }
  FakeDevice& fake;
  size_t count;
  float* ptr = nullptr;
};

// Runs `body(rank)` on one thread per rank and joins them.
template <typename Body>
void OnRanks(int world, Body body) {
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) threads.emplace_back([&body, r] { body(r); });
  for (auto& t : threads) t.join();
}

TEST_CASE("a GPU agent gets a device group, for one rank too") {
  CHECK(ResolveGroupBackend(GroupBackend::kAuto, 1, 1) == GroupBackend::kNccl);
  CHECK(ResolveGroupBackend(GroupBackend::kAuto, 2, 2) == GroupBackend::kNccl);
  CHECK(ResolveGroupBackend(GroupBackend::kAuto, 0, 1) == GroupBackend::kSingle);
  CHECK(ResolveGroupBackend(GroupBackend::kAuto, 0, 4) == GroupBackend::kMpi);
  CHECK(ResolveGroupBackend(GroupBackend::kMpi, 2, 2) == GroupBackend::kMpi);
  FakeDevice fake;
  GroupOptions o = DeviceOptions(fake, "solo-gpu");
  auto g = MustMake(o);
  CHECK(g->backend() == "nccl");
  CHECK(g->device_buffers());
  CHECK(g->native_stream() != nullptr);
  // A CPU rank (no visible GPU) still gets the host-only group.
  o.visible_gpus = 0;
  CHECK(MustMake(o)->backend() == "single");
}

TEST_CASE("two local ranks on one visible GPU are refused, saying why") {
  FakeDevice fake(1);
  GroupOptions o = DeviceOptions(fake, "crowded", 1, 2);
  o.master_addr = "127.0.0.1";
  o.master_port = testing::FreeTestPort();
  auto g = MakeGroup(o);
  REQUIRE_FALSE(g.ok());
  CHECK(g.status().code() == StatusCode::kFailedPrecondition);
  CHECK_THAT(g.status().message(), Contains("agent crowded rank 1 (nccl)") &&
                                       Contains("sees 1 GPU(s)") &&
                                       Contains("Duplicate GPU detected"));
}

TEST_CASE("no visible device and a failing driver are told apart") {
  FakeDevice fake;
  fake.SetDeviceCount(0);
  auto none = MakeGroup(DeviceOptions(fake, "nodev"));
  REQUIRE_FALSE(none.ok());
  CHECK_THAT(none.status().message(), Contains("no CUDA device is visible"));
  fake.SetDeviceCount(Internal("cudaGetDeviceCount: CUDA driver version is insufficient"));
  auto broken = MakeGroup(DeviceOptions(fake, "olddriver"));
  REQUIRE_FALSE(broken.ok());
  CHECK_THAT(broken.status().message(),
             Contains("driver version is insufficient") && !Contains("no CUDA device"));
}

TEST_CASE("the nccl backend on a node without an NVIDIA driver says so") {
  GroupOptions o;
  o.agent = "driverless";
  o.visible_gpus = 1;  // auto: nccl; no fake, so the real GPU support is asked for
  auto g = MakeGroup(o);
  if (!device::DriverPresent()) {
    REQUIRE_FALSE(g.ok());
    CHECK(g.status().code() == StatusCode::kFailedPrecondition);
    CHECK_THAT(g.status().message(), Contains("agent driverless rank 0 (group)") &&
                                         Contains("no NVIDIA driver") && Contains("backend: mpi"));
  } else {
    CHECK_THAT(g.status().message(), !Contains("no NVIDIA driver"));
  }
}

TEST_CASE("every rank derives the same rendezvous key") {
  FakeDevice fake;
  GroupOptions a = DeviceOptions(fake, "pred-0", 0, 4);
  GroupOptions b = DeviceOptions(fake, "pred-0", 3, 4);
  CHECK(internal::RendezvousKey(a) == internal::RendezvousKey(b));
  // ...and it differs for another incarnation or another world size.
  b.restart_count = 1;
  CHECK(internal::RendezvousKey(a) != internal::RendezvousKey(b));
  CHECK(internal::RendezvousKey(a) == internal::RendezvousKey(DeviceOptions(fake, "pred-0", 0, 4)));
}

constexpr size_t kN = 64;

TEST_CASE("a collective reads the caller's buffers only after the caller's stream is done") {
  // Two ranks (threads) on two GPUs; each rank's gradient is written by work
  // still running on its caller's stream when AllReduce is called. Without
  // the event the sum would be of the stale zeros.
  FakeDevice fake(2);
  const int port = testing::FreeTestPort();
  std::vector<std::vector<float>> got(2);
  std::vector<Status> status(2);
  for (const bool custom_stream : {false, true}) {
    INFO("caller stream: " << (custom_stream ? "its own" : "the legacy default"));
    OnRanks(2, [&](int rank) {
      REQUIRE(fake.SetDevice(rank).ok());
      GroupOptions o = DeviceOptions(fake, "ordered", rank, 2);
      o.master_addr = "127.0.0.1";
      o.master_port = port;
      o.restart_count = custom_stream ? 1 : 0;
      auto g = MakeGroup(o);
      if (!g.ok()) {
        status[static_cast<size_t>(rank)] = g.status();
        return;
      }
      device::Stream caller = nullptr;
      if (custom_stream) {
        caller = *fake.CreateStream();
        (*g)->set_caller_stream(caller);
      }
      FakeBuffer buf(fake, kN);
      std::memset(buf.ptr, 0, kN * sizeof(float));
      float* p = buf.ptr;
      fake.EnqueueHostWork(
          caller,
          [p, rank] {
            for (size_t i = 0; i < kN; ++i) p[i] = static_cast<float>(rank + 1);
          },
          milliseconds(100));
      status[static_cast<size_t>(rank)] =
          (*g)->AllReduce(buf.ptr, kN, DataType::kFloat32, ReduceOp::kSum, std::chrono::seconds(5));
      got[static_cast<size_t>(rank)].assign(buf.ptr, buf.ptr + kN);
    });
    for (int r = 0; r < 2; ++r) {
      INFO("rank " << r);
      REQUIRE(status[static_cast<size_t>(r)].ok());
      CHECK(got[static_cast<size_t>(r)] == std::vector<float>(kN, 3.0f));
    }
  }
}

TEST_CASE("waiting for a slow collective backs off instead of spinning") {
  internal::PollBackoff backoff;
  CHECK(backoff.SleepAfter(0).count() == 0);
  CHECK(backoff.SleepAfter(backoff.spin_polls - 1).count() == 0);
  CHECK(backoff.SleepAfter(backoff.spin_polls) == backoff.first_sleep);
  CHECK(backoff.SleepAfter(backoff.spin_polls + 1) == 2 * backoff.first_sleep);
  CHECK(backoff.SleepAfter(backoff.spin_polls + 1000) == backoff.max_sleep);

  FakeDevice fake;
  auto g = MustMake(DeviceOptions(fake, "patient"));
  FakeBuffer buf(fake, 16);
  fake.EnqueueHostWork(
      g->native_stream(), [] {}, milliseconds(300));
  const int64_t before = fake.stream_queries();
  const auto t0 = Clock::now();
  REQUIRE(g->AllReduce(buf.ptr, 16, DataType::kFloat32, ReduceOp::kSum).ok());
  const double took = SecondsSince(t0);
  const int64_t polls = fake.stream_queries() - before;
  INFO(polls << " stream queries over " << took << " s");
  CHECK(took >= 0.29);
  // 64 spins, then at most one query per 10 us..1 ms sleep: a few hundred in
  // 300 ms. A spinning loop makes hundreds of thousands.
  CHECK(polls < 2000);
}

TEST_CASE(
    "a collective that never completes returns at its deadline without waiting for the "
    "abort") {
  FakeDevice fake;
  auto g = MustMake(DeviceOptions(fake, "stuck"));
  FakeBuffer buf(fake, 1024);
  fake.Hang(g->native_stream());  // user work the collective queues behind, never finishing
  const auto t0 = Clock::now();
  Status s = g->AllReduce(buf.ptr, 1024, DataType::kFloat32, ReduceOp::kSum, milliseconds(300));
  const double took = SecondsSince(t0);
  INFO(s.ToString() << " after " << took << " s");
  CHECK(s.code() == StatusCode::kDeadlineExceeded);
  CHECK_THAT(
      s.message(),
      Contains("agent stuck rank 0 (nccl): allreduce of 1024 float32 timed out after 300 ms") &&
          Contains("communicator aborted"));
  CHECK(took >= 0.29);
  CHECK(took < 1.5);
  // The abort started but still waits behind the hung work: the call did not wait for it.
  CHECK(fake.WaitAbortsStarted(1, std::chrono::seconds(5)));
  CHECK_FALSE(fake.WaitAbortsFinished(1, milliseconds(50)));
  CHECK(g->Barrier().code() == StatusCode::kAborted);
  fake.ReleaseHangs();
  CHECK(fake.WaitAbortsFinished(1, std::chrono::seconds(5)));
  g.reset();
}

TEST_CASE("an error reported by the communicator fails the collective with its text") {
  FakeDevice fake;
  auto g = MustMake(DeviceOptions(fake, "peerlost"));
  FakeBuffer buf(fake, 8);
  fake.Hang(g->native_stream());
  fake.FailComms("remote process exited or there was a network error");
  Status s = g->AllReduce(buf.ptr, 8, DataType::kFloat32, ReduceOp::kSum, std::chrono::seconds(5));
  CHECK(s.code() == StatusCode::kInternal);
  CHECK_THAT(s.message(), Contains("NCCL async error") && Contains("network error"));
  fake.ReleaseHangs();
  CHECK(fake.WaitAbortsFinished(1, std::chrono::seconds(5)));
}

// Starts `rank` of a 2-rank group whose other rank never comes, with a
// 600 ms init_timeout; returns the failure after checking it came in time.
Status StartAlone(FakeDevice& fake, const char* agent, int rank) {
  GroupOptions o = DeviceOptions(fake, agent, rank, 2);
  o.master_addr = "127.0.0.1";
  o.master_port = testing::FreeTestPort();
  o.init_timeout = milliseconds(600);
  const auto t0 = Clock::now();
  auto g = MakeGroup(o);
  const double took = SecondsSince(t0);
  REQUIRE_FALSE(g.ok());
  INFO(g.status().ToString() << " after " << took << " s");
  CHECK(took < 0.6 + 1.0);
  return g.status();
}

TEST_CASE("start-up has one deadline across rendezvous and communicator init") {
  SECTION("rank 0 whose peer never joins") {
    FakeDevice fake;
    const Status s = StartAlone(fake, "lonely", 0);
    CHECK(s.code() == StatusCode::kDeadlineExceeded);
    CHECK_THAT(s.message(), Contains("agent lonely rank 0 (nccl)") &&
                                Contains("did every rank of the agent start?"));
    CHECK(fake.WaitAbortsFinished(1, std::chrono::seconds(5)));
  }
  SECTION("rank 1 whose rank 0 never serves the rendezvous") {
    FakeDevice two(2);
    const Status s = StartAlone(two, "orphan", 1);
    CHECK_THAT(s.message(), Contains("orphan"));
  }
}

TEST_CASE("ShardedAdam on a device group works on the group's device, not the thread's") {
  // The group's rank uses GPU 1; the calling thread has GPU 0 current. The
  // fake refuses a stream of GPU 1 used while GPU 0 is current, as CUDA does.
  FakeDevice fake(2);
  GroupOptions o = DeviceOptions(fake, "adam-dev");
  o.local_rank = 1;
  auto g = MustMake(o);
  CHECK(g->device_binding().device == 1);
  REQUIRE(fake.SetDevice(0).ok());
  auto host = MakeSingleRankGroup("adam-host");
  const size_t n = 1000;
  AdamWOptions ao;
  ao.lr = 1e-2f;
  ao.max_grad_norm = 1.0f;
  ShardedAdam dev(*g, n, ao);
  ShardedAdam cpu(*host, n, ao);
  std::vector<float> p(n);
  std::vector<float> grad(n);
  for (size_t i = 0; i < n; ++i) {
    p[i] = 0.001f * static_cast<float>(i);
    grad[i] = 0.01f * static_cast<float>(i % 7) - 0.03f;
  }
  REQUIRE(fake.SetDevice(1).ok());
  FakeBuffer dp(fake, n);
  FakeBuffer dg(fake, n);
  REQUIRE(fake.SetDevice(0).ok());
  std::memcpy(dp.ptr, p.data(), n * sizeof(float));
  std::memcpy(dg.ptr, grad.data(), n * sizeof(float));
  for (int step = 0; step < 3; ++step) {
    float dev_norm = 0;
    float cpu_norm = 0;
    const Status s = dev.Step(dp.ptr, dg.ptr, &dev_norm);
    REQUIRE(s.ok());
    REQUIRE(cpu.Step(p.data(), grad.data(), &cpu_norm).ok());
    CHECK(dev_norm == Approx(cpu_norm).epsilon(1e-6));
  }
  CHECK(fake.CurrentDevice().value() == 0);  // the thread's own device is left as it was
  for (size_t i = 0; i < n; ++i) REQUIRE(dp.ptr[i] == Approx(p[i]).epsilon(1e-6));
  const std::vector<uint8_t> saved = dev.SaveState();
  REQUIRE_FALSE(saved.empty());
  ShardedAdam restored(*g, n, ao);
  REQUIRE(restored.LoadState(saved).ok());
  CHECK(restored.SaveState() == saved);

  // A checkpoint stages the moments from the group's device on a side stream
  // of that device (the fake refuses a stream used on another device).
  testing::TempDir dir;
  auto ck = Checkpointer::Create({.dir = dir.path, .agent = "adam-dev", .interval_s = 0});
  REQUIRE(ck.ok());
  CheckpointState state;
  dev.AddTo(state, "adam.");
  CHECK(state.entries()[0].device_data != nullptr);
  REQUIRE((*ck)->Save(3, state).ok());
  CHECK(fake.CurrentDevice().value() == 0);
  auto r = (*ck)->Restore();
  REQUIRE(r.ok());
  REQUIRE(r->restored());
  ShardedAdam loaded(*g, n, ao);
  REQUIRE(loaded.LoadFrom(*r->saved, "adam.").ok());
  CHECK(loaded.SaveState() == saved);
}

}  // namespace
}  // namespace agentrt
