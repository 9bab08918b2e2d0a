// The run's broker as a process of its own (scheduler/broker_process.h): the
// real agentrt-bus started from a prepared run directory, killed with -9 and
// started again on its port with its durable log, an acknowledged message
// still there; a port taken by another program; a program that is missing.
#include "scheduler/broker_process.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "common/net.h"
#include "comms/auth.h"
#include "comms/bus_client.h"
#include "comms/run_ca.h"
#include "scheduler/loader.h"
#include "scheduler/run_driver.h"
#include "tests/common/programs.h"
#include "tests/common/temp_dir.h"

namespace agentrt {
namespace {

using Catch::Matchers::Contains;
using testing::TempDir;

// A prepared run of one agent allowed to publish and read topic "t", with
// the durable log, its secret and token.
struct PreparedBus {
  TempDir scratch;
  std::optional<PreparedRun> run;

  explicit PreparedBus(bool tls = false) {
    auto config = LoadConfigString(
        "run: {name: brk}\n"
        "cluster: {nodes: [{name: n1, cpus: 4}], ports: {first: 33100, last: 33199, per_agent: "
        "8}}\n" +
            std::string(tls ? "bus: {durability: always, tls: on}\n"
                            : "bus: {durability: always}\n") +
            "agents: [{name: a}]\n"
            "channels: [{topic: t, publishers: [a], subscribers: [a]}]\n",
        scratch.Path("agents.yaml"));
    REQUIRE(config.ok());
    config->run.dir = scratch.Path("runs");
    auto prepared = PrepareRun(*config, InventoryRequest{}, nullptr);
    REQUIRE(prepared.ok());
    run = std::move(prepared).value();
    auto secret = run->dir.LoadOrCreateSecret();
    REQUIRE(secret.ok());
    REQUIRE(WriteAgentTokens(run->dir, *secret, run->plan).ok());
    REQUIRE(PrepareBusTls(run->dir, run->plan.bus, /*beyond_loopback=*/false, {"a"}).ok());
    REQUIRE(WriteRunPlan(run->plan, run->dir.path()).ok());  // what the broker reads
  }
  const RunDir& dir() const { return run->dir; }
  BrokerProcessOptions Options(int port) const {
    BrokerProcessOptions o;
    o.program = testing::ProgramPath("agentrt-bus");
    o.port = port;
    return o;
  }
  std::unique_ptr<BusClient> Client(int port) const {
    auto credential = ReadTokenFile(dir().TokenPath("a"));
    REQUIRE(credential.ok());
    BusClientOptions options;
    options.tls_ca_file = run->plan.bus.settings.ClientCaFile();
    auto client =
        BusClient::Connect("127.0.0.1:" + std::to_string(port), *credential, std::move(options));
    REQUIRE(client.ok());
    return std::move(client).value();
  }
};

// Supervise() until a line containing `part` comes (bounded); every line seen.
std::vector<std::string> SuperviseUntil(BrokerProcess& broker, const std::string& part) {
  std::vector<std::string> seen;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (std::chrono::steady_clock::now() < deadline) {
    for (std::string& line : broker.Supervise()) {
      const bool found = line.find(part) != std::string::npos;
      seen.push_back(std::move(line));
      if (found) return seen;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  FAIL("no line with '" << part << "' within 30 s");
  return seen;
}

TEST_CASE("a broker killed with -9 serves again on its port with its log and incarnation") {
  const bool tls = GENERATE(false, true);
  INFO((tls ? "TLS" : "plaintext"));
  PreparedBus bus(tls);
  CHECK(bus.run->plan.bus.settings.tls == (tls ? kBusTlsOn : kBusTlsOff));
  const int port = bus.run->plan.bus.port;
  auto started = BrokerProcess::Start(bus.dir(), bus.Options(port));
  REQUIRE(started.ok());
  BrokerProcess& broker = **started;
  const pid_t first = broker.pid();
  REQUIRE(first > 0);
  std::optional<BrokerReport> report = broker.Report();
  REQUIRE(report);
  CHECK(report->pid == first);
  CHECK(report->port == port);
  CHECK(report->bus.broker_restarts == 0);
  const uint64_t incarnation = report->incarnation;

  auto client = bus.Client(port);
  PublishOptions po;
  po.timeout = std::chrono::seconds(10);
  auto ack = client->Publish("t", "before the kill", po);
  REQUIRE(ack.ok());

  REQUIRE(::kill(first, SIGKILL) == 0);
  std::vector<std::string> lines = SuperviseUntil(broker, "serves again");
  CHECK_THAT(lines.front(),
             Contains("(pid " + std::to_string(first) + ") was killed by signal 9") &&
                 Contains("starting it again on port " + std::to_string(port)));
  CHECK_THAT(lines.back(), Contains("restart 1"));
  CHECK(broker.restarts() == 1);
  CHECK(broker.pid() != first);
  report = broker.Report();
  REQUIRE(report);
  CHECK(report->pid == broker.pid());
  CHECK(report->incarnation == incarnation);  // the same log: saved positions stay valid
  CHECK(report->bus.broker_restarts == 1);

  // The acknowledged message is there, and the same client publishes again.
  auto got = client->Fetch("t", ack->offset, 10, std::chrono::seconds(10));
  INFO(got.status().ToString());
  REQUIRE(got.ok());
  REQUIRE(got->size() == 1);
  CHECK(got->at(0).payload() == "before the kill");
  auto again = client->Publish("t", "after", po);
  REQUIRE(again.ok());
  CHECK(again->offset == ack->offset + 1);

  // A clean stop: SIGTERM, the broker exits and removes its address file.
  const pid_t second = broker.pid();
  broker.Shutdown(std::chrono::seconds(5));
  CHECK(broker.pid() == 0);
  CHECK(::kill(second, 0) != 0);
  CHECK_FALSE(std::filesystem::exists(bus.dir().BusAddressPath()));
  CHECK(broker.Supervise().empty());  // stopped on purpose: not started again
}

TEST_CASE("a broker whose port is taken says so (the driver then moves an auto port on)") {
  PreparedBus bus;
  const int port = bus.run->plan.bus.port;
  const int holder = ::socket(AF_INET, SOCK_STREAM, 0);
  REQUIRE(holder >= 0);
  const int one = 1;  // the port may still be in TIME_WAIT from the test before
  REQUIRE(::setsockopt(holder, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) == 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::bind(holder, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
  REQUIRE(::listen(holder, 1) == 0);
  auto started = BrokerProcess::Start(bus.dir(), bus.Options(port));
  ::close(holder);
  REQUIRE_FALSE(started.ok());
  CHECK(started.status().code() == StatusCode::kAlreadyExists);
  CHECK_THAT(started.status().message(),
             Contains("cannot listen on 127.0.0.1:" + std::to_string(port)));
}

TEST_CASE("a broker program that is not there is named") {
  PreparedBus bus;
  BrokerProcessOptions o = bus.Options(bus.run->plan.bus.port);
  o.program = bus.scratch.Path("no-such-agentrt-bus");
  auto started = BrokerProcess::Start(bus.dir(), o);
  REQUIRE_FALSE(started.ok());
  CHECK_THAT(started.status().message(),
             Contains("cannot start the bus broker") && Contains("no-such-agentrt-bus"));
}

}  // namespace
}  // namespace agentrt
