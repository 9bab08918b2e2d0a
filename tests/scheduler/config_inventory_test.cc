#include <unistd.h>

#include <catch2/catch.hpp>
#include <string>

#include "agent_runtime/device_api.h"
#include "scheduler/inventory.h"
#include "tests/agent_runtime/fake_device.h"

namespace agentrt {
namespace {

using Catch::Matchers::Contains;

// Captured from `scontrol show node -o` (Slurm 22.05/23.02), lightly trimmed.
const char* kScontrol =
    "NodeName=gpu01 Arch=x86_64 CoresPerSocket=32 CPUAlloc=0 CPUEfctv=64 CPUTot=64 CPULoad=0.01 "
    "AvailableFeatures=h100 ActiveFeatures=h100 Gres=gpu:h100:8(S:0-1) NodeAddr=gpu01 "
    "NodeHostName=gpu01 "
    "Version=23.02.6 OS=Linux 5.15.0-91-generic #101-Ubuntu SMP Tue Nov 14 13:30:08 UTC 2023 "
    "RealMemory=1031000 "
    "AllocMem=0 FreeMem=1000000 Sockets=2 Boards=1 State=IDLE ThreadsPerCore=1 TmpDisk=0 Weight=1 "
    "Owner=N/A "
    "MCS_label=N/A Partitions=gpu,all BootTime=2024-01-10T09:00:00 "
    "SlurmdStartTime=2024-01-10T09:05:00 "
    "LastBusyTime=2024-01-12T10:00:00 CfgTRES=cpu=64,mem=1031000M,billing=64,gres/gpu=8 AllocTRES= "
    "CapWatts=n/a "
    "CurrentWatts=0 AveWatts=0 ExtSensorsJoules=n/s ExtSensorsWatts=0 ExtSensorsTemp=n/s\n"
    "NodeName=gpu02 Arch=x86_64 CoresPerSocket=32 CPUAlloc=16 CPUTot=64 Gres=gpu:8 NodeAddr=gpu02 "
    "State=MIXED ThreadsPerCore=1 Partitions=gpu\n"
    "NodeName=gpu03 CPUAlloc=0 CPUTot=64 Gres=gpu:h100:8(S:0-1) State=IDLE+DRAIN Partitions=gpu "
    "Reason=bad nvlink [root@2024-01-11T08:00:00]\n"
    "NodeName=gpu04 CPUAlloc=0 CPUTot=64 Gres=gpu:a100:4(S:0),gpu:v100:2(S:1) State=DOWN* "
    "Partitions=gpu\n"
    "\n"
    "NodeName=cpu01 CPUAlloc=0 CPUTot=128 Gres=(null) State=IDLE Partitions=cpu,all\n"
    "NodeName=gpu05 CPUAlloc=64 CPUTot=64 Gres=gpu:h100:8 State=ALLOCATED Partitions=gpu\n";

TEST_CASE("scontrol show node -o output is parsed: GPUs, CPUs, states, partitions") {
  Result<std::vector<SlurmNode>> nodes = ParseScontrolNodes(kScontrol);
  REQUIRE(nodes.ok());
  REQUIRE(nodes->size() == 6);
  const SlurmNode& g1 = (*nodes)[0];
  CHECK(g1.spec.name == "gpu01");
  CHECK(g1.spec.gpus == 8);
  CHECK(g1.spec.cpus == 64);
  CHECK(g1.state == "IDLE");
  CHECK(g1.usable);
  CHECK(g1.partitions == std::vector<std::string>{"gpu", "all"});
  CHECK(g1.spec.nvlink_domains.size() == 1);
  CHECK(g1.spec.addr == "gpu01");            // NodeAddr: how the other nodes reach it
  CHECK((*nodes)[2].spec.addr.empty());      // none given: by name
  CHECK(g1.spec.gpu_type == "h100");         // gpu:h100:8(S:0-1)
  CHECK((*nodes)[1].spec.gpu_type.empty());  // gpu:8: untyped
  CHECK((*nodes)[1].spec.gpus == 8);
  CHECK((*nodes)[1].cpus_allocated == 16);
  CHECK((*nodes)[1].usable);  // MIXED can take more jobs
  CHECK((*nodes)[2].state == "IDLE+DRAIN");
  CHECK_FALSE((*nodes)[2].usable);
  CHECK((*nodes)[3].spec.gpus == 6);  // two gres entries
  CHECK_FALSE((*nodes)[3].usable);    // DOWN*, not responding
  CHECK((*nodes)[4].spec.gpus == 0);  // Gres=(null)
  CHECK((*nodes)[4].spec.nvlink_domains.empty());
  CHECK((*nodes)[5].usable);  // ALLOCATED: busy, but queueable
}

TEST_CASE("the SLURM inventory keeps usable nodes of the partition") {
  std::vector<SlurmNode> nodes = *ParseScontrolNodes(kScontrol);
  Inventory gpu = InventoryFromSlurm(nodes, "gpu");
  REQUIRE(gpu.nodes.size() == 3);
  CHECK(gpu.nodes[0].name == "gpu01");
  CHECK(gpu.nodes[1].name == "gpu02");
  CHECK(gpu.nodes[2].name == "gpu05");
  CHECK_FALSE(gpu.oversubscribe_cpus);
  CHECK(gpu.source == "slurm partition gpu");
  CHECK(InventoryFromSlurm(nodes, "").nodes.size() == 4);
  CHECK(InventoryFromSlurm(nodes, "cpu").nodes.size() == 1);
}

TEST_CASE("gres strings give GPU counts") {
  CHECK(GpusFromGres("gpu:8") == 8);
  CHECK(GpusFromGres("gpu:h100:8(S:0-1)") == 8);
  CHECK(GpusFromGres("gpu:h100:4(S:0-1,3),nic:2") == 4);
  CHECK(GpusFromGres("(null)") == 0);
  CHECK(GpusFromGres("gpumem:80G") == 0);
  CHECK(GpusFromGres("") == 0);
}

TEST_CASE("text that is not scontrol output is rejected") {
  CHECK_THAT(ParseScontrolNodes("hello\n").status().message(), Contains("line 1: no NodeName="));
  CHECK(ParseScontrolNodes("").ok());
}

TEST_CASE("the local machine is one node that allows CPU oversubscription") {
  Result<LocalMachine> detected = DetectLocalMachine();
  REQUIRE(detected.ok());
  LocalMachine m = *detected;
  CHECK_FALSE(m.hostname.empty());
  CHECK(m.cpus == static_cast<int>(::sysconf(_SC_NPROCESSORS_ONLN)));
  // Without a GPU (this build machine) the node has none and one empty domain list.
  if (m.gpus == 0) CHECK(m.nvlink_domains.empty());
  Inventory inv = LocalInventory(m);
  REQUIRE(inv.nodes.size() == 1);
  CHECK(inv.nodes[0].name == m.hostname);
  CHECK(inv.nodes[0].cpus == m.cpus);
  CHECK(inv.oversubscribe_cpus);
  LocalMachine gpus{"box", 32, 4, {}};
  Inventory with_gpus = LocalInventory(gpus);
  CHECK(with_gpus.nodes[0].nvlink_domains == std::vector<std::vector<int>>{{0, 1, 2, 3}});
}

}  // namespace
}  // namespace agentrt

