// The broker's answers to "is this agent who it says" and "may it publish
// there", a part of its own: the run's ACL and secret, with each agent's
// expected token and each (agent, topic) publish decision cached, so the
// publish path derives no HMAC and matches no pattern twice. Thread-safe.
#pragma once

#include <cstddef>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>

#include "comms/auth.h"

namespace agentrt {

class AccessCache {
 public:
  // Each cache holds at most `capacity` entries; a full one starts over.
  AccessCache(BusAcl acl, std::string secret, size_t capacity);

  const BusAcl& acl() const { return acl_; }

  // True when `token` is `agent`'s token under this run's secret.
  bool TokenValid(std::string_view agent, std::string_view token);
  // The ACL's MayPublish, remembered per (agent, topic).
  bool MayPublish(std::string_view agent, std::string_view topic);

 private:
  const BusAcl acl_;
  const std::string secret_;
  const size_t capacity_;

  std::mutex tokens_mu_;
  std::unordered_map<std::string, std::string> tokens_;  // agent -> expected token

  std::mutex publish_mu_;
  std::unordered_map<std::string, bool> publish_;  // agent + '\0' + topic -> allowed
};

}  // namespace agentrt
