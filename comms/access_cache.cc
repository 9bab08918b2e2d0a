#include "comms/access_cache.h"

#include <utility>

namespace agentrt {

AccessCache::AccessCache(BusAcl acl, std::string secret, size_t capacity)
    : acl_(std::move(acl)), secret_(std::move(secret)), capacity_(capacity) {}

bool AccessCache::TokenValid(std::string_view agent, std::string_view token) {
  thread_local std::string key;  // keeps its storage: no allocation per call
  key.assign(agent);
  std::string expected;
  {
    std::lock_guard<std::mutex> lock(tokens_mu_);
    auto it = tokens_.find(key);
    if (it != tokens_.end()) expected = it->second;
  }
  if (expected.empty()) {
    expected = DeriveAgentToken(secret_, agent);
    std::lock_guard<std::mutex> lock(tokens_mu_);
    if (tokens_.size() >= capacity_) tokens_.clear();
    tokens_.emplace(key, expected);
  }
  return TokenMatches(token, expected);
}

bool AccessCache::MayPublish(std::string_view agent, std::string_view topic) {
  thread_local std::string key;  // keeps its storage: no allocation per publish
  key.assign(agent).push_back('\0');
  key.append(topic);
  std::lock_guard<std::mutex> lock(publish_mu_);
  auto it = publish_.find(key);
  if (it != publish_.end()) return it->second;
  const bool allowed = acl_.MayPublish(agent, topic);
  if (publish_.size() >= capacity_) publish_.clear();
  publish_.emplace(key, allowed);
  return allowed;
}

}  // namespace agentrt
