// The runtime and the checkpointer through the C API.
#include <chrono>
#include <map>
#include <memory>
#include <set>
#include <string>

#include "agent_runtime/checkpointer.h"
#include "agent_runtime/runtime.h"
#include "capi/c_api_internal.h"
#include "common/group_backend.h"

struct agentrt_checkpointer {
  agentrt::Checkpointer* ck = nullptr;
  std::unique_ptr<agentrt::Checkpointer> owned;  // null when borrowed from a runtime
};
struct agentrt_state {
  agentrt::CheckpointState state;
  std::set<std::string> names;
};
struct agentrt_restore {
  agentrt::RestoreResult result;
};

namespace {

// The devices this rank sees, as CUDA_VISIBLE_DEVICES names them: an index as
// a number, a UUID or MIG instance ("GPU-…", "MIG-…") as a string.
nlohmann::json VisibleDeviceJson(const agentrt::AgentEnv& e) {
  nlohmann::json out = nlohmann::json::array();
  for (const std::string& entry : agentrt::DeviceListEntries(e.cuda_visible_devices)) {
    const bool index = entry.find_first_not_of("0123456789") == std::string::npos;
    if (index) {
      out.push_back(std::stoi(entry));
    } else {
      out.push_back(entry);
    }
  }
  return out;
}

// Bytes of one element of the dtypes NumPy and PyTorch share; 0 if unknown.
size_t DtypeSize(const std::string& dtype) {
  static const std::map<std::string, size_t> kSizes = {
      {"bool", 1},    {"int8", 1},      {"uint8", 1},       {"int16", 2},
      {"uint16", 2},  {"float16", 2},   {"bfloat16", 2},    {"int32", 4},
      {"uint32", 4},  {"float32", 4},   {"int64", 8},       {"uint64", 8},
      {"float64", 8}, {"complex64", 8}, {"complex128", 16}, {"bytes", 1}};
  auto it = kSizes.find(dtype);
  return it == kSizes.end() ? 0 : it->second;
}

nlohmann::json RestoreJson(const agentrt::RestoreResult& r) {
  using Kind = agentrt::RestoreResult::Kind;
  nlohmann::json j = {{"kind", r.kind == Kind::kRestored ? "restored"
                               : r.kind == Kind::kFresh  ? "fresh"
                                                         : "corrupt"},
                      {"step", r.step},
                      {"time", r.time},
                      {"world_size", r.world_size},
                      {"path", r.saved ? r.saved->path() : std::string()},
                      {"metadata", r.metadata.is_null() ? nlohmann::json::object() : r.metadata},
                      {"describe", r.Describe()},
                      {"skipped", nlohmann::json::array()},
                      {"entries", nlohmann::json::array()}};
  for (const auto& s : r.skipped) {
    j["skipped"].push_back({{"step", s.step}, {"file", s.file}, {"reason", s.reason}});
  }
  for (const auto& e : r.shard.entries()) {
    j["entries"].push_back(
        {{"name", e.name}, {"dtype", e.dtype}, {"shape", e.shape}, {"bytes", e.bytes}});
  }
  j["arrays"] = nlohmann::json::array();
  for (const auto& a : r.saved ? r.saved->arrays() : std::vector<agentrt::SavedStep::Array>{}) {
    j["arrays"].push_back({{"name", a.name},
                           {"dtype", a.dtype},
                           {"shape", a.shape},
                           {"element_bytes", a.element_bytes}});
  }
  return j;
}

// The element size of `dtype`, or an error naming the entry and the dtypes there are.
agentrt::Result<size_t> ElementSize(const std::string& entry, const char* dtype) {
  const size_t element = DtypeSize(dtype);
  if (element == 0) {
    return agentrt::InvalidArgument(
        "entry '" + entry + "': unknown dtype '" + dtype +
        "' (bool, int8..int64, uint8..uint64, float16, bfloat16, float32, float64, "
        "complex64, complex128, bytes)");
  }
  return element;
}

}  // namespace

