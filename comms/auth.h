// Bus credentials and channel ACLs.
//
// The run secret is random bytes in a 0600 file in the run directory. An
// agent's credential is HMAC-SHA256(secret, agent name), hex-encoded; the run
// controller writes it to a 0600 token file per agent, and the agent finds that
// file through AGENTRT_TOKEN_FILE. The secret itself never goes into an
// environment variable, argv or a script.
//
// All functions are thread-safe (no shared state).
#pragma once

#include <openssl/sha.h>

#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "plan/plan.h"
#include "plan/run_dir.h"

namespace agentrt {

// An agent's bus credential: who it is and its token.
struct Credential {
  std::string agent;
  std::string token;  // lower-case hex of HMAC-SHA256(secret, agent), 64 chars
  // bus.mtls: the agent's client certificate and key (RunDir::ClientCertPath),
  // presented by BusClient::Connect to a TLS bus; "" = none.
  std::string cert_file = {};
  std::string key_file = {};
};

// Lower-case hex HMAC-SHA256(key, data), 64 chars.
std::string HmacSha256Hex(std::string_view key, std::string_view data);

inline constexpr size_t kHmacSha256HexSize = 64;

// HMAC-SHA256 (RFC 2104) under one key whose padded blocks are hashed once:
// each MAC then costs two SHA-256 compressions fewer and allocates nothing
// (OpenSSL 3's HMAC() makes its contexts per call). The telemetry receiver
// keeps one per agent token and checks every message with it.
class HmacSha256Key {
 public:
  explicit HmacSha256Key(std::string_view key);
  // Lower-case hex HMAC-SHA256(key, data) into `out`, as HmacSha256Hex.
  void Hex(std::string_view data, char (&out)[kHmacSha256HexSize]) const;

 private:
  SHA256_CTX inner_;  // SHA-256 after (key ^ ipad)
  SHA256_CTX outer_;  // SHA-256 after (key ^ opad)
};

// Lower-case hex HMAC-SHA256(secret, agent).
std::string DeriveAgentToken(std::string_view secret, std::string_view agent);

// The credential of `agent` (an agent, or the league service) in the run of
// `dir`: its token under `secret`, and with bus.mtls (`mtls`) the client
// certificate the run's CA signed for it (RunDir::ClientCertPath).
Credential RunCredential(const RunDir& dir, std::string_view secret, const std::string& agent,
                         bool mtls);

// Constant-time comparison of a presented token with the expected one.
bool TokenMatches(std::string_view presented, std::string_view expected);

// Token file: JSON {"agent": "...", "token": "..."} with mode 0600, written
// atomically (temp file + rename); with bus.mtls also "cert_file" and
// "key_file", the paths of the agent's client certificate and key.
// `sync_file` false: the caller makes it durable (WriteAgentTokens, one
// SyncFileSystemOf for all of a run's tokens).
Status WriteTokenFile(const std::string& path, const Credential& credential, bool sync_file = true);
Result<Credential> ReadTokenFile(const std::string& path);

// A PEM file of the bus's TLS set-up; errors say which (`what`) and where.
Result<std::string> ReadTlsFile(const std::string& path, std::string_view what);

// One token file per agent of `plan`, at RunDir::TokenPath, derived from
// `secret` (with bus.mtls, naming the agent's client certificate).
Status WriteAgentTokens(const RunDir& dir, std::string_view secret, const Plan& plan);

// Weight streams' topics (comms/weight_stream.h): a stream's versions on
// "weights/<name>", its delta versions on "weights-delta/<name>" and its
// device slots' records on "weights-device/<name>"
// (agent_runtime/device_weights.h), which the ACL governs as the stream
// itself (its channel's publishers, subscribers and keep_last). So the
// prefixes are reserved: a channel written for "weights-delta/..." or
// "weights-device/..." itself never matches.
inline constexpr std::string_view kWeightsTopicPrefix = "weights/";
inline constexpr std::string_view kWeightsDeltaTopicPrefix = "weights-delta/";
inline constexpr std::string_view kWeightsDeviceTopicPrefix = "weights-device/";

// Who may publish to and subscribe from which topics. Names are agent names
// of the run (already expanded from replicas; a '*' glob is also accepted).
// A topic pattern is an exact topic or a glob with '*' (e.g. "weights/*").
struct BusChannel {
  std::string topic;
  std::vector<std::string> publishers;
  std::vector<std::string> subscribers;
  int64_t keep_last = 0;  // messages a matching topic keeps (0: the broker's retention)
};

struct BusAcl {
  // Agents of the run; only these may authenticate. Ignored when `open`.
  std::vector<std::string> agents;
  std::vector<BusChannel> channels;
  // No plan: any agent with a valid token for its name may do anything. Used
  // by a standalone broker started without --plan and by tests.
  bool open = false;

  bool IsAgent(std::string_view agent) const;
  bool MayPublish(std::string_view agent, std::string_view topic) const;
  bool MaySubscribe(std::string_view agent, std::string_view topic) const;
  // The keep_last of the first channel matching `topic` that sets one; 0: none.
  int64_t KeepLast(std::string_view topic) const;
};

// The ACL of a run: its agents and channels, from the plan (the only source;
// agentrt-bus --plan, the broker of every run, calls this).
BusAcl AclFromPlan(const Plan& plan);

}  // namespace agentrt
