// HmacSha256Key keeps SHA-256 states (SHA256_CTX, a plain struct a copy
// resumes): OpenSSL 3 marks that API deprecated in favour of EVP, whose digest
// contexts are allocated per copy, which a MAC per telemetry message must not do.
#define OPENSSL_SUPPRESS_DEPRECATED

#include "comms/auth.h"

#include <fnmatch.h>
#include <openssl/crypto.h>

#include <cstring>
#include <nlohmann/json.hpp>

#include "common/file_util.h"

namespace agentrt {
namespace {

bool GlobMatch(const std::string& pattern, std::string_view name) {
  if (pattern.find('*') == std::string::npos) return pattern == name;
  return fnmatch(pattern.c_str(), std::string(name).c_str(), 0) == 0;
}

bool AnyMatch(const std::vector<std::string>& patterns, std::string_view name) {
  for (const auto& p : patterns) {
    if (GlobMatch(p, name)) return true;
  }
  return false;
}

}  // namespace

HmacSha256Key::HmacSha256Key(std::string_view key) {
  unsigned char block[SHA256_CBLOCK] = {};
  if (key.size() > sizeof block) {
    SHA256(reinterpret_cast<const unsigned char*>(key.data()), key.size(), block);
  } else {
    std::memcpy(block, key.data(), key.size());
  }
  unsigned char pad[SHA256_CBLOCK];
  for (size_t i = 0; i < sizeof pad; ++i) pad[i] = block[i] ^ 0x36;
  SHA256_Init(&inner_);
  SHA256_Update(&inner_, pad, sizeof pad);
  for (size_t i = 0; i < sizeof pad; ++i) pad[i] = block[i] ^ 0x5c;
  SHA256_Init(&outer_);
  SHA256_Update(&outer_, pad, sizeof pad);
  OPENSSL_cleanse(block, sizeof block);
  OPENSSL_cleanse(pad, sizeof pad);
}

void HmacSha256Key::Hex(std::string_view data, char (&out)[kHmacSha256HexSize]) const {
  unsigned char digest[SHA256_DIGEST_LENGTH];
  SHA256_CTX c = inner_;
  SHA256_Update(&c, data.data(), data.size());
  SHA256_Final(digest, &c);
  c = outer_;
  SHA256_Update(&c, digest, sizeof digest);
  SHA256_Final(digest, &c);
  OPENSSL_cleanse(&c, sizeof c);
  static constexpr char kHex[] = "0123456789abcdef";
  for (size_t i = 0; i < sizeof digest; ++i) {
    out[2 * i] = kHex[digest[i] >> 4];
    out[2 * i + 1] = kHex[digest[i] & 0xf];
  }
}

std::string HmacSha256Hex(std::string_view key, std::string_view data) {
  char hex[kHmacSha256HexSize];
  HmacSha256Key(key).Hex(data, hex);
  return std::string(hex, sizeof hex);
}

std::string DeriveAgentToken(std::string_view secret, std::string_view agent) {
  return HmacSha256Hex(secret, agent);
}

Credential RunCredential(const RunDir& dir, std::string_view secret, const std::string& agent,
                         bool mtls) {
  Credential c{agent, DeriveAgentToken(secret, agent)};
  if (mtls) {
    c.cert_file = dir.ClientCertPath(agent);
    c.key_file = dir.ClientKeyPath(agent);
  }
  return c;
}

bool TokenMatches(std::string_view presented, std::string_view expected) {
  if (presented.size() != expected.size()) return false;
  return CRYPTO_memcmp(presented.data(), expected.data(), expected.size()) == 0;
}

Status WriteTokenFile(const std::string& path, const Credential& credential, bool sync_file) {
  if (credential.agent.empty() || credential.token.empty()) {
    return InvalidArgument("token file " + path + ": agent and token must not be empty");
  }
  nlohmann::json j = {{"agent", credential.agent}, {"token", credential.token}};
  if (!credential.cert_file.empty()) {
    j["cert_file"] = credential.cert_file;
    j["key_file"] = credential.key_file;
  }
  return WriteFileAtomic(path, j.dump() + "\n", {.mode = 0600, .sync_file = sync_file});
}

Result<std::string> ReadTlsFile(const std::string& path, std::string_view what) {
  Result<std::string> text = ReadWholeFile(path, size_t{1} << 20);
  if (!text.ok()) return text.status().WithContext(std::string(what));
  return text;
}

Status WriteAgentTokens(const RunDir& dir, std::string_view secret, const Plan& plan) {
  for (const AgentPlan& a : plan.agents) {
    AGENTRT_RETURN_IF_ERROR(WriteTokenFile(
        dir.TokenPath(a.name), RunCredential(dir, secret, a.name, plan.bus.settings.mtls),
        /*sync_file=*/false));
  }
  return plan.agents.empty() ? Status::Ok() : SyncFileSystemOf(dir.SecretsDir());
}

Result<Credential> ReadTokenFile(const std::string& path) {
  AGENTRT_ASSIGN_OR_RETURN(std::string data, ReadPrivateFile(path, "bus token file"));
  nlohmann::json j = nlohmann::json::parse(data, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return InvalidArgument("bus token file " + path +
                           " is not a JSON object {\"agent\", \"token\"}");
  }
  Credential c;
  auto agent = j.find("agent");
  auto token = j.find("token");
  if (agent == j.end() || !agent->is_string() || agent->get<std::string>().empty()) {
    return InvalidArgument("bus token file " + path + ": missing string field \"agent\"");
  }
  if (token == j.end() || !token->is_string() || token->get<std::string>().empty()) {
    return InvalidArgument("bus token file " + path + ": missing string field \"token\"");
  }
  c.agent = agent->get<std::string>();
  c.token = token->get<std::string>();
  for (auto [key, field] : {std::pair{"cert_file", &c.cert_file}, {"key_file", &c.key_file}}) {
    auto it = j.find(key);
    if (it == j.end()) continue;
    if (!it->is_string())
      return InvalidArgument("bus token file " + path + ": \"" + key + "\" is not a string");
    *field = it->get<std::string>();
  }
  if (c.cert_file.empty() != c.key_file.empty()) {
    return InvalidArgument("bus token file " + path +
                           ": \"cert_file\" and \"key_file\" go together");
  }
  return c;
}

bool BusAcl::IsAgent(std::string_view agent) const {
  if (open) return true;
  for (const auto& a : agents) {
    if (a == agent) return true;
  }
  return false;
}

namespace {

// The topic whose channel governs `topic`: a weight stream's delta and
// device topics are governed as the stream's.
std::string Governing(std::string_view topic) {
  for (std::string_view prefix : {kWeightsDeltaTopicPrefix, kWeightsDeviceTopicPrefix}) {
    if (topic.starts_with(prefix))
      return std::string(kWeightsTopicPrefix) + std::string(topic.substr(prefix.size()));
  }
  return std::string(topic);
}

}  // namespace

bool BusAcl::MayPublish(std::string_view agent, std::string_view asked) const {
  if (open) return true;
  const std::string topic = Governing(asked);
  for (const auto& c : channels) {
    if (GlobMatch(c.topic, topic) && AnyMatch(c.publishers, agent)) return true;
  }
  return false;
}

bool BusAcl::MaySubscribe(std::string_view agent, std::string_view asked) const {
  if (open) return true;
  const std::string topic = Governing(asked);
  for (const auto& c : channels) {
    if (GlobMatch(c.topic, topic) && AnyMatch(c.subscribers, agent)) return true;
  }
  return false;
}

int64_t BusAcl::KeepLast(std::string_view asked) const {
  const std::string topic = Governing(asked);
  for (const auto& c : channels) {
    if (c.keep_last > 0 && GlobMatch(c.topic, topic)) return c.keep_last;
  }
  return 0;
}

BusAcl AclFromPlan(const Plan& plan) {
  BusAcl acl;
  for (const AgentPlan& a : plan.agents) acl.agents.push_back(a.name);
  // The controller's league service answers requests in its own inbox; it
  // publishes nothing, so it needs no channel.
  if (plan.league.enabled()) acl.agents.push_back(kLeagueServiceName);
  for (const ChannelPlan& c : plan.channels) {
    acl.channels.push_back({c.topic, c.publishers, c.subscribers, c.keep_last});
  }
  return acl;
}

}  // namespace agentrt