extern "C" {

int agentrt_runtime_open(int heartbeat_ms, int install_signal_handlers, agentrt_runtime** out) {
  AGENTRT_C_REQUIRE(out, "out");
  *out = nullptr;
  return Guard("agentrt_runtime_open", [&] {
    agentrt::RuntimeOptions options;
    if (heartbeat_ms > 0) options.heartbeat_period = std::chrono::milliseconds(heartbeat_ms);
    options.install_signal_handlers = install_signal_handlers != 0;
    auto rt = agentrt::Runtime::FromEnvironment(options);
    if (!rt.ok()) return Fail(rt.status());
    *out = new agentrt_runtime{std::move(rt).value()};
    return Ok();
  });
}

void agentrt_runtime_close(agentrt_runtime* rt) { delete rt; }

int agentrt_runtime_assignment(const agentrt_runtime* rt, char** json_out) {
  AGENTRT_C_REQUIRE(rt, "runtime");
  return Guard("agentrt_runtime_assignment", [&] {
    const agentrt::AgentEnv& e = rt->rt->env();
    const agentrt::AgentPlan& a = rt->rt->agent_plan();
    // The agents of this agent's view of the plan (PlanViews: itself, its
    // league opponents, the agents of its env), for agents that seat each other.
    nlohmann::json peers = nlohmann::json::array();
    for (const agentrt::AgentPlan& p : rt->rt->plan().agents) {
      peers.push_back({{"name", p.name},
                       {"index", p.index},
                       {"ranks", p.ranks},
                       {"gpus", p.gpus},
                       {"args", p.args}});
    }
    nlohmann::json j = {
        {"run", rt->rt->plan().run},
        {"run_dir", e.run_dir},
        {"agent", e.agent},
        {"agent_index", e.agent_index},
        {"rank", e.rank},
        {"world_size", e.world_size},
        {"local_rank", e.local_rank},
        {"local_world_size", e.local_world_size},
        {"master_addr", e.master_addr},
        {"master_port", e.master_port},
        {"ports", {e.ports_first, e.ports_last}},
        {"gpus", VisibleDeviceJson(e)},
        {"cuda_visible_devices", e.cuda_visible_devices},
        {"backend", std::string(agentrt::GroupBackendName(a.backend))},
        {"restart_count", e.restart_count},
        {"ckpt_dir", e.ckpt_dir},
        {"workdir", e.workdir},
        {"bus", e.bus},
        {"args", a.args},
        {"agents", peers},
        {"checkpoint",
         {{"interval_s", a.checkpoint.interval_s}, {"keep_last", a.checkpoint.keep_last}}}};
    return JsonOut(j, json_out);
  });
}

int agentrt_runtime_report(agentrt_runtime* rt, int64_t step, const char* metrics_json) {
  AGENTRT_C_REQUIRE(rt, "runtime");
  return Guard("agentrt_runtime_report", [&] {
    nlohmann::json metrics;
    if (Status s = agentrt::capi::ParseJsonArg(metrics_json, "metrics", &metrics); !s.ok())
      return Fail(s);
    if (metrics.is_null()) metrics = nlohmann::json::object();
    if (!metrics.is_object()) {
      return Fail(agentrt::InvalidArgument("metrics must be a JSON object of names to numbers"));
    }
    rt->rt->Report(step, metrics);
    return Ok();
  });
}

int agentrt_runtime_set_step(agentrt_runtime* rt, int64_t step) {
  AGENTRT_C_REQUIRE(rt, "runtime");
  rt->rt->SetStep(step);
  return Ok();
}

int agentrt_runtime_set_flops_per_sample(agentrt_runtime* rt, double flops) {
  AGENTRT_C_REQUIRE(rt, "runtime");
  if (!(flops >= 0)) return Fail(agentrt::InvalidArgument("flops per step must be 0 or more"));
  rt->rt->SetFlopsPerSample(flops);
  return Ok();
}

int agentrt_runtime_should_stop(const agentrt_runtime* rt, int* stop, char** reason_out) {
  AGENTRT_C_REQUIRE(rt, "runtime");
  AGENTRT_C_REQUIRE(stop, "stop");
  return Guard("agentrt_runtime_should_stop", [&] {
    *stop = rt->rt->ShouldStop() ? 1 : 0;
    if (reason_out != nullptr) *reason_out = agentrt::capi::CopyOut(rt->rt->stop_reason());
    return Ok();
  });
}

int agentrt_runtime_request_stop(agentrt_runtime* rt, const char* reason) {
  AGENTRT_C_REQUIRE(rt, "runtime");
  return Guard("agentrt_runtime_request_stop", [&] {
    rt->rt->RequestStop(reason != nullptr && *reason != '\0' ? reason : "requested");
    return Ok();
  });
}

int agentrt_runtime_counters(const agentrt_runtime* rt, char** json_out) {
  AGENTRT_C_REQUIRE(rt, "runtime");
  return Guard("agentrt_runtime_counters", [&] {
    return JsonOut({{"heartbeats_sent", rt->rt->heartbeats_sent()},
                    {"telemetry_sent", rt->rt->telemetry_sent()},
                    {"telemetry_dropped", rt->rt->telemetry_dropped()}},
                   json_out);
  });
}

int agentrt_runtime_checkpointer(agentrt_runtime* rt, agentrt_checkpointer** out) {
  AGENTRT_C_REQUIRE(rt, "runtime");
  AGENTRT_C_REQUIRE(out, "out");
  *out = new agentrt_checkpointer{&rt->rt->checkpointer(), nullptr};
  return Ok();
}

int agentrt_checkpointer_create(const char* dir, const char* agent, int rank, int world_size,
                                double interval_s, int keep_last, agentrt_checkpointer** out) {
  AGENTRT_C_REQUIRE(dir, "dir");
  AGENTRT_C_REQUIRE(out, "out");
  *out = nullptr;
  return Guard("agentrt_checkpointer_create", [&] {
    agentrt::CheckpointOptions o{.dir = dir,
                                 .agent = agent != nullptr ? agent : "agent",
                                 .rank = rank,
                                 .world_size = world_size,
                                 .interval_s = interval_s,
                                 .keep_last = keep_last};
    if (world_size < 1 || rank < 0 || rank >= world_size) {
      return Fail(agentrt::InvalidArgument("rank " + std::to_string(rank) +
                                           " is not within world_size " +
                                           std::to_string(world_size)));
    }
    if (keep_last < 1) return Fail(agentrt::InvalidArgument("keep_last must be >= 1"));
    auto ck = agentrt::Checkpointer::Create(o);
    if (!ck.ok()) return Fail(ck.status());
    auto* h = new agentrt_checkpointer{};
    h->owned = std::move(ck).value();
    h->ck = h->owned.get();
    *out = h;
    return Ok();
  });
}

void agentrt_checkpointer_close(agentrt_checkpointer* ck) {
  if (ck == nullptr) return;
  ck->ck->Wait().IgnoreError();  // a failed save was reported by agentrt_checkpointer_wait/save
  delete ck;
}

int agentrt_checkpointer_save_due(agentrt_checkpointer* ck, int* due) {
  AGENTRT_C_REQUIRE(ck, "checkpointer");
  AGENTRT_C_REQUIRE(due, "due");
  *due = ck->ck->SaveDue() ? 1 : 0;
  return Ok();
}

int agentrt_checkpointer_request_save(agentrt_checkpointer* ck) {
  AGENTRT_C_REQUIRE(ck, "checkpointer");
  ck->ck->RequestSave();
  return Ok();
}

int agentrt_checkpointer_save(agentrt_checkpointer* ck, int64_t step, const agentrt_state* state,
                              int async) {
  AGENTRT_C_REQUIRE(ck, "checkpointer");
  AGENTRT_C_REQUIRE(state, "state");
  return Guard("agentrt_checkpointer_save", [&] {
    if (step < 0) return Fail(agentrt::InvalidArgument("step must be >= 0"));
    const Status s =
        async != 0 ? ck->ck->SaveAsync(step, state->state) : ck->ck->Save(step, state->state);
    return s.ok() ? Ok() : Fail(s);
  });
}

int agentrt_checkpointer_wait(agentrt_checkpointer* ck) {
  AGENTRT_C_REQUIRE(ck, "checkpointer");
  return Guard("agentrt_checkpointer_wait", [&] {
    const Status s = ck->ck->Wait();
    return s.ok() ? Ok() : Fail(s);
  });
}

int agentrt_checkpointer_set_snapshot(agentrt_checkpointer* ck, const char* how) {
  AGENTRT_C_REQUIRE(ck, "checkpointer");
  AGENTRT_C_REQUIRE(how, "how");
  return Guard("agentrt_checkpointer_set_snapshot", [&] {
    const std::string_view h = how;
    if (h != "copy" && h != "fork")
      return Fail(agentrt::InvalidArgument("snapshot: expected copy or fork, got '" +
                                           std::string(h) + "'"));
    ck->ck->set_snapshot(h == "fork" ? agentrt::CheckpointOptions::Snapshot::kFork
                                     : agentrt::CheckpointOptions::Snapshot::kCopy);
    return Ok();
  });
}

int agentrt_checkpointer_info(const agentrt_checkpointer* ck, char** json_out) {
  AGENTRT_C_REQUIRE(ck, "checkpointer");
  return Guard("agentrt_checkpointer_info", [&] {
    const agentrt::CheckpointStats st = ck->ck->stats();
    return JsonOut(
        {{"dir", ck->ck->options().dir},
         {"rank", ck->ck->options().rank},
         {"world_size", ck->ck->options().world_size},
         {"interval_s", ck->ck->options().interval_s},
         {"keep_last", ck->ck->options().keep_last},
         {"last_saved_step", ck->ck->last_saved_step()},
         {"saving", ck->ck->saving()},
         {"saves_started", st.saves_started},
         {"saves_committed", st.saves_committed},
         {"snapshot",
          ck->ck->snapshot() == agentrt::CheckpointOptions::Snapshot::kFork ? "fork" : "copy"},
         {"last_snapshot_s", st.last_snapshot_s},
         {"last_snapshot_forked", st.last_snapshot_forked},
         {"last_snapshot_fallback", st.last_snapshot_fallback},
         {"last_write_s", st.last_write_s}},
        json_out);
  });
}

int agentrt_checkpointer_restore(agentrt_checkpointer* ck, agentrt_restore** out) {
  AGENTRT_C_REQUIRE(ck, "checkpointer");
  AGENTRT_C_REQUIRE(out, "out");
  *out = nullptr;
  return Guard("agentrt_checkpointer_restore", [&] {
    auto r = ck->ck->Restore();
    if (!r.ok()) return Fail(r.status());
    *out = new agentrt_restore{std::move(r).value()};
    return Ok();
  });
}

int agentrt_checkpointer_restore_lazy(agentrt_checkpointer* ck, int64_t before_step,
                                      const char* before_step_error, const char* skipped_json,
                                      agentrt_restore** out) {
  AGENTRT_C_REQUIRE(ck, "checkpointer");
  AGENTRT_C_REQUIRE(out, "out");
  *out = nullptr;
  return Guard("agentrt_checkpointer_restore_lazy", [&] {
    agentrt::RestoreOptions options;
    options.load_shard = false;
    options.before_step = before_step;
    if (before_step_error != nullptr) options.before_step_error = before_step_error;
    if (skipped_json != nullptr) {
      const auto list = nlohmann::json::parse(skipped_json, nullptr, /*allow_exceptions=*/false);
      if (!list.is_array())
        return Fail(agentrt::InvalidArgument("skipped: not a JSON list of {step, file, reason}"));
      for (const auto& s : list) {
        if (!s.is_object() || !s.contains("step") || !s["step"].is_number_integer() ||
            !s.contains("file") || !s["file"].is_string() || !s.contains("reason") ||
            !s["reason"].is_string())
          return Fail(agentrt::InvalidArgument("skipped: " + s.dump() +
                                               " is not {\"step\": int, \"file\": str, "
                                               "\"reason\": str}"));
        options.skipped.push_back({s["step"].get<int64_t>(), s["file"].get<std::string>(),
                                   s["reason"].get<std::string>()});
      }
    }
    auto r = ck->ck->Restore(options);
    if (!r.ok()) return Fail(r.status());
    *out = new agentrt_restore{std::move(r).value()};
    return Ok();
  });
}

int agentrt_state_create(agentrt_state** out) {
  AGENTRT_C_REQUIRE(out, "out");
  *out = new agentrt_state{};
  return Ok();
}

void agentrt_state_free(agentrt_state* state) { delete state; }

int agentrt_state_add(agentrt_state* state, const char* name, const void* data, size_t bytes,
                      const char* dtype, const int64_t* shape, int ndim) {
  AGENTRT_C_REQUIRE(state, "state");
  AGENTRT_C_REQUIRE(name, "name");
  AGENTRT_C_REQUIRE(dtype, "dtype");
  return Guard("agentrt_state_add", [&] {
    const std::string n = name;
    if (n.empty()) return Fail(agentrt::InvalidArgument("an entry needs a name"));
    if (data == nullptr && bytes > 0) {
      return Fail(agentrt::InvalidArgument("entry '" + n + "': data is NULL"));
    }
    if (ndim < 0 || (ndim > 0 && shape == nullptr)) {
      return Fail(
          agentrt::InvalidArgument("entry '" + n + "': no shape for ndim " + std::to_string(ndim)));
    }
    auto element_size = ElementSize(n, dtype);
    if (!element_size.ok()) return Fail(element_size.status());
    const size_t element = *element_size;
    std::vector<int64_t> dims(shape, shape + ndim);
    size_t count = 1;
    for (int64_t d : dims) {
      if (d < 0) return Fail(agentrt::InvalidArgument("entry '" + n + "': negative dimension"));
      count *= static_cast<size_t>(d);
    }
    if (count * element != bytes) {
      return Fail(agentrt::InvalidArgument("entry '" + n + "': shape and dtype " + dtype +
                                           " make " + std::to_string(count * element) +
                                           " bytes, but " + std::to_string(bytes) + " were given"));
    }
    if (!state->names.insert(n).second) {
      return Fail(agentrt::AlreadyExists("entry '" + n + "' is in the state twice"));
    }
    state->state.AddArray(n, data, dtype, std::move(dims), element);
    return Ok();
  });
}

int agentrt_state_add_slice(agentrt_state* state, const char* name, const void* data,
                            const char* dtype, const int64_t* global_shape, int ndim,
                            uint64_t begin, uint64_t count) {
  AGENTRT_C_REQUIRE(state, "state");
  AGENTRT_C_REQUIRE(name, "name");
  AGENTRT_C_REQUIRE(dtype, "dtype");
  return Guard("agentrt_state_add_slice", [&] {
    const std::string n = name;
    if (n.empty()) return Fail(agentrt::InvalidArgument("an entry needs a name"));
    if (data == nullptr && count > 0) {
      return Fail(agentrt::InvalidArgument("entry '" + n + "': data is NULL"));
    }
    if (ndim < 0 || (ndim > 0 && global_shape == nullptr)) {
      return Fail(
          agentrt::InvalidArgument("entry '" + n + "': no shape for ndim " + std::to_string(ndim)));
    }
    auto element = ElementSize(n, dtype);
    if (!element.ok()) return Fail(element.status());
    std::vector<int64_t> dims(global_shape, global_shape + ndim);
    uint64_t elements = 1;
    for (int64_t d : dims) {
      if (d < 0) return Fail(agentrt::InvalidArgument("entry '" + n + "': negative dimension"));
      elements *= static_cast<uint64_t>(d);
    }
    if (begin > elements || count > elements - begin) {
      return Fail(agentrt::InvalidArgument("entry '" + n + "': elements [" + std::to_string(begin) +
                                           ", " + std::to_string(begin + count) +
                                           ") lie outside its global shape of " +
                                           std::to_string(elements) + " elements"));
    }
    if (!state->names.insert(n).second) {
      return Fail(agentrt::AlreadyExists("entry '" + n + "' is in the state twice"));
    }
    state->state.AddSlice(n, data, dtype, *element, std::move(dims), begin, count);
    return Ok();
  });
}

int agentrt_state_set_metadata(agentrt_state* state, const char* json) {
  AGENTRT_C_REQUIRE(state, "state");
  return Guard("agentrt_state_set_metadata", [&] {
    nlohmann::json m;
    if (Status s = agentrt::capi::ParseJsonArg(json, "metadata", &m); !s.ok()) return Fail(s);
    if (m.is_null()) m = nlohmann::json::object();
    if (!m.is_object()) return Fail(agentrt::InvalidArgument("metadata must be a JSON object"));
    state->state.metadata = std::move(m);
    return Ok();
  });
}

int agentrt_restore_info(const agentrt_restore* r, char** json_out) {
  AGENTRT_C_REQUIRE(r, "restore");
  return Guard("agentrt_restore_info", [&] { return JsonOut(RestoreJson(r->result), json_out); });
}

int agentrt_restore_read(const agentrt_restore* r, const char* name, uint64_t begin, uint64_t count,
                         void* dst, size_t dst_bytes) {
  AGENTRT_C_REQUIRE(r, "restore");
  AGENTRT_C_REQUIRE(name, "name");
  return Guard("agentrt_restore_read", [&] {
    if (!r->result.saved) {
      return Fail(agentrt::FailedPrecondition("nothing was restored: no global arrays to read"));
    }
    const agentrt::SavedStep::Array* a = r->result.saved->Find(name);
    if (a == nullptr) {
      return Fail(agentrt::NotFound("no global array '" + std::string(name) + "' in " +
                                    r->result.saved->path()));
    }
    if (count > SIZE_MAX / a->element_bytes || count * a->element_bytes != dst_bytes ||
        (dst == nullptr && count > 0)) {
      return Fail(agentrt::InvalidArgument("'" + std::string(name) + "': " + std::to_string(count) +
                                           " elements of " + std::to_string(a->element_bytes) +
                                           " bytes do not fit a buffer of " +
                                           std::to_string(dst_bytes) + " bytes"));
    }
    if (Status s = r->result.saved->Read(name, begin, count, dst); !s.ok()) return Fail(s);
    return Ok();
  });
}

int agentrt_restore_entry(const agentrt_restore* r, const char* name, const void** data,
                          size_t* bytes) {
  AGENTRT_C_REQUIRE(r, "restore");
  AGENTRT_C_REQUIRE(name, "name");
  AGENTRT_C_REQUIRE(data, "data");
  AGENTRT_C_REQUIRE(bytes, "bytes");
  return Guard("agentrt_restore_entry", [&] {
    for (const auto& e : r->result.shard.entries()) {
      if (e.name == name) {
        const auto span = r->result.shard.Bytes(name);
        *data = span.data();
        *bytes = span.size();
        return Ok();
      }
    }
    std::string names;
    for (const auto& e : r->result.shard.entries()) names += (names.empty() ? "" : ", ") + e.name;
    return Fail(agentrt::NotFound("no entry '" + std::string(name) + "' in the restored shard" +
                                  (names.empty() ? " (it has none)" : " (it has " + names + ")")));
  });
}

void agentrt_restore_free(agentrt_restore* r) { delete r; }

}  // extern "C"
