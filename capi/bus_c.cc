// The bus client through the C API: callback and queue subscriptions.
#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "agent_runtime/runtime.h"
#include "capi/c_api_internal.h"
#include "common/enum_names.h"
#include "comms/bus_client.h"
#include "comms/bus_validate.h"

using agentrt::BusClient;
using agentrt::BusMessage;

// A message: a view of one the client delivers (during a callback), or one of
// its own (queue, reply) that the caller frees.
struct agentrt_message {
  const BusMessage* m = nullptr;
  BusMessage owned;
};

namespace {

// A pulled subscription's messages and events. The subscription's thread
// waits while the queue is full: the stream pauses, nothing is dropped.
struct Queue {
  std::mutex mu;
  std::condition_variable ready;  // a message (or the end) arrived
  std::condition_variable space;  // a message was taken (or the queue closes)
  std::deque<BusMessage> messages;
  size_t capacity = 1024;
  nlohmann::json events = nlohmann::json::array();
  bool closing = false;
  bool failed = false;
  Status final_status;
};

// The caller's (data, len); NULL data only with len 0 (AGENTRT_C_REQUIRE_PAYLOAD).
std::string_view Payload(const void* data, size_t len) {
  return {static_cast<const char*>(data), data == nullptr ? 0 : len};
}
#define AGENTRT_C_REQUIRE_PAYLOAD(data, len) \
  if ((data) == nullptr && (len) > 0) return Fail(agentrt::InvalidArgument("payload is NULL"))

// A publish's outcome as a C code, its offset in *offset (when not NULL).
int AckOut(const agentrt::Result<agentrt::PublishAck>& ack, int64_t* offset) {
  if (!ack.ok()) return Fail(ack.status());
  if (offset != nullptr) *offset = ack->offset;
  return Ok();
}

using EventKind = agentrt::SubscriptionEvent::Kind;
constexpr agentrt::EnumName<EventKind> kEventNames[] = {
    {EventKind::kConnected, "connected"},
    {EventKind::kReconnecting, "reconnecting"},
    {EventKind::kBrokerRestarted, "broker_restarted"},
    {EventKind::kOffsetExpired, "offset_expired"},
    {EventKind::kFailed, "failed"}};

Status StartOf(int start, int64_t offset, uint64_t incarnation, agentrt::StartAt* out) {
  switch (start) {
    case AGENTRT_START_EARLIEST:
      *out = agentrt::StartAt::Earliest();
      return Status::Ok();
    case AGENTRT_START_LATEST:
      *out = agentrt::StartAt::Latest();
      return Status::Ok();
    case AGENTRT_START_OFFSET:
      if (offset < 0) return agentrt::InvalidArgument("start offset must be >= 0");
      *out = agentrt::StartAt::Offset(offset, incarnation);
      return Status::Ok();
    default:
      return agentrt::InvalidArgument(
          "start must be AGENTRT_START_EARLIEST, _LATEST or _OFFSET, "
          "got " +
          std::to_string(start));
  }
}

agentrt::Result<std::string> TopicArg(const char* topic) {
  if (topic == nullptr) return std::string();  // the inbox
  if (*topic == '\0') return agentrt::InvalidArgument("topic is empty (NULL reads the inbox)");
  return std::string(topic);
}

}  // namespace

struct agentrt_bus {
  BusClient* client = nullptr;
  std::unique_ptr<BusClient> owned;  // null when borrowed from a runtime
  std::mutex mu;                     // guards subs
  std::map<agentrt::SubscriptionId, std::shared_ptr<Queue>> subs;  // queue: null for callbacks
  std::mutex streams_mu;                                           // guards weight_streams
  // Kept streams (async publishes, delta state); a caller holds a reference
  // while it uses one, so a concurrent close cannot free it under it.
  std::map<std::string, std::shared_ptr<agentrt::WeightStream>> weight_streams;
  // Kept streams of GPU tensors (agentrt_weights_*_device); also streams_mu.
  std::map<std::string, std::shared_ptr<agentrt::capi::DeviceWeightStreamHandle>> device_streams;

