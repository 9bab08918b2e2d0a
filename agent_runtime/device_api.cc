#include "agent_runtime/device_api.h"

#include <dlfcn.h>

#include <filesystem>
#include <mutex>
#include <vector>

namespace agentrt::device {
namespace {

// The entry point libagentrt_cuda.so exports (agent_runtime/cuda/cuda_api.cc).
constexpr const char* kEntry = "agentrt_device_api_v3";  // v3: CUDA IPC
constexpr const char* kLibrary = "libagentrt_cuda.so";

// The folder of the file (program or shared library) that holds this code.
std::filesystem::path HomeFolder() {
  Dl_info info{};
  if (::dladdr(reinterpret_cast<void*>(&HomeFolder), &info) == 0 || info.dli_fname == nullptr)
    return {};
  std::error_code ec;
  std::filesystem::path self = std::filesystem::canonical(info.dli_fname, ec);
  return ec ? std::filesystem::path(info.dli_fname).parent_path() : self.parent_path();
}

Result<Api*> Load() {
  std::vector<std::string> candidates;
  const std::filesystem::path home = HomeFolder();
  if (!home.empty()) {
    for (const std::filesystem::path& dir : {home, home.parent_path() / "lib"}) {
      std::error_code ec;
      if (std::filesystem::exists(dir / kLibrary, ec)) candidates.push_back(dir / kLibrary);
    }
  }
  candidates.emplace_back(kLibrary);  // LD_LIBRARY_PATH, RPATH, ld.so.cache
  std::string errors;
  for (const std::string& path : candidates) {
    void* handle = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle == nullptr) {
      const char* e = ::dlerror();
      errors += std::string(errors.empty() ? "" : "; ") + (e != nullptr ? e : path);
      // A library that is there but cannot load (libnccl.so.2 or
      // libcudart.so.13 missing) is the answer: the bare name finds no other.
      if (path != kLibrary) break;
      continue;
    }
    auto* entry = reinterpret_cast<Api* (*)()>(::dlsym(handle, kEntry));
    if (entry == nullptr) {
      return FailedPrecondition(path + " has no " + kEntry +
                                "; it is from another agentrt version: rebuild agentrt");
    }
    return entry();  // the library stays loaded for the life of the process
  }
#if defined(AGENTRT_BUILT_WITH_CUDA)
  return FailedPrecondition(
      "agentrt's GPU support (" + std::string(kLibrary) + ") cannot be loaded: " + errors +
      ". It needs NCCL (libnccl.so.2) and the CUDA runtime (libcudart.so.13): install them or "
      "put their folder on LD_LIBRARY_PATH");
#else
  return FailedPrecondition("agentrt was built without CUDA and NCCL, so it has no GPU support (" +
                            errors + "); rebuild where /usr/local/cuda has nvcc and NCCL");
#endif
}

}  // namespace

bool DriverPresent() {
  // A driver does not come or go while a process runs: asked once. The handle
  // stays open; the device API loads the same library anyway.
  static const bool present = ::dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL) != nullptr;
  return present;
}

Result<Api*> LoadDeviceApi() {
  static std::once_flag once;
  static Result<Api*> loaded = Internal("device api not loaded");
  std::call_once(once, [] { loaded = Load(); });
  return loaded;
}

DeviceGuard::DeviceGuard(Api* api, int device) : api_(api) {
  Result<int> current = api_->CurrentDevice();
  if (!current.ok()) {
    status_ = current.status();
    return;
  }
  previous_ = *current;
  changed_ = previous_ != device;
  if (changed_) status_ = api_->SetDevice(device);
}

DeviceGuard::~DeviceGuard() {
  // Best effort: a destructor has no caller to tell that the device could not be put back.
  if (status_.ok() && changed_) api_->SetDevice(previous_).IgnoreError();
}

}  // namespace agentrt::device
