// The C API of weight streams (comms/weight_stream.h): agentrt_weights_*.
#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "capi/c_api_internal.h"
#include "comms/weight_stream.h"

using namespace agentrt::capi;  // NOLINT(google-build-using-namespace): the C API's helpers

// One version as read: its set (a mapping of the broker's file, or its bytes).
struct agentrt_weights {
  std::shared_ptr<const agentrt::WeightSet> set;
};

namespace {

// tensors_json (a list of {"name", "dtype", "shape"}) with data[i] and bytes[i]
// (InvalidArgument naming a NULL one).
agentrt::Result<std::vector<agentrt::WeightTensor>> Tensors(const char* tensors_json,
                                                            const void* const* data,
                                                            const size_t* bytes, size_t n) {
  const char* null = tensors_json == nullptr     ? "tensors_json"
                     : n > 0 && data == nullptr  ? "data"
                     : n > 0 && bytes == nullptr ? "bytes"
                                                 : nullptr;
  if (null != nullptr) return agentrt::InvalidArgument(std::string(null) + " is NULL");
  nlohmann::json list;
  AGENTRT_RETURN_IF_ERROR(agentrt::capi::ParseJsonArg(tensors_json, "tensors_json", &list));
  if (!list.is_array() || list.size() != n)
    return agentrt::InvalidArgument("tensors_json must be a list of " + std::to_string(n) +
                                    " tensors ({\"name\", \"dtype\", \"shape\"})");
  std::vector<agentrt::WeightTensor> tensors;
  tensors.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    const nlohmann::json& t = list[i];
    agentrt::WeightTensor w;
    if (!t.is_object() || !t.contains("name") || !t["name"].is_string())
      return agentrt::InvalidArgument("tensors_json[" + std::to_string(i) + "] has no name");
    w.name = t["name"].get<std::string>();
    w.dtype = t.contains("dtype") && t["dtype"].is_string() ? t["dtype"].get<std::string>()
                                                            : std::string("uint8");
    if (t.contains("shape") && t["shape"].is_array()) {
      for (const auto& d : t["shape"]) {
        if (!d.is_number_integer())
          return agentrt::InvalidArgument("tensors_json[" + std::to_string(i) +
                                          "].shape holds a non-integer");
        w.shape.push_back(d.get<int64_t>());
      }
    }
    w.data = data[i];
    w.bytes = bytes[i];
    tensors.push_back(std::move(w));
  }
  return tensors;
}

// The handle's kept stream `name` (its delta state) when it has one, of
// `incarnation` when given; else one for this call.
std::shared_ptr<agentrt::WeightStream> StreamFor(agentrt_bus* bus, const char* name,
                                                 std::optional<int64_t> incarnation) {
  std::shared_ptr<agentrt::WeightStream> kept =
      agentrt::capi::FindWeightStream(bus, name, incarnation);
  if (kept != nullptr) return kept;
  return std::make_shared<agentrt::WeightStream>(*BusClientOf(bus), name, incarnation.value_or(0));
}

}  // namespace

