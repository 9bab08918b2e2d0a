#include "agent_runtime/tcp_store.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <map>
#include <thread>
#include <unordered_map>

namespace agentrt {

// Wire format (both directions, little-endian lengths):
//   request: op (1 byte: 'S' set, 'G' get, 'A' add) | u32 key length | key | u32 value length |
//   value reply:   status (1 byte: 0 ok, 1 error) | u32 length | payload
// 'G' is answered only once the key exists, so a client waits by reading.
namespace {

constexpr uint32_t kMaxField = 64u << 20;  // a value larger than 64 MiB is a bug

void PutU32(std::string& out, uint32_t v) {
  char b[4];
  for (int i = 0; i < 4; ++i) b[i] = static_cast<char>((v >> (8 * i)) & 0xffu);
  out.append(b, 4);
}

uint32_t GetU32(const char* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i)
    v |= static_cast<uint32_t>(static_cast<unsigned char>(p[i])) << (8 * i);
  return v;
}

std::string Reply(bool ok, std::string_view payload) {
  std::string out;
  out.push_back(ok ? 0 : 1);
  PutU32(out, static_cast<uint32_t>(payload.size()));
  out.append(payload);
  return out;
}

// Writes all of `data`, polling until the deadline.
bool WriteAll(int fd, std::string_view data, std::chrono::steady_clock::time_point deadline) {
  size_t done = 0;
  while (done < data.size()) {
    const ssize_t n =
        ::send(fd, data.data() + done, data.size() - done, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      done += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0) return false;
      pollfd p{fd, POLLOUT, 0};
      ::poll(&p, 1, static_cast<int>(std::min<int64_t>(left.count(), 1000)));
      continue;
    }
    return false;
  }
  return true;
}

}  // namespace

// The store's server: one thread polling the listening socket and every client.
class TcpStore::Server {
 public:
  ~Server() {
    if (wake_[1] >= 0) {
      const char c = 'x';
      (void)!::write(wake_[1], &c, 1);
    }
    if (thread_.joinable()) thread_.join();
    for (auto& [fd, client] : clients_) ::close(fd);
    for (int fd : {listen_fd_, wake_[0], wake_[1]}) {
      if (fd >= 0) ::close(fd);
    }
  }

  Status Start(int port, const std::string& where) {
    listen_fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (listen_fd_ < 0) return ErrnoStatus(errno, where + ": socket");
    const int one = 1;
    ::setsockopt(listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_ANY);
    addr.sin_port = htons(static_cast<uint16_t>(port));
    if (::bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
      return ErrnoStatus(errno, where + ": cannot bind the rendezvous port " +
                                    std::to_string(port) +
                                    " (is another agent or a stale rank using MASTER_PORT?)");
    }
    if (::listen(listen_fd_, 128) != 0) return ErrnoStatus(errno, where + ": listen");
    socklen_t len = sizeof(addr);
    ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len);
    port_ = ntohs(addr.sin_port);
    if (::pipe2(wake_, O_CLOEXEC) != 0) return ErrnoStatus(errno, where + ": pipe");
    thread_ = std::thread([this] { Loop(); });
    return Status::Ok();
  }

  int port() const { return port_; }

 private:
  struct Client {
    std::string in;
  };

  void Loop() {
    std::vector<pollfd> fds;
    for (;;) {
      fds.clear();
      fds.push_back({wake_[0], POLLIN, 0});
      fds.push_back({listen_fd_, POLLIN, 0});
      for (auto& [fd, client] : clients_) fds.push_back({fd, POLLIN, 0});
      if (::poll(fds.data(), fds.size(), -1) < 0) {
        if (errno == EINTR) continue;
        return;
      }
      if (fds[0].revents != 0) return;
      if (fds[1].revents & POLLIN) {
        const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
        if (fd >= 0) {
          const int one = 1;
          ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
          clients_[fd] = Client{};
        }
      }
      for (size_t i = 2; i < fds.size(); ++i) {
        if (fds[i].revents == 0) continue;
        if (!ReadFrom(fds[i].fd)) Drop(fds[i].fd);
      }
    }
  }

  // Reads what the client sent and serves every complete request; false when
  // the connection is gone or speaks garbage.
  bool ReadFrom(int fd) {
    char buf[65536];
    const ssize_t n = ::recv(fd, buf, sizeof(buf), MSG_DONTWAIT);
    if (n == 0) return false;
    if (n < 0) return errno == EAGAIN || errno == EINTR;
    std::string& in = clients_[fd].in;
    in.append(buf, static_cast<size_t>(n));
    for (;;) {
      if (in.size() < 5) return true;
      const uint32_t klen = GetU32(in.data() + 1);
      if (klen > kMaxField) return false;
      if (in.size() < 9 + klen) return true;
      const uint32_t vlen = GetU32(in.data() + 5 + klen);
      if (vlen > kMaxField) return false;
      if (in.size() < 9 + klen + vlen) return true;
      const char op = in[0];
      std::string key = in.substr(5, klen);
      std::string value = in.substr(9 + klen, vlen);
      in.erase(0, 9 + klen + vlen);
      if (!Serve(fd, op, std::move(key), std::move(value))) return false;
    }
  }

  bool Send(int fd, const std::string& reply) {
    return WriteAll(fd, reply, std::chrono::steady_clock::now() + std::chrono::seconds(5));
  }

  bool Serve(int fd, char op, const std::string& key, const std::string& value) {
    switch (op) {
      case 'S': {
        data_[key] = value;
        if (!Send(fd, Reply(true, {}))) return false;
        WakeWaiters(key);
        return true;
      }
      case 'G': {
        auto it = data_.find(key);
        if (it != data_.end()) return Send(fd, Reply(true, it->second));
        waiters_.emplace(std::move(key), fd);
        return true;
      }
      case 'A': {
        const long long delta = std::strtoll(value.c_str(), nullptr, 10);
        std::string& slot = data_[key];
        const long long now = (slot.empty() ? 0 : std::strtoll(slot.c_str(), nullptr, 10)) + delta;
        slot = std::to_string(now);
        if (!Send(fd, Reply(true, slot))) return false;
        WakeWaiters(key);
        return true;
      }
      default:
        Send(fd, Reply(false, std::string("unknown op '") + op + "'"));
        return false;
    }
  }

  void WakeWaiters(const std::string& key) {
    auto [begin, end] = waiters_.equal_range(key);
    std::vector<int> dead;
    for (auto it = begin; it != end; ++it) {
      if (!Send(it->second, Reply(true, data_[key]))) dead.push_back(it->second);
    }
    waiters_.erase(begin, end);
    for (int fd : dead) Drop(fd);
  }

  void Drop(int fd) {
    for (auto it = waiters_.begin(); it != waiters_.end();) {
      it = it->second == fd ? waiters_.erase(it) : std::next(it);
    }
    clients_.erase(fd);
    ::close(fd);
  }

  int listen_fd_ = -1;
  int wake_[2] = {-1, -1};
  int port_ = 0;
  std::thread thread_;
  // Touched only by the server thread.
  std::map<int, Client> clients_;
  std::unordered_map<std::string, std::string> data_;
  std::unordered_multimap<std::string, int> waiters_;
};

