// A reader of a device weight stream in its own process, as a GPU agent on
// the publisher's node is (CUDA IPC is refused within one process), over
// the fake device: device_weights_test starts it.
//
//   device_weights_reader read <bus address> <run secret> <stream> <version> <tensor> <bytes>
//     reads the version into a device buffer of <bytes> and prints one line:
//     {"version", "by_ipc", "staged", "reason", "crc32c" (of the bytes read),
//     "ipc_opened" (mappings left open)}; exit 1 with the error on stderr.
//   device_weights_reader hold <pid> <fd> <slot>
//     takes slot <slot>'s read lock in a publisher's slot table, as a reader
//     copying from it does, prints "held" and waits to be killed.
#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

#include "agent_runtime/device_weights.h"
#include "common/crc32c.h"
#include "comms/auth.h"
#include "comms/bus_client.h"
#include "tests/agent_runtime/fake_device.h"

using namespace agentrt;

namespace {

int Read(char** argv) {
  auto bus = BusClient::Connect(argv[0], Credential{"sub", DeriveAgentToken(argv[1], "sub")});
  if (!bus.ok()) {
    std::cerr << bus.status().ToString() << "\n";
    return 1;
  }
  testing::FakeDevice api;
  if (std::getenv("DEVICE_WEIGHTS_FAIL_IPC") != nullptr) api.FailIpcOpen("injected by the test");
  const size_t bytes = std::stoul(argv[5]);
  int64_t version = 0;
  uint32_t crc = 0;
  DeviceWeightStats stats;
  std::string reason;
  {
    WeightStream stream(**bus, argv[2]);
    DeviceWeightStream gpu(stream, api, 0);
    void* target = *api.Malloc(bytes);
    auto got =
        gpu.ReadInto(std::stoll(argv[3]), {{argv[4], target, bytes}}, std::chrono::seconds(10));
    if (!got.ok()) {
      std::cerr << got.status().ToString() << "\n";
      return 1;
    }
    version = *got;
    std::vector<char> host(bytes);
    (void)api.CopyAsync(host.data(), target, bytes, device::CopyKind::kDeviceToHost, nullptr);
    (void)api.SynchronizeStream(nullptr);
    crc = Crc32c(host.data(), bytes);
    stats = gpu.stats();
    reason = gpu.last_staged_reason();
    api.Free(target);
  }
  std::cout << "{\"version\": " << version << ", \"by_ipc\": " << stats.versions_by_ipc
            << ", \"staged\": " << stats.versions_staged << ", \"crc32c\": " << crc
            << ", \"ipc_opened\": " << api.ipc_opened()
            << ", \"device_blocks\": " << api.device_blocks() << ", \"reason\": \"" << reason
            << "\"}" << std::endl;
  return 0;
}

int Hold(char** argv) {
  const std::string path = std::string("/proc/") + argv[0] + "/fd/" + argv[1];
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  struct flock fl {};
  fl.l_type = F_RDLCK;
  fl.l_whence = SEEK_SET;
  fl.l_start = kSlotLocksAt + std::stoi(argv[2]);
  fl.l_len = 1;
  if (fd < 0 || ::fcntl(fd, F_OFD_SETLK, &fl) != 0) {
    std::perror(path.c_str());
    return 1;
  }
  std::cout << "held" << std::endl;
  for (;;) ::pause();
}

}  // namespace

int main(int argc, char** argv) {
  const std::string role = argc > 1 ? argv[1] : "";
  if (role == "read" && argc == 8) return Read(argv + 2);
  if (role == "hold" && argc == 5) return Hold(argv + 2);
  std::cerr << "usage: device_weights_reader read ADDRESS SECRET STREAM VERSION TENSOR BYTES | "
               "hold PID FD SLOT\n";
  return 2;
}