extern "C" {

int agentrt_weights_publish(agentrt_bus* bus, const char* stream, const char* tensors_json,
                            const void* const* data, const size_t* bytes, size_t n, int64_t step,
                            int64_t incarnation, int64_t* version) {
  AGENTRT_C_REQUIRE(bus, "bus");
  AGENTRT_C_REQUIRE(stream, "stream");
  return Guard("agentrt_weights_publish", [&] {
    auto tensors = Tensors(tensors_json, data, bytes, n);
    if (!tensors.ok()) return Fail(tensors.status());
    auto v = StreamFor(bus, stream, incarnation)->Publish(*tensors, step);
    if (!v.ok()) return Fail(v.status());
    if (version != nullptr) *version = *v;
    return Ok();
  });
}

int agentrt_weights_publish_async(agentrt_bus* bus, const char* stream, const char* tensors_json,
                                  const void* const* data, const size_t* bytes, size_t n,
                                  int64_t step, int64_t incarnation) {
  AGENTRT_C_REQUIRE(bus, "bus");
  AGENTRT_C_REQUIRE(stream, "stream");
  return Guard("agentrt_weights_publish_async", [&] {
    auto tensors = Tensors(tensors_json, data, bytes, n);
    if (!tensors.ok()) return Fail(tensors.status());
    auto ws = AsyncWeightStreamOf(bus, stream, incarnation);
    if (!ws.ok()) return Fail(ws.status());
    const Status s = (*ws)->PublishAsync(*tensors, step);
    return s.ok() ? Ok() : Fail(s);
  });
}

int agentrt_weights_publish_device(agentrt_bus* bus, const char* stream, const char* tensors_json,
                                   const void* const* data, const size_t* bytes, size_t n,
                                   int64_t step, int64_t incarnation, int device, void* cuda_stream,
                                   int64_t* version) {
  AGENTRT_C_REQUIRE(bus, "bus");
  AGENTRT_C_REQUIRE(stream, "stream");
  return Guard("agentrt_weights_publish_device", [&] {
    auto tensors = Tensors(tensors_json, data, bytes, n);
    if (!tensors.ok()) return Fail(tensors.status());
    std::vector<agentrt::DeviceWeightTensor> on_device;
    on_device.reserve(tensors->size());
    for (const agentrt::WeightTensor& t : *tensors)
      on_device.push_back({t.name, t.dtype, t.shape, t.data, t.bytes});
    auto handle = agentrt::capi::DeviceWeightStreamOf(bus, stream, incarnation, device);
    if (!handle.ok()) return Fail(handle.status());
    std::lock_guard<std::mutex> lock((*handle)->mu);
    auto v = (*handle)->gpu->Publish(on_device, step, agentrt::kWeightsPublishTimeout, cuda_stream);
    if (!v.ok()) return Fail(v.status());
    if (version != nullptr) *version = *v;
    return Ok();
  });
}

int agentrt_weights_read_device(agentrt_bus* bus, const char* stream, int64_t version,
                                const char* names_json, void* const* data, const size_t* bytes,
                                size_t n, int device, void* cuda_stream, int timeout_ms,
                                int64_t* version_out) {
  AGENTRT_C_REQUIRE(bus, "bus");
  AGENTRT_C_REQUIRE(stream, "stream");
  AGENTRT_C_REQUIRE(names_json, "names_json");
  return Guard("agentrt_weights_read_device", [&] {
    if (n > 0 && (data == nullptr || bytes == nullptr))
      return Fail(agentrt::InvalidArgument(data == nullptr ? "data is NULL" : "bytes is NULL"));
    nlohmann::json names;
    if (Status s = agentrt::capi::ParseJsonArg(names_json, "names_json", &names); !s.ok())
      return Fail(s);
    if (!names.is_array() || names.size() != n)
      return Fail(agentrt::InvalidArgument("names_json must be a list of " + std::to_string(n) +
                                           " tensor names"));
    std::vector<agentrt::DeviceWeightTarget> targets;
    targets.reserve(n);
    for (size_t i = 0; i < n; ++i) {
      // A name, or {"name", "dtype", "shape"} (then checked against the version's).
      const nlohmann::json& t = names[i];
      agentrt::DeviceWeightTarget target{"", data[i], bytes[i], "", {}};
      if (t.is_string()) {
        target.name = t.get<std::string>();
      } else if (t.is_object() && t.contains("name") && t["name"].is_string() &&
                 t.contains("dtype") && t["dtype"].is_string() && t.contains("shape") &&
                 t["shape"].is_array()) {
        target.name = t["name"].get<std::string>();
        target.dtype = t["dtype"].get<std::string>();
        for (const auto& d : t["shape"]) {
          if (!d.is_number_integer())
            return Fail(agentrt::InvalidArgument("names_json[" + std::to_string(i) +
                                                 "].shape holds a non-integer"));
          target.shape.push_back(d.get<int64_t>());
        }
      } else {
        return Fail(
            agentrt::InvalidArgument("names_json[" + std::to_string(i) +
                                     "] is neither a name nor {\"name\", \"dtype\", \"shape\"}"));
      }
      targets.push_back(std::move(target));
    }
    auto handle = agentrt::capi::DeviceWeightStreamOf(bus, stream, std::nullopt, device);
    if (!handle.ok()) return Fail(handle.status());
    std::lock_guard<std::mutex> lock((*handle)->mu);
    auto v = (*handle)->gpu->ReadInto(
        version, targets, std::chrono::milliseconds(timeout_ms < 0 ? 0 : timeout_ms), cuda_stream);
    if (!v.ok()) return Fail(v.status());
    if (version_out != nullptr) *version_out = *v;
    return Ok();
  });
}

int agentrt_weights_flush(agentrt_bus* bus, const char* stream, int64_t incarnation, int timeout_ms,
                          int64_t* version) {
  AGENTRT_C_REQUIRE(bus, "bus");
  AGENTRT_C_REQUIRE(stream, "stream");
  return Guard("agentrt_weights_flush", [&] {
    auto ws = AsyncWeightStreamOf(bus, stream, incarnation);
    if (!ws.ok()) return Fail(ws.status());
    auto v = (*ws)->Flush(std::chrono::milliseconds(timeout_ms < 0 ? 0 : timeout_ms));
    if (!v.ok()) return Fail(v.status());
    if (version != nullptr) *version = *v;
    return Ok();
  });
}

int agentrt_weights_open(agentrt_bus* bus, const char* stream, int64_t incarnation, int delta) {
  AGENTRT_C_REQUIRE(bus, "bus");
  AGENTRT_C_REQUIRE(stream, "stream");
  return Guard("agentrt_weights_open", [&] {
    const agentrt::WeightStreamOptions options{.delta = delta != 0};
    auto ws = AsyncWeightStreamOf(bus, stream, incarnation, &options);
    return ws.ok() ? Ok() : Fail(ws.status());
  });
}

int agentrt_weights_stats(agentrt_bus* bus, const char* stream, char** json_out) {
  AGENTRT_C_REQUIRE(bus, "bus");
  AGENTRT_C_REQUIRE(stream, "stream");
  return Guard("agentrt_weights_stats", [&] {
    const std::shared_ptr<agentrt::WeightStream> ws = agentrt::capi::FindWeightStream(bus, stream);
    const agentrt::WeightStreamStats s = ws != nullptr ? ws->stats() : agentrt::WeightStreamStats{};
    return JsonOut({{"deltas_published", s.deltas_published},
                    {"delta_bytes_published", s.delta_bytes_published},
                    {"deltas_not_published", s.deltas_not_published},
                    {"versions_from_delta", s.versions_from_delta},
                    {"delta_bytes_read", s.delta_bytes_read},
                    {"delta_mismatches", s.delta_mismatches},
                    {"whole_bytes_read", s.whole_bytes_read},
                    {"versions_from_node_cache", s.versions_from_node_cache}},
                   json_out);
  });
}

int agentrt_weights_close(agentrt_bus* bus, const char* stream, int64_t incarnation, int timeout_ms,
                          int64_t* version) {
  AGENTRT_C_REQUIRE(bus, "bus");
  AGENTRT_C_REQUIRE(stream, "stream");
  return Guard("agentrt_weights_close", [&] {
    auto v = agentrt::capi::CloseAsyncWeightStream(
        bus, stream, incarnation, std::chrono::milliseconds(timeout_ms < 0 ? 0 : timeout_ms));
    if (!v.ok()) return Fail(v.status());
    if (version != nullptr) *version = *v;
    return Ok();
  });
}

int agentrt_weights_get(agentrt_bus* bus, const char* stream, int mode, int64_t version,
                        int timeout_ms, agentrt_weights** out) {
  AGENTRT_C_REQUIRE(bus, "bus");
  AGENTRT_C_REQUIRE(stream, "stream");
  AGENTRT_C_REQUIRE(out, "out");
  *out = nullptr;
  return Guard("agentrt_weights_get", [&] {
    const std::shared_ptr<agentrt::WeightStream> kept = StreamFor(bus, stream, std::nullopt);
    agentrt::WeightStream& ws = *kept;
    const std::chrono::milliseconds timeout(timeout_ms < 0 ? 0 : timeout_ms);
    agentrt::Result<std::shared_ptr<const agentrt::WeightSet>> got = agentrt::InvalidArgument(
        "mode must be 0 (latest), 1 (newer than version) or 2 (exactly "
        "version), not " +
        std::to_string(mode));
    if (mode == 0) got = ws.Latest(timeout);
    if (mode == 1) got = ws.WaitNewer(version, timeout);
    if (mode == 2) got = ws.At(version, timeout);
    if (!got.ok()) return Fail(got.status());
    *out = new agentrt_weights{std::move(got).value()};
    return Ok();
  });
}

int agentrt_weights_info(const agentrt_weights* w, char** json_out) {
  AGENTRT_C_REQUIRE(w, "weights");
  return Guard("agentrt_weights_info", [&] {
    const agentrt::WeightSet& s = *w->set;
    nlohmann::json tensors = nlohmann::json::array();
    for (const auto& e : s.entries()) {
      tensors.push_back({{"name", e.name},
                         {"dtype", e.dtype},
                         {"shape", e.shape},
                         {"offset", e.offset},
                         {"bytes", e.bytes}});
    }
    return JsonOut({{"version", s.version()},
                    {"stream", s.stream()},
                    {"agent", s.agent()},
                    {"step", s.step()},
                    {"incarnation", s.incarnation()},
                    {"mapped", s.mapped()},
                    {"path", s.path()},
                    {"size", s.payload_size()},
                    {"tensors", std::move(tensors)}},
                   json_out);
  });
}

int agentrt_weights_data(const agentrt_weights* w, const void** data, size_t* size) {
  AGENTRT_C_REQUIRE(w, "weights");
  AGENTRT_C_REQUIRE(data, "data");
  AGENTRT_C_REQUIRE(size, "size");
  *data = w->set->payload();
  *size = w->set->payload_size();
  return Ok();
}

void agentrt_weights_free(agentrt_weights* w) { delete w; }

}  // extern "C"