  ~agentrt_bus() {
    device_streams.clear();  // their device slots freed while the client lives
    weight_streams.clear();  // their versions in flight stored first, while the client lives
    std::map<agentrt::SubscriptionId, std::shared_ptr<Queue>> all;
    {
      std::lock_guard<std::mutex> lock(mu);
      all.swap(subs);
    }
    for (auto& [id, q] : all) End(id, q).IgnoreError();  // closing: nobody to tell
  }

  // Unblocks a queue's writer, then ends the subscription.
  Status End(agentrt::SubscriptionId id, const std::shared_ptr<Queue>& q) {
    if (q) {
      std::lock_guard<std::mutex> lock(q->mu);
      q->closing = true;
      q->space.notify_all();
      q->ready.notify_all();
    }
    return client->Unsubscribe(id);
  }

  agentrt::Result<agentrt::SubscriptionId> Add(const std::string& topic, agentrt::StartAt from,
                                               agentrt::MessageCallback cb,
                                               agentrt::SubscribeOptions opts,
                                               std::shared_ptr<Queue> q) {
    std::lock_guard<std::mutex> lock(mu);
    auto id = topic.empty() ? client->Receive(from, std::move(cb), std::move(opts))
                            : client->Subscribe(topic, from, std::move(cb), std::move(opts));
    if (id.ok()) subs[*id] = std::move(q);
    return id;
  }
};

namespace agentrt::capi {
BusClient* BusClientOf(agentrt_bus* bus) { return bus->client; }

Result<std::shared_ptr<WeightStream>> AsyncWeightStreamOf(agentrt_bus* bus, const std::string& name,
                                                          int64_t incarnation,
                                                          const WeightStreamOptions* options) {
  std::lock_guard<std::mutex> lock(bus->streams_mu);
  auto& stream = bus->weight_streams[name];
  if (stream == nullptr) {
    stream = std::make_shared<WeightStream>(*bus->client, name, incarnation,
                                            options != nullptr ? *options : WeightStreamOptions{});
  }
  if (stream->incarnation() != incarnation) {
    return InvalidArgument("weights stream \"" + name + "\" publishes as incarnation " +
                           std::to_string(stream->incarnation()) + " on this bus handle, not " +
                           std::to_string(incarnation));
  }
  if (options != nullptr && options->delta != stream->options().delta) {
    return InvalidArgument("weights stream \"" + name +
                           "\" is open on this bus handle with delta " +
                           (stream->options().delta ? "on" : "off") + " already (close it first)");
  }
  return stream;
}

namespace {
// The handle's kept stream `name` when it serves `incarnation` (any stream
// when none is given: a reader's); streams_mu held.
std::shared_ptr<WeightStream> KeptLocked(agentrt_bus* bus, const std::string& name,
                                         std::optional<int64_t> incarnation) {
  auto it = bus->weight_streams.find(name);
  if (it == bus->weight_streams.end()) return nullptr;
  if (incarnation.has_value() && it->second->incarnation() != *incarnation) return nullptr;
  return it->second;
}
}  // namespace

Result<std::shared_ptr<DeviceWeightStreamHandle>> DeviceWeightStreamOf(
    agentrt_bus* bus, const std::string& name, std::optional<int64_t> incarnation, int device) {
  std::lock_guard<std::mutex> lock(bus->streams_mu);
  // The name's kept stream (agentrt_weights_open) when it serves this call:
  // one stream object, so its delta versions are the GPU versions' too.
  const std::shared_ptr<WeightStream> kept = KeptLocked(bus, name, incarnation);
  auto& handle = bus->device_streams[name];
  const bool other_incarnation =
      handle != nullptr && incarnation.has_value() && handle->host->incarnation() != *incarnation;
  // One that never published is made anew for another incarnation, or over
  // a kept stream opened since it was made.
  const bool remake = handle != nullptr && !handle->published && handle->device == device &&
                      (other_incarnation || (kept != nullptr && handle->host != kept));
  if (handle == nullptr || remake) {
    if (!device::DriverPresent()) {
      bus->device_streams.erase(name);
      return Unavailable("weights stream \"" + name +
                         "\": no NVIDIA driver (libcuda.so.1) on this machine for GPU tensors; "
                         "copy them to the host and publish those");
    }
    Result<device::Api*> api = device::LoadDeviceApi();
    if (!api.ok()) {
      bus->device_streams.erase(name);
      return Unavailable("weights stream \"" + name + "\": " + api.status().message());
    }
    auto made = std::make_shared<DeviceWeightStreamHandle>();
    made->device = device;
    made->host = kept != nullptr
                     ? kept
                     : std::make_shared<WeightStream>(*bus->client, name, incarnation.value_or(0));
    made->gpu = std::make_unique<DeviceWeightStream>(*made->host, **api, device);
    handle = std::move(made);
  }
  if (handle->device != device ||
      (incarnation.has_value() && handle->host->incarnation() != *incarnation)) {
    return InvalidArgument(
        "weights stream \"" + name + "\" is open on this bus handle for CUDA device " +
        std::to_string(handle->device) + " and incarnation " +
        std::to_string(handle->host->incarnation()) + ", not device " + std::to_string(device) +
        " and incarnation " + std::to_string(incarnation.value_or(handle->host->incarnation())));
  }
  // A publisher's: from here on its incarnation is this one's (set here,
  // under the lock, so that no other call remakes it meanwhile).
  if (incarnation.has_value()) handle->published = true;
  return handle;
}

std::shared_ptr<WeightStream> FindWeightStream(agentrt_bus* bus, const std::string& name,
                                               std::optional<int64_t> incarnation) {
  std::lock_guard<std::mutex> lock(bus->streams_mu);
  return KeptLocked(bus, name, incarnation);
}

Result<int64_t> CloseAsyncWeightStream(agentrt_bus* bus, const std::string& name,
                                       int64_t incarnation, std::chrono::milliseconds timeout) {
  AGENTRT_ASSIGN_OR_RETURN(std::shared_ptr<WeightStream> stream,
                           AsyncWeightStreamOf(bus, name, incarnation));
  AGENTRT_ASSIGN_OR_RETURN(const int64_t version, stream->Flush(timeout));
  std::lock_guard<std::mutex> lock(bus->streams_mu);
  bus->weight_streams.erase(name);  // the stream ends with the last reference (`stream` here)
  bus->device_streams.erase(name);
  return version;
}
}  // namespace agentrt::capi

