#include "agent_runtime/tcp_store.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <csignal>
#include <string>
#include <thread>
#include <vector>

namespace agentrt {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

std::unique_ptr<TcpStore> Server(int world_size, std::string agent = "store-test") {
  TcpStoreOptions o;
  o.is_server = true;
  o.port = 0;
  o.world_size = world_size;
  o.agent = std::move(agent);
  auto s = TcpStore::Create(o);
  if (!s.ok()) FAIL(s.status().ToString());
  return std::move(s).value();
}

// Catch2 assertions are not thread-safe: threads use TryClient and count failures.
std::unique_ptr<TcpStore> TryClient(int port, int rank, int world_size) {
  TcpStoreOptions o;
  o.port = port;
  o.rank = rank;
  o.world_size = world_size;
  o.agent = "store-test";
  o.connect_timeout = seconds(10);
  auto s = TcpStore::Create(o);
  return s.ok() ? std::move(s).value() : nullptr;
}

std::unique_ptr<TcpStore> Client(int port, int rank, int world_size) {
  auto c = TryClient(port, rank, world_size);
  if (c == nullptr) FAIL("cannot connect to the store on port " << port);
  return c;
}

TEST_CASE("store sets, gets, adds and overwrites values") {
  auto server = Server(1);
  REQUIRE(server->port() > 0);
  REQUIRE(server->Set("a", "1").ok());
  auto client = Client(server->port(), 1, 2);
  auto a = client->Get("a", seconds(5));
  REQUIRE(a.ok());
  CHECK(*a == "1");
  REQUIRE(client->Set("a", std::string("\0binary\xff", 8)).ok());
  CHECK(*server->Get("a", seconds(5)) == std::string("\0binary\xff", 8));
  CHECK(*client->Add("n", 5) == 5);
  CHECK(*server->Add("n", -2) == 3);
  CHECK(*client->Get("n", seconds(5)) == "3");
}

TEST_CASE("store Get waits until another client sets the key") {
  auto server = Server(2);
  auto waiter = Client(server->port(), 1, 2);
  std::atomic<int> failures{0};
  std::thread setter([port = server->port(), &failures] {
    auto c = TryClient(port, 0, 2);
    std::this_thread::sleep_for(milliseconds(200));
    if (c == nullptr || !c->Set("late", "here").ok()) failures++;
  });
  const auto t0 = std::chrono::steady_clock::now();
  auto v = waiter->Get("late", seconds(20));
  setter.join();
  REQUIRE(failures.load() == 0);
  REQUIRE(v.ok());
  CHECK(*v == "here");
  CHECK(std::chrono::steady_clock::now() - t0 >= milliseconds(150));
  REQUIRE(waiter->Wait({"late"}, seconds(5)).ok());
}

TEST_CASE("store Get and Wait time out naming the key, and the client recovers") {
  auto server = Server(1);
  auto client = Client(server->port(), 3, 4);
  const auto t0 = std::chrono::steady_clock::now();
  auto v = client->Get("never", milliseconds(300));
  REQUIRE_FALSE(v.ok());
  CHECK(v.status().code() == StatusCode::kDeadlineExceeded);
  CHECK_THAT(v.status().message(), Catch::Contains("'never'") && Catch::Contains("rank 3") &&
                                       Catch::Contains(std::to_string(server->port())));
  CHECK(std::chrono::steady_clock::now() - t0 < seconds(10));
  Status w = client->Wait({"never", "either"}, milliseconds(200));
  CHECK(w.code() == StatusCode::kDeadlineExceeded);
  // A late reply to the abandoned Get must not be read as the answer to the next call.
  REQUIRE(server->Set("never", "now").ok());
  REQUIRE(client->Set("x", "y").ok());
  CHECK(*client->Get("x", seconds(5)) == "y");
  CHECK(*client->Get("never", seconds(5)) == "now");
}

TEST_CASE("store barrier holds every thread until all ranks arrive, repeatedly") {
  const int world = 4;
  auto server = Server(world);
  std::atomic<int> arrived{0};
  std::atomic<int> early_leavers{0};
  std::atomic<int> failures{0};
  std::vector<std::thread> ranks;
  for (int r = 1; r < world; ++r) {
    ranks.emplace_back([&, r] {
      auto c = TryClient(server->port(), r, world);
      if (c == nullptr) {
        failures++;
        return;
      }
      for (int round = 0; round < 3; ++round) {
        std::this_thread::sleep_for(milliseconds(20 * r));
        arrived++;
        if (!c->Barrier(seconds(20)).ok()) failures++;
        if (arrived.load() < world * (round + 1)) early_leavers++;
        if (!c->Barrier(seconds(20)).ok()) failures++;  // nobody starts the next round early
      }
    });
  }
  for (int round = 0; round < 3; ++round) {
    arrived++;
    CHECK(server->Barrier(seconds(20)).ok());
    if (arrived.load() < world * (round + 1)) early_leavers++;
    CHECK(server->Barrier(seconds(20)).ok());
  }
  for (auto& t : ranks) t.join();
  CHECK(failures.load() == 0);
  CHECK(early_leavers.load() == 0);
  CHECK(arrived.load() == 3 * world);
}

TEST_CASE("store barrier times out when a rank never arrives") {
  auto server = Server(2);
  Status s = server->Barrier(milliseconds(300));
  CHECK(s.code() == StatusCode::kDeadlineExceeded);
  CHECK_THAT(s.message(), Catch::Contains("barrier 1 of 2 ranks"));
}

// The rank that hosts the server may arrive last. Were it to leave at once and
// exit, a peer whose wait the server had not read yet would find the store
// gone (CI once saw "get of key '__agentrt/barrier/2/done': recv: Connection
// reset by peer"). So the host leaves only once every peer is through: here a
// peer stopped right after arriving holds the host's barrier up.
TEST_CASE("store barrier: the server's rank leaves only after every peer is released") {
  auto server = Server(2);
  const int port = server->port();
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    TcpStoreOptions o;
    o.port = port;
    o.rank = 1;
    o.world_size = 2;
    o.connect_timeout = seconds(10);
    auto c = TcpStore::Create(o);
    if (!c.ok()) ::_exit(10);
    ::_exit((*c)->Barrier(seconds(20)).ok() ? 0 : 11);
  }
  // Wait (bounded) until the peer has arrived, then stop it.
  const auto deadline = std::chrono::steady_clock::now() + seconds(20);
  int64_t arrived = 0;
  while (arrived < 1 && std::chrono::steady_clock::now() < deadline) {
    arrived = server->Add("__agentrt/barrier/1", 0, seconds(5)).value_or(0);
    if (arrived < 1) std::this_thread::sleep_for(milliseconds(5));
  }
  REQUIRE(arrived == 1);
  REQUIRE(::kill(pid, SIGSTOP) == 0);
  const Status held = server->Barrier(milliseconds(500));
  CHECK(held.code() == StatusCode::kDeadlineExceeded);
  CHECK_THAT(held.message(), Catch::Contains("barrier 1 of 2 ranks"));
  REQUIRE(::kill(pid, SIGCONT) == 0);
  int status = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
}

