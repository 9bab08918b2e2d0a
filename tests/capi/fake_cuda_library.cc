// A stand-in for libagentrt_cuda.so over the fake device
// (tests/agent_runtime/fake_device.h), so that the C API's GPU calls run on a
// machine without a GPU: a process that loads libagentrt_c.so from a folder
// holding this library, with fake_libcuda.c's libcuda.so.1 on its library
// path (the driver agentrt looks for first), gets this device as its
// device::Api. Its "device memory" is host memory, which the test fills and
// reads through agentrt_fake_device_malloc; the test also reads its counts of
// IPC opens and of copies. Used by weights_test.py's scenario "device".
#include "tests/agent_runtime/fake_device.h"

namespace {
agentrt::testing::FakeDevice& Device() {
  // Never destroyed: the C API's threads may use it until the process ends.
  static auto* device = new agentrt::testing::FakeDevice(1);
  return *device;
}
}  // namespace

// The entry agent_runtime/device_api.cc looks up (its kEntry).
extern "C" __attribute__((visibility("default"))) agentrt::device::Api* agentrt_device_api_v3() {
  return &Device();
}

// `bytes` of the fake device's memory (NULL if it cannot be had).
extern "C" __attribute__((visibility("default"))) void* agentrt_fake_device_malloc(size_t bytes) {
  agentrt::Result<void*> p = Device().Malloc(bytes);
  return p.ok() ? *p : nullptr;
}

// IPC mappings opened in all, and open now (agentrt closes each after its copy).
extern "C" __attribute__((visibility("default"))) int64_t agentrt_fake_device_ipc_opens() {
  return Device().ipc_opens();
}
extern "C" __attribute__((visibility("default"))) int64_t agentrt_fake_device_ipc_open_now() {
  return static_cast<int64_t>(Device().ipc_opened());
}

// Copies done, device to device and host to device.
extern "C" __attribute__((visibility("default"))) int64_t agentrt_fake_device_copies_d2d() {
  return Device().copies(agentrt::device::CopyKind::kDeviceToDevice);
}
extern "C" __attribute__((visibility("default"))) int64_t agentrt_fake_device_copies_h2d() {
  return Device().copies(agentrt::device::CopyKind::kHostToDevice);
}