extern "C" {

int agentrt_runtime_bus(agentrt_runtime* rt, agentrt_bus** out) {
  AGENTRT_C_REQUIRE(rt, "runtime");
  AGENTRT_C_REQUIRE(out, "out");
  *out = nullptr;
  return Guard("agentrt_runtime_bus", [&] {
    auto bus = rt->rt->bus();
    if (!bus.ok()) return Fail(bus.status());
    auto* h = new agentrt_bus{};
    h->client = *bus;
    *out = h;
    return Ok();
  });
}

int agentrt_bus_from_environment(agentrt_bus** out) {
  AGENTRT_C_REQUIRE(out, "out");
  *out = nullptr;
  return Guard("agentrt_bus_from_environment", [&] {
    auto bus = BusClient::FromEnvironment();
    if (!bus.ok()) return Fail(bus.status());
    auto* h = new agentrt_bus{};
    h->owned = std::move(bus).value();
    h->client = h->owned.get();
    *out = h;
    return Ok();
  });
}

int agentrt_bus_connect(const char* address, const char* agent, const char* token,
                        agentrt_bus** out) {
  AGENTRT_C_REQUIRE(address, "address");
  AGENTRT_C_REQUIRE(agent, "agent");
  AGENTRT_C_REQUIRE(token, "token");
  AGENTRT_C_REQUIRE(out, "out");
  *out = nullptr;
  return Guard("agentrt_bus_connect", [&] {
    auto bus = BusClient::Connect(address, agentrt::Credential{agent, token});
    if (!bus.ok()) return Fail(bus.status());
    auto* h = new agentrt_bus{};
    h->owned = std::move(bus).value();
    h->client = h->owned.get();
    *out = h;
    return Ok();
  });
}

void agentrt_bus_close(agentrt_bus* bus) { delete bus; }

int agentrt_bus_wait_ready(agentrt_bus* bus, int timeout_ms) {
  AGENTRT_C_REQUIRE(bus, "bus");
  return Guard("agentrt_bus_wait_ready", [&] {
    const Status s = bus->client->WaitForReady(std::chrono::milliseconds(timeout_ms));
    return s.ok() ? Ok() : Fail(s);
  });
}

int agentrt_bus_publish(agentrt_bus* bus, const char* topic, const void* data, size_t len,
                        const char* content_type, int64_t* offset) {
  AGENTRT_C_REQUIRE(bus, "bus");
  AGENTRT_C_REQUIRE(topic, "topic");
  AGENTRT_C_REQUIRE_PAYLOAD(data, len);
  return Guard("agentrt_bus_publish", [&] {
    agentrt::PublishOptions o;
    if (content_type != nullptr) o.content_type = content_type;
    auto ack = bus->client->Publish(topic, Payload(data, len), o);
    return AckOut(ack, offset);
  });
}

int agentrt_bus_publish_async(agentrt_bus* bus, const char* topic, const void* data, size_t len,
                              const char* content_type) {
  AGENTRT_C_REQUIRE(bus, "bus");
  AGENTRT_C_REQUIRE(topic, "topic");
  AGENTRT_C_REQUIRE_PAYLOAD(data, len);
  return Guard("agentrt_bus_publish_async", [&] {
    if (Status s = agentrt::ValidateTopic(topic); !s.ok()) return Fail(s.WithContext("publish"));
    agentrt::PublishOptions o;
    if (content_type != nullptr) o.content_type = content_type;
    bus->client->PublishAsync(topic, Payload(data, len), o);
    return Ok();
  });
}

int agentrt_bus_flush(agentrt_bus* bus, int timeout_ms) {
  AGENTRT_C_REQUIRE(bus, "bus");
  return Guard("agentrt_bus_flush", [&] {
    const Status s = bus->client->Flush(std::chrono::milliseconds(timeout_ms));
    return s.ok() ? Ok() : Fail(s);
  });
}

int agentrt_bus_send(agentrt_bus* bus, const char* to, const void* data, size_t len,
                     int64_t* offset) {
  AGENTRT_C_REQUIRE(bus, "bus");
  AGENTRT_C_REQUIRE(to, "to");
  AGENTRT_C_REQUIRE_PAYLOAD(data, len);
  return Guard("agentrt_bus_send", [&] {
    auto ack = bus->client->Send(to, Payload(data, len));
    return AckOut(ack, offset);
  });
}

int agentrt_bus_request(agentrt_bus* bus, const char* to, const void* data, size_t len,
                        int timeout_ms, agentrt_message** reply) {
  AGENTRT_C_REQUIRE(bus, "bus");
  AGENTRT_C_REQUIRE(to, "to");
  AGENTRT_C_REQUIRE(reply, "reply");
  *reply = nullptr;
  AGENTRT_C_REQUIRE_PAYLOAD(data, len);
  return Guard("agentrt_bus_request", [&] {
    auto r = bus->client->Request(to, Payload(data, len), std::chrono::milliseconds(timeout_ms));
    if (!r.ok()) return Fail(r.status());
    auto* m = new agentrt_message{};
    m->owned.set_payload(r->payload);
    m->owned.set_content_type(r->content_type);
    m->owned.set_publisher(r->replier);
    m->m = &m->owned;
    *reply = m;
    return Ok();
  });
}

int agentrt_bus_reply(agentrt_bus* bus, uint64_t request_id, const void* data, size_t len) {
  AGENTRT_C_REQUIRE(bus, "bus");
  AGENTRT_C_REQUIRE_PAYLOAD(data, len);
  return Guard("agentrt_bus_reply", [&] {
    const Status s = bus->client->Reply(request_id, Payload(data, len));
    return s.ok() ? Ok() : Fail(s);
  });
}

int agentrt_bus_subscribe(agentrt_bus* bus, const char* topic, int start, int64_t offset,
                          uint64_t incarnation, int skip_expired, agentrt_message_fn on_message,
                          agentrt_event_fn on_event, void* user, uint64_t* id) {
  AGENTRT_C_REQUIRE(bus, "bus");
  AGENTRT_C_REQUIRE(on_message, "on_message");
  AGENTRT_C_REQUIRE(id, "id");
  return Guard("agentrt_bus_subscribe", [&] {
    agentrt::StartAt from;
    if (Status s = StartOf(start, offset, incarnation, &from); !s.ok()) return Fail(s);
    auto t = TopicArg(topic);
    if (!t.ok()) return Fail(t.status());
    agentrt::SubscribeOptions opts;
    opts.skip_expired = skip_expired != 0;
    if (on_event != nullptr) {
      opts.on_event = [on_event, user](const agentrt::SubscriptionEvent& e) {
        on_event(user, static_cast<int>(e.kind), e.topic.c_str(), e.offset, e.earliest,
                 agentrt::capi::CodeOf(e.status.code()), e.status.message().c_str());
      };
    }
    auto sid = bus->Add(
        *t, from,
        [on_message, user](const BusMessage& m) {
          agentrt_message view;
          view.m = &m;
          on_message(user, &view);
        },
        std::move(opts), nullptr);
    if (!sid.ok()) return Fail(sid.status());
    *id = *sid;
    return Ok();
  });
}

int agentrt_bus_subscribe_queue(agentrt_bus* bus, const char* topic, int start, int64_t offset,
                                uint64_t incarnation, int skip_expired, size_t capacity,
                                uint64_t* id) {
  AGENTRT_C_REQUIRE(bus, "bus");
  AGENTRT_C_REQUIRE(id, "id");
  return Guard("agentrt_bus_subscribe_queue", [&] {
    agentrt::StartAt from;
    if (Status s = StartOf(start, offset, incarnation, &from); !s.ok()) return Fail(s);
    auto t = TopicArg(topic);
    if (!t.ok()) return Fail(t.status());
    if (capacity < 1) return Fail(agentrt::InvalidArgument("capacity must be >= 1"));
    auto q = std::make_shared<Queue>();
    q->capacity = capacity;
    agentrt::SubscribeOptions opts;
    opts.skip_expired = skip_expired != 0;
    opts.on_event = [q](const agentrt::SubscriptionEvent& e) {
      std::lock_guard<std::mutex> lock(q->mu);
      if (q->events.size() < 1000) {
        q->events.push_back({{"kind", agentrt::NameIn(kEventNames, e.kind)},
                             {"topic", e.topic},
                             {"offset", e.offset},
                             {"earliest", e.earliest},
                             {"code", agentrt::capi::CodeOf(e.status.code())},
                             {"message", e.status.message()}});
      }
      if (e.kind == agentrt::SubscriptionEvent::Kind::kFailed) {
        q->failed = true;
        q->final_status = e.status;
        q->ready.notify_all();
      }
    };
    auto sid = bus->Add(
        *t, from,
        [q](const BusMessage& m) {
          std::unique_lock<std::mutex> lock(q->mu);
          q->space.wait(lock, [&] { return q->closing || q->messages.size() < q->capacity; });
          if (q->closing) return;
          q->messages.push_back(m);
          q->ready.notify_one();
        },
        std::move(opts), q);
    if (!sid.ok()) return Fail(sid.status());
    *id = *sid;
    return Ok();
  });
}

int agentrt_bus_next(agentrt_bus* bus, uint64_t id, int timeout_ms, agentrt_message** out) {
  AGENTRT_C_REQUIRE(bus, "bus");
  AGENTRT_C_REQUIRE(out, "out");
  *out = nullptr;
  return Guard("agentrt_bus_next", [&] {
    std::shared_ptr<Queue> q;
    {
      std::lock_guard<std::mutex> lock(bus->mu);
      auto it = bus->subs.find(id);
      if (it == bus->subs.end() || !it->second) {
        return Fail(agentrt::NotFound("no queue subscription " + std::to_string(id) +
                                      " on this bus handle"));
      }
      q = it->second;
    }
    std::unique_lock<std::mutex> lock(q->mu);
    q->ready.wait_for(lock, std::chrono::milliseconds(std::max(0, timeout_ms)),
                      [&] { return !q->messages.empty() || q->failed || q->closing; });
    if (!q->messages.empty()) {
      auto* m = new agentrt_message{};
      m->owned = std::move(q->messages.front());
      m->m = &m->owned;
      q->messages.pop_front();
      q->space.notify_one();
      *out = m;
      return Ok();
    }
    if (q->failed) return Fail(q->final_status);
    return Ok();  // timeout: *out stays NULL
  });
}

int agentrt_bus_events(agentrt_bus* bus, uint64_t id, char** json_out) {
  AGENTRT_C_REQUIRE(bus, "bus");
  return Guard("agentrt_bus_events", [&] {
    std::shared_ptr<Queue> q;
    {
      std::lock_guard<std::mutex> lock(bus->mu);
      auto it = bus->subs.find(id);
      if (it == bus->subs.end() || !it->second) {
        return Fail(agentrt::NotFound("no queue subscription " + std::to_string(id)));
      }
      q = it->second;
    }
    nlohmann::json events = nlohmann::json::array();
    {
      std::lock_guard<std::mutex> lock(q->mu);
      events.swap(q->events);
    }
    return JsonOut(events, json_out);
  });
}

int agentrt_bus_unsubscribe(agentrt_bus* bus, uint64_t id) {
  AGENTRT_C_REQUIRE(bus, "bus");
  return Guard("agentrt_bus_unsubscribe", [&] {
    std::shared_ptr<Queue> q;
    {
      std::lock_guard<std::mutex> lock(bus->mu);
      auto it = bus->subs.find(id);
      if (it == bus->subs.end()) {
        return Fail(
            agentrt::NotFound("no subscription " + std::to_string(id) + " on this bus handle"));
      }
      q = it->second;
    }
    // Forgotten only once it has ended: a refused unsubscribe (from the
    // subscription's own callback) leaves it running and known.
    const Status s = bus->End(id, q);
    if (!s.ok()) return Fail(s);
    std::lock_guard<std::mutex> lock(bus->mu);
    bus->subs.erase(id);
    return Ok();
  });
}

int agentrt_bus_positions(agentrt_bus* bus, char** json_out) {
  AGENTRT_C_REQUIRE(bus, "bus");
  return Guard("agentrt_bus_positions", [&] {
    // A pulled subscription's position is its first message not yet taken by
    // agentrt_bus_next: what waits in its queue was delivered, not consumed.
    std::map<std::string, int64_t> offsets = bus->client->SubscriptionOffsets();
    {
      std::lock_guard<std::mutex> lock(bus->mu);
      for (const auto& [id, q] : bus->subs) {
        if (!q) continue;
        std::lock_guard<std::mutex> qlock(q->mu);
        if (q->messages.empty()) continue;
        const BusMessage& first = q->messages.front();
        auto it = offsets.find(first.topic());
        if (it != offsets.end()) it->second = std::min(it->second, first.offset());
      }
    }
    return JsonOut({{"offsets", offsets}, {"incarnation", bus->client->SubscriptionIncarnation()}},
                   json_out);
  });
}

int agentrt_bus_stats(agentrt_bus* bus, char** json_out) {
  AGENTRT_C_REQUIRE(bus, "bus");
  return Guard("agentrt_bus_stats", [&] {
    auto s = bus->client->Stats();
    if (!s.ok()) return Fail(s.status());
    nlohmann::json j;
#define AGENTRT_STAT_JSON(type, name) j[#name] = s->name;
    AGENTRT_BUS_STATS(AGENTRT_STAT_JSON)
#undef AGENTRT_STAT_JSON
    return JsonOut(j, json_out);
  });
}

const char* agentrt_message_topic(const agentrt_message* m) {
  return m != nullptr ? m->m->topic().c_str() : "";
}
int64_t agentrt_message_offset(const agentrt_message* m) {
  return m != nullptr ? m->m->offset() : -1;
}
const void* agentrt_message_payload(const agentrt_message* m, size_t* len) {
  if (m == nullptr) {
    if (len != nullptr) *len = 0;
    return nullptr;
  }
  if (len != nullptr) *len = m->m->payload().size();
  return m->m->payload().data();
}
const char* agentrt_message_content_type(const agentrt_message* m) {
  return m != nullptr ? m->m->content_type().c_str() : "";
}
const char* agentrt_message_publisher(const agentrt_message* m) {
  return m != nullptr ? m->m->publisher().c_str() : "";
}
uint64_t agentrt_message_request_id(const agentrt_message* m) {
  return m != nullptr ? m->m->request_id() : 0;
}
int64_t agentrt_message_publish_time_ns(const agentrt_message* m) {
  return m != nullptr ? m->m->publish_time_ns() : 0;
}
void agentrt_message_free(agentrt_message* m) { delete m; }

}  // extern "C"
