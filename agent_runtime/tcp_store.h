// agentrt::TcpStore — the small TCP key/value store an agent's ranks meet at
// (the NCCL unique id goes through it). Rank 0 runs the server, bound on the
// agent's own MASTER_PORT; every rank (rank 0 included) is a client of it.
//
//   Set(key, value)          store a value (overwrites)
//   Get(key, timeout)        the value, waiting until some rank has set it
//   Wait(keys, timeout)      wait until every key is set
//   Add(key, delta)          atomic int64 counter; returns the new value
//   Barrier(timeout)         every rank of the world arrives before any leaves, and
//                            the server's rank leaves only after the others are
//                            released (so it may exit right after its last one)
//
// Keys and values are byte strings. Every blocking call takes a timeout and
// returns DeadlineExceeded naming the key, store address and rank; after a
// timeout or a broken connection the client reconnects on the next call.
// Thread-safety: calls may come from several threads; they are serialised by
// a mutex, so a blocking Get holds up the others (use one TcpStore per thread
// when that matters).
// The server lives as long as the rank-0 TcpStore; destroying it closes every
// client's connection (their calls then fail with Unavailable).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace agentrt {

struct TcpStoreOptions {
  std::string host = "127.0.0.1";  // MASTER_ADDR: where clients connect
  int port = 0;                    // MASTER_PORT; 0 on the server picks a free port
  bool is_server = false;          // rank 0: bind host:port (all interfaces) and serve
  int rank = 0;
  int world_size = 1;  // ranks that take part in Barrier
  std::string agent;   // for messages
  // How long a client keeps trying to reach the server (it may start later).
  std::chrono::milliseconds connect_timeout = std::chrono::seconds(60);
};

class TcpStore {
 public:
  // Server: binds and starts serving before returning. Client: connects,
  // retrying until connect_timeout.
  static Result<std::unique_ptr<TcpStore>> Create(const TcpStoreOptions& options);
  ~TcpStore();
  TcpStore(const TcpStore&) = delete;
  TcpStore& operator=(const TcpStore&) = delete;

  using Timeout = std::chrono::milliseconds;
  static constexpr Timeout kDefaultTimeout = std::chrono::seconds(300);

  Status Set(std::string_view key, std::string_view value, Timeout timeout = kDefaultTimeout);
  Result<std::string> Get(std::string_view key, Timeout timeout = kDefaultTimeout);
  Status Wait(const std::vector<std::string>& keys, Timeout timeout = kDefaultTimeout);
  Result<int64_t> Add(std::string_view key, int64_t delta, Timeout timeout = kDefaultTimeout);
  // The n-th Barrier of every rank meets the n-th Barrier of the others.
  Status Barrier(Timeout timeout = kDefaultTimeout);

  // The port the server listens on (the one picked when options.port was 0).
  int port() const { return port_; }

 private:
  class Server;
  TcpStore(TcpStoreOptions options, std::unique_ptr<Server> server, int port);
  Status Connect();
  // Sends one request and reads its reply within the deadline.
  Result<std::string> Call(char op, std::string_view key, std::string_view value,
                           std::chrono::steady_clock::time_point deadline, Timeout timeout);
  std::string Where() const;

  TcpStoreOptions options_;
  std::unique_ptr<Server> server_;
  int port_;
  int fd_ = -1;
  int64_t barrier_count_ = 0;
  std::mutex mu_;
};

}  // namespace agentrt