TcpStore::TcpStore(TcpStoreOptions options, std::unique_ptr<Server> server, int port)
    : options_(std::move(options)), server_(std::move(server)), port_(port) {}

TcpStore::~TcpStore() {
  if (fd_ >= 0) ::close(fd_);
  server_.reset();
}

std::string TcpStore::Where() const {
  return "rendezvous store " + options_.host + ":" + std::to_string(port_) + " (agent " +
         (options_.agent.empty() ? std::string("<unnamed>") : options_.agent) + " rank " +
         std::to_string(options_.rank) + ")";
}

Result<std::unique_ptr<TcpStore>> TcpStore::Create(const TcpStoreOptions& options) {
  std::unique_ptr<Server> server;
  int port = options.port;
  if (options.is_server) {
    server = std::make_unique<Server>();
    const std::string where =
        "rendezvous store (agent " + options.agent + " rank " + std::to_string(options.rank) + ")";
    AGENTRT_RETURN_IF_ERROR(server->Start(options.port, where));
    port = server->port();
  } else if (port <= 0 || port > 65535) {
    return InvalidArgument("rendezvous store (agent " + options.agent + " rank " +
                           std::to_string(options.rank) + "): MASTER_PORT " + std::to_string(port) +
                           " is not a port");
  }
  std::unique_ptr<TcpStore> store(new TcpStore(options, std::move(server), port));
  AGENTRT_RETURN_IF_ERROR(store->Connect());
  return store;
}

Status TcpStore::Connect() {
  if (fd_ >= 0) {
    ::close(fd_);
    fd_ = -1;
  }
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  const auto deadline = std::chrono::steady_clock::now() + options_.connect_timeout;
  auto backoff = std::chrono::milliseconds(20);
  std::string last_error = "no attempt";
  for (;;) {
    addrinfo* res = nullptr;
    const int gai =
        ::getaddrinfo(options_.host.c_str(), std::to_string(port_).c_str(), &hints, &res);
    if (gai != 0) {
      last_error = std::string("cannot resolve MASTER_ADDR: ") + ::gai_strerror(gai);
    } else {
      for (addrinfo* ai = res; ai != nullptr; ai = ai->ai_next) {
        const int fd = ::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
        if (fd < 0) continue;
        if (::connect(fd, ai->ai_addr, ai->ai_addrlen) == 0) {
          const int one = 1;
          ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
          fd_ = fd;
          break;
        }
        last_error = std::strerror(errno);
        ::close(fd);
      }
      ::freeaddrinfo(res);
      if (fd_ >= 0) return Status::Ok();
    }
    if (std::chrono::steady_clock::now() + backoff > deadline) {
      return Unavailable(Where() + ": cannot connect within " +
                         std::to_string(options_.connect_timeout.count()) + " ms (" + last_error +
                         "); is rank 0 of this agent running?");
    }
    std::this_thread::sleep_for(backoff);
    backoff = std::min(backoff * 2, std::chrono::milliseconds(500));
  }
}

