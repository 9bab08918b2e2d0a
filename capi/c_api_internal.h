// What every capi/*.cc shares: the thread's last error, the translation of a
// Status to a C code, and the guard that keeps exceptions from crossing the C
// boundary. Not installed.
#pragma once

#include <cstring>
#include <exception>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "agent_runtime/device_weights.h"
#include "agent_runtime/runtime.h"
#include "capi/agentrt_c.h"
#include "common/status.h"
#include "comms/bus_client.h"
#include "comms/weight_stream.h"

// The runtime handle (runtime_c.cc makes it; bus_c.cc borrows its bus).
struct agentrt_runtime {
  std::unique_ptr<agentrt::Runtime> rt;
};

namespace agentrt::capi {

// Records `s` as the calling thread's last error; its C code.
int Fail(const Status& s);
// Clears the thread's last error; AGENTRT_OK.
int Ok();
// agentrt::StatusCode -> enum agentrt_code (gRPC's numbering).
int CodeOf(StatusCode code);

// A malloc'd copy of `s` for a char** out-parameter (freed with agentrt_free).
char* CopyOut(const std::string& s);
inline int JsonOut(const nlohmann::json& j, char** out) {
  if (out == nullptr) return Fail(InvalidArgument("the output pointer is NULL"));
  *out = CopyOut(j.dump());
  return Ok();
}

// Runs `body` (returning a C code); an exception becomes AGENTRT_INTERNAL
// with its message instead of unwinding into C.
template <typename F>
int Guard(const char* what, F&& body) {
  try {
    return body();
  } catch (const std::exception& e) {
    return Fail(Internal(std::string(what) + ": " + e.what()));
  } catch (...) {
    return Fail(Internal(std::string(what) + ": unknown exception"));
  }
}

// InvalidArgument naming `what` when `p` is NULL.
#define AGENTRT_C_REQUIRE(p, what) \
  if ((p) == nullptr)              \
  return ::agentrt::capi::Fail(::agentrt::InvalidArgument(std::string(what) + " is NULL"))

// The client behind a bus handle (bus_c.cc owns the handle's layout).
BusClient* BusClientOf(agentrt_bus* bus);
// The handle's stream `name`, made on first use with `incarnation` and
// `options` and kept (its version in flight, next slot, delta state) until
// the handle is closed. Another incarnation, or other options when given,
// for the same name is refused.
Result<std::shared_ptr<WeightStream>> AsyncWeightStreamOf(
    agentrt_bus* bus, const std::string& name, int64_t incarnation,
    const WeightStreamOptions* options = nullptr);
// The handle's stream `name` if it has one that serves `incarnation` (any
// when none is given: a reader's) (nullptr: none).
std::shared_ptr<WeightStream> FindWeightStream(agentrt_bus* bus, const std::string& name,
                                               std::optional<int64_t> incarnation = std::nullopt);
// Flushes that stream (as WeightStream::Flush) and, if it is stored, lets
// go of it and of the device stream of that name (its GPU memory, once no
// call uses it); the version's number (0: none was published).
Result<int64_t> CloseAsyncWeightStream(agentrt_bus* bus, const std::string& name,
                                       int64_t incarnation, std::chrono::milliseconds timeout);

// A stream of GPU tensors the handle keeps (agentrt_weights_*_device): its
// host stream (the name's kept stream when agentrt_weights_open made one
// first, with its delta versions) and the device side over it, used by one
// call at a time.
struct DeviceWeightStreamHandle {
  std::mutex mu;
  int device = 0;
  std::shared_ptr<WeightStream> host;
  std::unique_ptr<DeviceWeightStream> gpu;  // ended before `host`
  bool published = false;  // a publisher's call took it (guarded by the bus's streams_mu)
  ~DeviceWeightStreamHandle() { gpu.reset(); }
};
// The handle's device stream `name`, made on first use for CUDA device
// `device` and `incarnation` (a reader's: none) over the name's kept stream
// when that serves the call (FindWeightStream), else over a plain one (of
// `incarnation`, 0 for a reader's) (UNAVAILABLE without a driver or
// agentrt's GPU library); another device, or another incarnation when
// given, for the same name is refused, unless the stream only read so far:
// it is then made anew for that incarnation, as it is over a kept stream
// opened since. A publisher's call (an incarnation given) marks it
// published, under the handle's lock: no later call remakes it.
Result<std::shared_ptr<DeviceWeightStreamHandle>> DeviceWeightStreamOf(
    agentrt_bus* bus, const std::string& name, std::optional<int64_t> incarnation, int device);

// Parses a JSON argument; InvalidArgument naming `what` when it is not JSON.
Status ParseJsonArg(const char* text, const char* what, nlohmann::json* out);

}  // namespace agentrt::capi

// The C functions are global; they name these unqualified.
using agentrt::Status;
using agentrt::capi::Fail;
using agentrt::capi::Guard;
using agentrt::capi::JsonOut;
using agentrt::capi::Ok;
