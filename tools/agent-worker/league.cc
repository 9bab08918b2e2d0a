#include "tools/agent-worker/league.h"

#include <cstdio>

namespace agentrt::worker {

Result<std::unique_ptr<League>> League::Start(std::unique_ptr<BusClient> bus,
                                              const std::map<int, std::string>& seats,
                                              const std::map<std::string, int64_t>& offsets,
                                              uint64_t incarnation) {
  std::unique_ptr<League> league(new League(std::move(bus)));
  // Every seat's state exists before the first subscription starts: a callback
  // (on a bus thread) of one seat must never run while another seat is inserted.
  for (const auto& [seat, agent] : seats) {
    league->seat_of_topic_[WeightStreamTopic(agent)] = seat;
    league->seat_state_[seat].received = std::chrono::steady_clock::now();
  }
  for (const auto& [seat, agent] : seats) {
    const std::string topic = WeightStreamTopic(agent);
    StartAt from = StartAt::Earliest();
    if (auto it = offsets.find(topic); it != offsets.end()) {
      from = StartAt::Offset(std::max<int64_t>(0, it->second - 1), incarnation);
    }
    SubscribeOptions opts;
    opts.skip_expired = true;  // only the newest snapshot matters
    opts.on_event = [topic](const SubscriptionEvent& e) {
      static constexpr const char* kNames[] = {"connected", "reconnecting", "broker restarted",
                                               "offset expired", "failed"};
      std::fprintf(stderr, "agent-worker: subscription %s: %s at offset %lld%s%s\n", topic.c_str(),
                   kNames[static_cast<int>(e.kind)], static_cast<long long>(e.offset),
                   e.status.ok() ? "" : ": ", e.status.ok() ? "" : e.status.ToString().c_str());
    };
    League* self = league.get();
    const int s = seat;
    auto id = league->bus_->Subscribe(
        topic, from, [self, s](const BusMessage& m) { self->OnMessage(s, m); }, std::move(opts));
    if (!id.ok()) return id.status().WithContext("subscribe to " + topic);
  }
  return league;
}

League::~League() {
  // Let queued publishes reach the broker before the client goes.
  bus_->Flush(std::chrono::seconds(5)).IgnoreError();
  // The client's threads call OnMessage: end them while the members they use live.
  bus_.reset();
}

void League::OnMessage(int seat, const BusMessage& message) {
  auto snapshot = DecodeSnapshot(message);
  if (!snapshot.ok()) {
    rejected_.fetch_add(1);
    std::fprintf(stderr, "agent-worker: %s offset %lld: %s\n", message.topic().c_str(),
                 static_cast<long long>(message.offset()), snapshot.status().ToString().c_str());
    return;
  }
  received_.fetch_add(1);
  std::lock_guard<std::mutex> lock(mu_);
  SeatState& state = seat_state_[seat];
  state.received = std::chrono::steady_clock::now();
  if (message.offset() <= state.offset)
    return;  // an older one than we have (stream after a direct fetch)
  state.offset = message.offset();
  fresh_[seat] = std::move(*snapshot);
}

void League::CatchUp(std::chrono::milliseconds period) {
  const auto now = std::chrono::steady_clock::now();
  if (now - last_check_ < period) return;
  last_check_ = now;
  auto topics = bus_->ListTopics();
  if (!topics.ok()) return;
  for (const auto& info : *topics) {
    auto it = seat_of_topic_.find(info.topic());
    if (it == seat_of_topic_.end()) continue;
    const int seat = it->second;
    bool stalled = false;
    int64_t have = -1;
    {
      std::lock_guard<std::mutex> lock(mu_);
      const SeatState& state = seat_state_[seat];
      have = state.offset;
      stalled = info.end_offset() - 1 > state.offset && now - state.received >= period;
    }
    if (!stalled) continue;
    auto newest =
        bus_->Fetch(info.topic(), info.end_offset() - 1, 1, std::chrono::milliseconds(500));
    if (!newest.ok() || newest->empty()) continue;
    if (stalls_.fetch_add(1) < 5) {
      std::fprintf(stderr,
                   "agent-worker: subscription %s is %lld message(s) behind and quiet; read offset "
                   "%lld directly\n",
                   info.topic().c_str(), static_cast<long long>(info.end_offset() - 1 - have),
                   static_cast<long long>(info.end_offset() - 1));
    }
    OnMessage(seat, newest->back());
  }
}

void League::TakeNew(std::map<int, PolicySnapshot>& out) {
  out.clear();
  std::lock_guard<std::mutex> lock(mu_);
  out.swap(fresh_);
}

void League::PublishSnapshot(const PolicySnapshot& snapshot, int64_t incarnation) {
  PublishOptions opts;
  opts.content_type = kWeightsContentType;
  const std::string topic = WeightStreamTopic(bus_->agent());
  const int64_t step = snapshot.env_steps;
  bus_->PublishAsync(
      topic, EncodeSnapshot(snapshot, incarnation), opts,
      [this, topic, step](const Result<PublishAck>& ack) { OnPublished(topic, step, ack); });
}

void League::OnPublished(const std::string& topic, int64_t step, const Result<PublishAck>& ack) {
  if (!ack.ok()) {
    if (publish_failures_.fetch_add(1) < 5) {
      std::fprintf(stderr, "agent-worker: publishing a snapshot failed: %s\n",
                   ack.status().ToString().c_str());
    }
    return;
  }
  published_.fetch_add(1);
  if (ack->offset < 0) return;  // a duplicate whose first offset is no longer known
  // Offsets grow within one log; a broker that came back without its log
  // (another incarnation) numbers from its start again. (The incarnation is
  // the one this client's subscriptions read, which may lag the broker's by a
  // reconnect: the league then ignores the offer until the next snapshot.)
  const uint64_t log = bus_->SubscriptionIncarnation();
  std::lock_guard<std::mutex> lock(mu_);
  if (!newest_published_ || newest_published_->bus_incarnation != log ||
      newest_published_->offset < ack->offset)
    newest_published_ = SnapshotRef{topic, ack->offset, step, log};
}

std::optional<SnapshotRef> League::newest_published() const {
  std::lock_guard<std::mutex> lock(mu_);
  return newest_published_;
}

void League::PublishResult(const nlohmann::json& result) {
  PublishOptions opts;
  opts.content_type = "application/json";
  bus_->PublishAsync(kResultsTopic, result.dump(), opts, [this](const Result<PublishAck>& ack) {
    if (ack.ok()) {
      published_.fetch_add(1);
    } else if (publish_failures_.fetch_add(1) < 5) {
      std::fprintf(stderr, "agent-worker: publishing a result failed: %s\n",
                   ack.status().ToString().c_str());
    }
  });
}

}  // namespace agentrt::worker