namespace agentrt {
namespace {

TEST_CASE("the local inventory reports 0 GPUs only when there is no NVIDIA driver") {
  testing::FakeDevice fake(4);
  LocalMachine m;
  // No driver: no GPU, whatever else is (not) installed.
  REQUIRE(DetectLocalGpus(false, Result<device::Api*>(FailedPrecondition("not loaded")), m).ok());
  CHECK(m.gpus == 0);
  // A driver, and GPU support that works: the GPUs and their peer groups.
  REQUIRE(DetectLocalGpus(true, Result<device::Api*>(&fake), m).ok());
  CHECK(m.gpus == 4);
  CHECK(m.nvlink_domains == std::vector<std::vector<int>>{{0, 1}, {2, 3}});
  // A driver but no usable GPU support: an error naming what is missing, never 0.
  Status missing = DetectLocalGpus(
      true,
      Result<device::Api*>(FailedPrecondition("libnccl.so.2: cannot open shared object file")), m);
  CHECK_FALSE(missing.ok());
  CHECK_THAT(missing.message(), Contains("has an NVIDIA driver") && Contains("libnccl.so.2"));
  // A driver whose CUDA call fails (an old driver): that error, with CUDA's text.
  fake.SetDeviceCount(Internal("cudaErrorInsufficientDriver: CUDA driver version is insufficient"));
  Status old = DetectLocalGpus(true, Result<device::Api*>(&fake), m);
  CHECK_FALSE(old.ok());
  CHECK_THAT(old.message(), Contains("counting its GPUs failed") && Contains("insufficient"));
  // A driver that reports no device (CUDA_VISIBLE_DEVICES=""): 0 GPUs.
  fake.SetDeviceCount(0);
  REQUIRE(DetectLocalGpus(true, Result<device::Api*>(&fake), m).ok());
  CHECK(m.gpus == 0);
}

}  // namespace
}  // namespace agentrt