Result<std::string> TcpStore::Call(char op, std::string_view key, std::string_view value,
                                   std::chrono::steady_clock::time_point deadline,
                                   Timeout timeout) {
  using Clock = std::chrono::steady_clock;
  if (fd_ < 0) AGENTRT_RETURN_IF_ERROR(Connect());
  std::string req;
  req.push_back(op);
  PutU32(req, static_cast<uint32_t>(key.size()));
  req.append(key);
  PutU32(req, static_cast<uint32_t>(value.size()));
  req.append(value);
  auto fail = [&](Status s) {
    // The reply to a request we gave up on must not be read as the next one's.
    ::close(fd_);
    fd_ = -1;
    return s;
  };
  const std::string what = std::string(op == 'S'   ? "set"
                                       : op == 'G' ? "get"
                                                   : "add") +
                           " of key '" + std::string(key) + "'";
  if (!WriteAll(fd_, req, deadline)) {
    return fail(Unavailable(Where() + ": " + what + ": cannot send to the store"));
  }
  std::string in;
  char buf[4096];
  for (;;) {
    if (in.size() >= 5) {
      const uint32_t len = GetU32(in.data() + 1);
      if (in.size() >= 5 + len) {
        std::string payload = in.substr(5, len);
        if (in[0] != 0) return fail(Internal(Where() + ": " + what + ": " + payload));
        return payload;
      }
    }
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() <= 0) {
      return fail(DeadlineExceeded(Where() + ": " + what + " timed out after " +
                                   std::to_string(timeout.count()) + " ms"));
    }
    pollfd p{fd_, POLLIN, 0};
    const int pr = ::poll(&p, 1, static_cast<int>(std::min<int64_t>(left.count(), 1000)));
    if (pr < 0 && errno != EINTR) return fail(ErrnoStatus(errno, Where() + ": poll"));
    if (pr <= 0) continue;
    const ssize_t n = ::recv(fd_, buf, sizeof(buf), 0);
    if (n == 0)
      return fail(Unavailable(Where() + ": " + what + ": the store closed the connection"));
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      return fail(ErrnoStatus(errno, Where() + ": " + what + ": recv"));
    }
    in.append(buf, static_cast<size_t>(n));
  }
}

Status TcpStore::Set(std::string_view key, std::string_view value, Timeout timeout) {
  std::lock_guard<std::mutex> lock(mu_);
  auto r = Call('S', key, value, std::chrono::steady_clock::now() + timeout, timeout);
  return r.ok() ? Status::Ok() : r.status();
}

Result<std::string> TcpStore::Get(std::string_view key, Timeout timeout) {
  std::lock_guard<std::mutex> lock(mu_);
  return Call('G', key, {}, std::chrono::steady_clock::now() + timeout, timeout);
}

Status TcpStore::Wait(const std::vector<std::string>& keys, Timeout timeout) {
  std::lock_guard<std::mutex> lock(mu_);
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (const std::string& key : keys) {
    auto r = Call('G', key, {}, deadline, timeout);
    if (!r.ok()) return r.status();
  }
  return Status::Ok();
}

Result<int64_t> TcpStore::Add(std::string_view key, int64_t delta, Timeout timeout) {
  std::lock_guard<std::mutex> lock(mu_);
  AGENTRT_ASSIGN_OR_RETURN(
      std::string v,
      Call('A', key, std::to_string(delta), std::chrono::steady_clock::now() + timeout, timeout));
  return static_cast<int64_t>(std::strtoll(v.c_str(), nullptr, 10));
}

Status TcpStore::Barrier(Timeout timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  std::string key;
  int64_t n = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    n = ++barrier_count_;
    key = "__agentrt/barrier/" + std::to_string(n);
  }
  const auto left = [&] {
    const auto l = std::chrono::duration_cast<Timeout>(deadline - std::chrono::steady_clock::now());
    return l.count() > 0 ? l : Timeout(1);
  };
  const auto said = [&](Status s) {
    if (s.ok()) return s;
    return s.WithContext("barrier " + std::to_string(n) + " of " +
                         std::to_string(options_.world_size) + " ranks");
  };
  AGENTRT_ASSIGN_OR_RETURN(const int64_t arrived, Add(key, 1, timeout));
  if (arrived >= options_.world_size) {
    AGENTRT_RETURN_IF_ERROR(said(Set(key + "/done", "1", left())));
  } else {
    AGENTRT_RETURN_IF_ERROR(said(Get(key + "/done", left()).status()));
  }
  if (options_.world_size <= 1) return Status::Ok();
  // Phase two keeps the server up until every other rank has its release:
  // the rank that hosts it may be the last to arrive and return at once, and
  // if it then exits, a peer whose wait the server had not yet read would
  // find the store gone. So the other ranks report that they are through,
  // and the host leaves only after all of them have.
  const std::string through = key + "/through";
  if (server_ != nullptr) return said(Get(through + "/all", left()).status());
  AGENTRT_ASSIGN_OR_RETURN(const int64_t out, Add(through, 1, left()));
  if (out >= options_.world_size - 1) return said(Set(through + "/all", "1", left()));
  return Status::Ok();
}

}  // namespace agentrt