TEST_CASE("store serves clients in other processes") {
  const int world = 3;
  auto server = Server(world);
  const int port = server->port();
  std::vector<pid_t> children;
  for (int r = 1; r < world; ++r) {
    const pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      // Child: its own client; exit code 0 only when every step worked.
      TcpStoreOptions o;
      o.port = port;
      o.rank = r;
      o.world_size = world;
      o.connect_timeout = seconds(10);
      auto c = TcpStore::Create(o);
      if (!c.ok()) ::_exit(10);
      if (!(*c)->Set("rank/" + std::to_string(r), std::to_string(r * 100)).ok()) ::_exit(11);
      if (!(*c)->Barrier(seconds(20)).ok()) ::_exit(12);
      auto peer = (*c)->Get("rank/" + std::to_string(world - r), seconds(20));
      if (!peer.ok() || *peer != std::to_string((world - r) * 100)) ::_exit(13);
      auto total = (*c)->Add("total", r);
      if (!total.ok()) ::_exit(14);
      if (!(*c)->Barrier(seconds(20)).ok()) ::_exit(15);
      ::_exit(0);
    }
    children.push_back(pid);
  }
  REQUIRE(server->Barrier(seconds(20)).ok());
  REQUIRE(server->Barrier(seconds(20)).ok());
  CHECK(*server->Get("total", seconds(5)) == "3");
  for (pid_t pid : children) {
    int status = 0;
    REQUIRE(::waitpid(pid, &status, 0) == pid);
    CHECK(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == 0);
  }
}

TEST_CASE("store reports a busy port and an absent server clearly") {
  auto server = Server(1);
  TcpStoreOptions o;
  o.is_server = true;
  o.port = server->port();
  o.agent = "second";
  auto busy = TcpStore::Create(o);
  REQUIRE_FALSE(busy.ok());
  CHECK_THAT(busy.status().message(), Catch::Contains("port " + std::to_string(server->port())));

  // A port nobody listens on: bind one, note it, close it.
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0);
  socklen_t len = sizeof(addr);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  const int dead_port = ntohs(addr.sin_port);
  ::close(fd);
  TcpStoreOptions c;
  c.port = dead_port;
  c.agent = "lonely";
  c.rank = 1;
  c.connect_timeout = milliseconds(300);
  auto absent = TcpStore::Create(c);
  REQUIRE_FALSE(absent.ok());
  CHECK(absent.status().code() == StatusCode::kUnavailable);
  CHECK_THAT(absent.status().message(),
             Catch::Contains("agent lonely rank 1") && Catch::Contains("rank 0"));
}

TEST_CASE("two agents' stores on distinct ports never see each other's keys") {
  auto a = Server(1, "agent-a");
  auto b = Server(1, "agent-b");
  REQUIRE(a->port() != b->port());
  REQUIRE(a->Set("who", "a").ok());
  REQUIRE(b->Set("who", "b").ok());
  CHECK(*a->Get("who", seconds(5)) == "a");
  CHECK(*b->Get("who", seconds(5)) == "b");
}

}  // namespace
}  // namespace agentrt
