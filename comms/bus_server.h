// BusServer: the gRPC message-bus broker (comms/proto/bus.proto), served by
// the `agentrt-bus` tool (the broker process `agentctl run` starts for a run,
// scheduler/broker_process.h) and embeddable in a program of one's own.
//
//   BusServerOptions opts;                       // port 0 = an ephemeral port
//   auto server = BusServer::Start(opts, secret, acl);
//   server.value()->port();                      // the bound port
//   server.value()->Shutdown();                  // also done by the destructor
//
// Thread-safety: all methods may be called from any thread. Start returns once
// the server accepts connections; Shutdown blocks until every call has ended
// (streams are told to end; pending Requests get UNAVAILABLE).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/status.h"
#include "comms/auth.h"
#include "comms/broker.h"
#include "plan/config.h"
#include "plan/records.h"

namespace agentrt {

// The broker accepts PublishBatch requests of at least this many payload
// bytes whatever its max_message_bytes (clients batch up to it).
inline constexpr int64_t kMaxBatchBytes = 4 << 20;

struct BusServerOptions {
  std::string host = "0.0.0.0";  // listen address ("127.0.0.1" for loopback only)
  // 0 = pick a free port; see BusServer::port(). The port is never shared:
  // SO_REUSEPORT is off, so a port in use is an error, not a silent co-bind.
  int port = 0;
  // Limits (max_message_bytes), retention and durability. With a durable log
  // (broker.log_dir), log_dir/incarnation keeps the incarnation across
  // restarts, so saved positions stay valid.
  BrokerOptions broker;
  // TLS: when tls_cert_file is set the server speaks TLS only. With
  // tls_client_ca_file set too, clients must present a certificate signed by
  // that CA (mutual TLS).
  std::string tls_cert_file;
  std::string tls_key_file;
  std::string tls_client_ca_file;
  // With tls_client_ca_file: a call's client certificate must name (common
  // name) the agent its token is for (bus.mtls).
  bool tls_client_is_agent = false;
  int keepalive_time_ms = 10000;    // server pings an idle connection this often
  int keepalive_timeout_ms = 5000;  // and drops it when the ping is not answered in time
  // 0 = random. Tests set it to check restart detection deterministically.
  uint64_t incarnation = 0;
};

// The broker options a run's `bus:` settings ask for (limits, retention,
// durability); log_dir is where a durable log lives (RunDir::BusLogDir()).
// Errors name the bad setting.
Result<BrokerOptions> BrokerOptionsFor(const BusConfig& settings, const std::string& log_dir);

// The server's TLS a run's `bus:` settings ask for, into `options`: with tls
// on, its certificate and key; with mtls too, clients' certificates from the
// run's CA, each held to the agent of its token.
void SetServerTls(const BusConfig& settings, BusServerOptions& options);

// agentrt-bus's exit status when it cannot listen on its port (taken, or a
// bad address): whoever started it may try another port.
inline constexpr int kBrokerExitCannotListen = 75;

class BusServer {
 public:
  // Binds, starts serving and returns. Errors name the address and port.
  static Result<std::unique_ptr<BusServer>> Start(const BusServerOptions& options,
                                                  std::string secret, BusAcl acl);
  ~BusServer();
  BusServer(const BusServer&) = delete;
  BusServer& operator=(const BusServer&) = delete;

  int port() const;
  // "host:port" for clients: the listen host, or 127.0.0.1 when it is 0.0.0.0 / [::].
  std::string address() const;
  uint64_t incarnation() const;
  // The current launch of `agent` (Broker::SetIncarnation), for an embedder
  // that starts launches: from now on a process of any other launch of it is
  // refused ("fenced").
  void SetAgentIncarnation(const std::string& agent, const std::string& incarnation);
  // Topics (not inboxes) with their offsets, and the open subscriptions with
  // their positions: {"topics": [{topic, earliest_offset, end_offset,
  // retained_bytes}], "subscribers": [{agent, topic, offset, lag}]}.
  BusSnapshot Snapshot() const;
  // What recovering a durable log found (torn tails cut, what was read back).
  const std::vector<std::string>& recovery_notes() const;
  BusStats Stats() const;

  // Ends every open Subscribe/Receive stream with UNAVAILABLE; clients
  // reconnect and resume at their next offset. (Drain before maintenance; also
  // exercises resume in tests.)
  void CloseStreams();

  // Stops accepting calls and waits (up to `grace`) for running ones to end.
  void Shutdown(std::chrono::milliseconds grace = std::chrono::milliseconds(2000));

 private:
  struct Impl;
  explicit BusServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace agentrt
