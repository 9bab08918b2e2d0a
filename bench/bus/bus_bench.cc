// bench/bus: the agentrt message bus on loopback, broker and clients as
// separate processes, each figure against its anchor measured in the same run.
//
//   latency    64 B, publish -> delivered to a subscriber (p50, p99)
//              anchor: a raw gRPC unary ping-pong (echo.proto), round trip
//   throughput 64 B messages, 1 publisher -> 1 subscriber (msg/s)
//              anchor: ZeroMQ PUSH/PULL of the same messages
//   bandwidth  1 MiB messages (MB/s), anchor: ZeroMQ PUSH/PULL of 1 MiB;
//              and what a kept 1 MiB payload's memory costs (a write into
//              fresh shared memory; the broker's check and a subscriber's
//              read of it out of the caches; a write into pages a file has),
//              anchor: ZeroMQ's time per 1 MiB message
//   durable    64 B throughput with the durable log (batch), anchor: the same
//              flow through a memory-only broker
//   recovery   a new broker reading back 1 GiB of log (1 MiB messages),
//              anchor: reading the same files once with read(2)
//   weights    one 256 MiB weight-stream version (comms/weight_stream.h) to 4
//              subscriber processes on the broker's node, each loading every
//              tensor into its own buffers (one copy, as load_weights does),
//              and (`_views`) a stream's next version, published with
//              PublishAsync, until each holds it as views of the broker's
//              file: aggregate GB/s, anchor: the ZeroMQ fan-out below; and the
//              publisher's stall (Publish until it returns), anchor: one
//              memcpy of the same bytes; the same stall of PublishAsync once
//              its slot is ready (a training loop's steady state), same
//              anchor; and (not --quick) one 1 GiB version (the
//              bus's ceiling, header included)
//              to 8 subscribers, both ways, anchor: the memcpy floor (8 copies
//              of 1 GiB one after another, GB/s of bytes delivered); the
//              views also against ZeroMQ to 8 receivers (one buffer sent
//              to all 8 without a copy)
//   delta      a 256 MiB policy with 1% of its values changed, to a reader
//              that holds the version before and streams every byte: the
//              bytes that reached it and its time to hold the new version,
//              anchor: the same version read whole
//   fanout     one 256 MiB message to 4 subscriber processes (aggregate GB/s,
//              publish start to the last delivery), the subscribers reading the
//              payload's file themselves (same node) and, `streamed`, sent its
//              chunks by the broker; anchor: ZeroMQ sending the same bytes to 4
//              PULL processes over 4 PUSH sockets
//
// The program re-executes itself for each role (broker, echo server,
// subscribers, ZeroMQ receiver); the parent is the publisher. Times are
// CLOCK_MONOTONIC, which all processes of the machine share; payloads carry
// their send time. Each figure is the median of its repetitions.
//
//   bench_bus [--quick]
//   bench_bus --flows       (only the 64 B and 1 MiB flows, medians of 5)
#include <fcntl.h>
#include <grpcpp/grpcpp.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <string>
#include <thread>
#include <vector>
#include <zmq.hpp>

#include "bench/figure.h"
#include "common/crc32c.h"
#include "common/file_util.h"
#include "comms/auth.h"
#include "comms/bus_client.h"
#include "comms/bus_server.h"
#include "comms/bus_validate.h"
#include "comms/weight_stream.h"
#include "echo.grpc.pb.h"
#include "plan/mpi_shm.h"

namespace {

using agentrt::bench::Median;

using agentrt::BusClient;
using agentrt::BusMessage;
using Clock = std::chrono::steady_clock;
constexpr char kSecret[] = "bench-secret-bench-secret-bench!";

int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch())
      .count();
}

// Payload: [send_ns int64][index int64][padding].
std::string MakePayload(size_t size) { return std::string(std::max<size_t>(size, 16), 'x'); }
void Stamp(std::string* p, int64_t index) {
  const int64_t now = NowNs();
  std::memcpy(p->data(), &now, 8);
  std::memcpy(p->data() + 8, &index, 8);
}
int64_t SendNs(const std::string& p) {
  int64_t v = 0;
  std::memcpy(&v, p.data(), 8);
  return v;
}

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "bench_bus: %s\n", what.c_str());
  std::exit(1);
}

std::unique_ptr<BusClient> Connect(const std::string& address, const std::string& agent) {
  auto c = BusClient::Connect(
      address, agentrt::Credential{agent, agentrt::DeriveAgentToken(kSecret, agent)});
  if (!c.ok()) Die(c.status().ToString());
  if (auto s = c.value()->WaitForReady(std::chrono::seconds(30)); !s.ok()) Die(s.ToString());
  return std::move(c).value();
}

double CpuMs() {
  rusage ru{};
  ::getrusage(RUSAGE_SELF, &ru);
  return static_cast<double>(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) * 1e3 +
         static_cast<double>(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e3;
}

void Ready(const std::string& extra = "") {
  std::printf("ready %s\n", extra.c_str());
  std::fflush(stdout);
}

void WaitForSigterm() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  int sig = 0;
  sigwait(&set, &sig);
}

// ---- roles (child processes) ----

// log_dir empty: durability memory; else batch, its log there.
int RunBroker(const std::string& log_dir, const std::string& host) {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  agentrt::BusServerOptions opts;
  opts.host = host;
  // Message retention stays the bus's default (bus.retention: 100000 per
  // topic), so a flow longer than that runs at the bound a long training
  // runs at (the oldest messages dropped, their storage reused); bytes are
  // raised for the 1 GiB weight versions.
  opts.broker.retention_bytes = int64_t{3} << 30;
  opts.broker.limits.max_message_bytes = agentrt::kMaxMessageBytesCeiling;
  if (!log_dir.empty()) {
    opts.broker.log_dir = log_dir;
    opts.broker.durability = agentrt::BusDurability::kBatch;
  } else if (std::filesystem::is_directory("/dev/shm")) {
    // A memory broker keeps its payload files (and spool) in memory too, as
    // ZeroMQ keeps its messages: not in /tmp, whose disk writes back.
    opts.broker.spill_root = "/dev/shm";
  }
  agentrt::BusAcl acl;
  acl.open = true;
  auto server = agentrt::BusServer::Start(opts, kSecret, acl);
  if (!server.ok()) Die(server.status().ToString());
  Ready(server.value()->address());
  WaitForSigterm();
  server.value()->Shutdown();
  std::fprintf(stderr, "bench_bus: broker used %.0f ms of CPU\n", CpuMs());
  return 0;
}

class EchoService final : public agentrt::bench::Echo::Service {
  grpc::Status Ping(grpc::ServerContext*, const agentrt::bench::EchoMessage* req,
                    agentrt::bench::EchoMessage* resp) override {
    *resp = *req;
    return grpc::Status::OK;
  }
};

int RunEchoServer() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  EchoService service;
  grpc::ServerBuilder b;
  int port = 0;
  b.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  b.RegisterService(&service);
  auto server = b.BuildAndStart();
  if (!server || port == 0) Die("echo server did not start");
  Ready("127.0.0.1:" + std::to_string(port));
  WaitForSigterm();
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
  return 0;
}

// Subscribes to `topic` from offset 0, prints "ready" once connected, and
// after `n` messages prints "result <first_send_ns> <last_recv_ns> <bytes>
// <delivered>" followed by one latency (ns) per message when `latencies` is
// set. A subscriber that fell behind retention (the broker keeps 100000
// messages a topic) skips to the earliest message held and says how many it
// lost: they count towards `n`, not towards `delivered`.
int RunBusSubscriber(const std::string& address, const std::string& topic, int64_t n,
                     bool latencies) {
  auto client = Connect(address, "bench-sub");
  std::vector<int64_t> lat;
  lat.reserve(static_cast<size_t>(latencies ? n : 0));
  std::mutex mu;
  std::condition_variable cv;
  int64_t count = 0, first_send = 0, last_recv = 0, bytes = 0;
  std::atomic<int64_t> skipped{0};
  agentrt::SubscribeOptions opts;
  opts.skip_expired = true;
  opts.on_event = [&](const agentrt::SubscriptionEvent& e) {
    if (e.kind == agentrt::SubscriptionEvent::Kind::kConnected) Ready();
    if (e.kind == agentrt::SubscriptionEvent::Kind::kFailed) Die(e.status.ToString());
    if (e.kind == agentrt::SubscriptionEvent::Kind::kOffsetExpired) {
      skipped += e.earliest - e.offset;
      std::fprintf(stderr, "bench_bus: subscriber of %s fell behind retention: %lld lost\n",
                   topic.c_str(), static_cast<long long>(e.earliest - e.offset));
    }
  };
  auto id = client->Subscribe(
      topic, agentrt::StartAt::Offset(0),
      [&](const BusMessage& m) {
        const int64_t now = NowNs();
        const int64_t sent = SendNs(m.payload());
        if (count == 0) first_send = sent;
        if (latencies) lat.push_back(now - sent);
        bytes += static_cast<int64_t>(m.payload().size());
        if (++count + skipped.load() >= n) {
          last_recv = now;
          std::lock_guard<std::mutex> l(mu);
          cv.notify_all();
        }
      },
      opts);
  if (!id.ok()) Die(id.status().ToString());
  {
    std::unique_lock<std::mutex> l(mu);
    if (!cv.wait_for(l, std::chrono::seconds(120), [&] { return last_recv != 0; }))
      Die("subscriber timed out");
  }
  (void)client->Unsubscribe(id.value());
  std::fprintf(stderr, "bench_bus: subscriber of %s used %.0f ms of CPU\n", topic.c_str(), CpuMs());
  std::printf("result %lld %lld %lld %lld\n", static_cast<long long>(first_send),
              static_cast<long long>(last_recv), static_cast<long long>(bytes),
              static_cast<long long>(count));
  for (int64_t v : lat) std::printf("%lld\n", static_cast<long long>(v));
  std::fflush(stdout);
  return 0;
}

// A weight-stream subscriber: waits for the first version after `after` and
// loads it: "copy" each tensor into buffers of its own (as
// agentrt.torch.load_weights does), "views" holding the tensors where they
// are (the mapping, CRC-checked when opened; as weights_tensors gives them),
// "streamed" holding them where they are too, streamed to it (another node).
int RunWeightsSubscriber(const std::string& address, const std::string& stream,
                         const std::string& how, int64_t after) {
  auto client = Connect(address, "bench-sub");
  agentrt::WeightStream in(*client, stream);
  Ready();
  auto set = in.WaitNewer(after, std::chrono::seconds(120));
  if (!set.ok()) Die(set.status().ToString());
  int64_t bytes = 0;
  std::vector<std::vector<char>> model;
  std::vector<const void*> views;
  for (const auto& e : (*set)->entries()) {
    if (how != "copy") {
      views.push_back((*set)->Data(e));
    } else {
      model.emplace_back(e.bytes);
      std::memcpy(model.back().data(), (*set)->Data(e), e.bytes);
    }
    bytes += static_cast<int64_t>(e.bytes);
  }
  const int64_t done = NowNs();
  // Streamed: to this process, or to another of this node that left it in
  // the node's folder (BusClient::NodeCacheDir), mapped from there.
  const std::string node_dir = how == "streamed" ? client->NodeCacheDir() : "";
  const bool from_node =
      (*set)->mapped() && !node_dir.empty() && (*set)->path().rfind(node_dir + "/", 0) == 0;
  if (how == "streamed" ? (*set)->mapped() && !from_node : !(*set)->mapped() || from_node)
    Die(how == "streamed" ? "the version was mapped from the broker's file, not streamed"
                          : "the version was not mapped from the broker's file");
  std::printf("result 0 %lld %lld\n", static_cast<long long>(done), static_cast<long long>(bytes));
  std::fflush(stdout);
  return 0;
}

// A weight-stream reader on "another node" (AGENTRT_BUS_LOCAL_FILES=0, set
// by the parent: every byte streamed), with delta versions on or off: holds
// the newest version, says "held", and once the parent's SIGUSR1 says the
// next is published, reads it and says when it started and held it and how
// many bytes reached it for it.
int RunWeightsDeltaSubscriber(const std::string& address, const std::string& stream, bool delta) {
  sigset_t usr1;
  sigemptyset(&usr1);
  sigaddset(&usr1, SIGUSR1);
  pthread_sigmask(SIG_BLOCK, &usr1, nullptr);  // before any thread starts: taken by sigwait
  auto client = Connect(address, "bench-sub");
  agentrt::WeightStream in(*client, stream, 0, {.delta = delta});
  Ready();
  auto v1 = in.WaitNewer(0, std::chrono::seconds(120));
  if (!v1.ok()) Die(v1.status().ToString());
  const agentrt::WeightStreamStats before = in.stats();
  std::printf("held\n");
  std::fflush(stdout);
  int sig = 0;
  sigwait(&usr1, &sig);
  const int64_t start = NowNs();
  auto v2 = in.WaitNewer((*v1)->version(), std::chrono::seconds(120));
  if (!v2.ok()) Die(v2.status().ToString());
  const int64_t done = NowNs();
  const agentrt::WeightStreamStats after = in.stats();
  const int64_t bytes = after.delta_bytes_read - before.delta_bytes_read + after.whole_bytes_read -
                        before.whole_bytes_read;
  if (delta && after.versions_from_delta != 1) Die("the next version was not read from its delta");
  std::printf("result %lld %lld %lld\n", static_cast<long long>(start),
              static_cast<long long>(done), static_cast<long long>(bytes));
  std::fflush(stdout);
  return 0;
}

int RunZmqPull(int64_t n, const std::string& host) {
  zmq::context_t ctx(1);
  zmq::socket_t pull(ctx, zmq::socket_type::pull);
  pull.set(zmq::sockopt::rcvhwm, 0);
  pull.bind("tcp://" + host + ":*");
  Ready(pull.get(zmq::sockopt::last_endpoint));
  int64_t first_send = 0, last_recv = 0, bytes = 0;
  zmq::message_t msg;
  for (int64_t i = 0; i < n; ++i) {
    if (!pull.recv(msg, zmq::recv_flags::none)) Die("zmq recv failed");
    if (i == 0) std::memcpy(&first_send, msg.data(), 8);
    bytes += static_cast<int64_t>(msg.size());
  }
  last_recv = NowNs();
  std::printf("result %lld %lld %lld\n", static_cast<long long>(first_send),
              static_cast<long long>(last_recv), static_cast<long long>(bytes));
  std::fflush(stdout);
  return 0;
}

// ---- parent: child processes and measurements ----

struct Child {
  pid_t pid = -1;
  FILE* out = nullptr;

  std::string ReadLine(int timeout_s = 60) {
    pollfd p{fileno(out), POLLIN, 0};
    if (::poll(&p, 1, timeout_s * 1000) <= 0) Die("a child process did not answer in time");
    char* line = nullptr;
    size_t cap = 0;
    ssize_t n = ::getline(&line, &cap, out);
    std::string s = n > 0 ? std::string(line, static_cast<size_t>(n)) : std::string();
    std::free(line);
    while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
    if (n <= 0) Die("a child process ended early");
    return s;
  }
  std::string WaitReady() {
    std::string l = ReadLine();
    if (l.rfind("ready", 0) != 0) Die("unexpected child output: " + l);
    return l.size() > 6 ? l.substr(6) : "";
  }
  void Stop() {
    if (pid > 0) {
      ::kill(pid, SIGTERM);
      ::waitpid(pid, nullptr, 0);
      pid = -1;
    }
    if (out) ::fclose(out);
    out = nullptr;
  }
};

// Where a child runs: here, or in another node's network namespace (a
// multi-node test cluster's), reached at `host`.
struct Node {
  std::string netns;  // "": here
  std::string host = "127.0.0.1";
};

Child Spawn(const std::vector<std::string>& args, const Node& node = {}) {
  const std::string exe = agentrt::bench::SelfPath();
  if (exe.empty()) Die("cannot read /proc/self/exe");
  int fds[2];
  if (::pipe(fds) != 0) Die("pipe");
  const pid_t parent = ::getpid();
  pid_t pid = ::fork();
  if (pid < 0) Die("fork");
  if (pid == 0) {
    // A bench killed (the OOM killer, ^C) takes its brokers and subscribers
    // with it: a broker's SIGTERM removes its files. (Spawn runs on the main
    // thread, whose end is the process's.)
    if (::prctl(PR_SET_PDEATHSIG, SIGTERM) != 0 || ::getppid() != parent) ::_exit(127);
    ::dup2(fds[1], 1);
    ::close(fds[0]);
    ::close(fds[1]);
    std::vector<std::string> words;
    if (!node.netns.empty()) {
      // Another node reads nothing of the broker's files: its bytes come
      // over the link.
      ::setenv("AGENTRT_BUS_LOCAL_FILES", "0", 1);
      words = {"ip", "netns", "exec", node.netns};
    }
    words.push_back(exe);
    words.insert(words.end(), args.begin(), args.end());
    std::vector<char*> argv;
    for (auto& w : words) argv.push_back(w.data());
    argv.push_back(nullptr);
    ::execvp(argv[0], argv.data());
    ::_exit(127);
  }
  ::close(fds[1]);
  return Child{pid, ::fdopen(fds[0], "r")};
}

// A broker with its durable log (`durability: batch`, agentctl's default) in
// a folder of its own, removed when it stops.
struct DurableBroker {
  std::string log_dir;
  Child child;
  std::string address;

  static DurableBroker Start() {
    char tmpl[] = "/tmp/agentrt-bench-buslog.XXXXXX";
    if (::mkdtemp(tmpl) == nullptr) Die("mkdtemp failed");
    DurableBroker b;
    b.log_dir = tmpl;
    b.child = Spawn({"broker", b.log_dir});
    b.address = b.child.WaitReady();
    return b;
  }
  void Stop() {
    child.Stop();
    std::error_code ec;
    std::filesystem::remove_all(log_dir, ec);
  }
};

struct Flow {
  double rate = 0;  // messages/s
  double mbps = 0;  // MB/s (1e6 bytes)
};

// A subscriber's result line: messages (those delivered, when it says) and
// bytes per second from the first send to the last delivery.
Flow ParseResult(const std::string& line, int64_t n) {
  long long first = 0, last = 0, bytes = 0, delivered = n;
  if (std::sscanf(line.c_str(), "result %lld %lld %lld %lld", &first, &last, &bytes, &delivered) <
      3)
    Die("bad result: " + line);
  const double s = static_cast<double>(last - first) / 1e9;
  return Flow{static_cast<double>(delivered) / s, static_cast<double>(bytes) / 1e6 / s};
}

double Percentile(std::vector<int64_t> v, double p) {
  std::sort(v.begin(), v.end());
  return static_cast<double>(
      v[std::min(v.size() - 1, static_cast<size_t>(p * static_cast<double>(v.size())))]);
}

Flow BusFlow(const std::string& address, const std::string& topic, int64_t n, size_t size) {
  Child sub = Spawn({"bus-sub", address, topic, std::to_string(n), "0"});
  sub.WaitReady();
  auto pub = Connect(address, "bench-pub");
  std::string payload = MakePayload(size);
  for (int64_t i = 0; i < n; ++i) {
    Stamp(&payload, i);
    pub->PublishAsync(topic, payload);
  }
  const int64_t t0 = NowNs();
  if (auto s = pub->Flush(std::chrono::seconds(120)); !s.ok()) Die(s.ToString());
  const int64_t flushed = NowNs();
  Flow f = ParseResult(sub.ReadLine(120), n);
  std::fprintf(
      stderr,
      "bench_bus: %s: %lld x %zu B, publisher flushed %.1f ms after its last message; %.0f msg/s\n",
      topic.c_str(), static_cast<long long>(n), size, static_cast<double>(flushed - t0) / 1e6,
      f.rate);
  sub.Stop();
  return f;
}

Flow ZmqFlow(int64_t n, size_t size) {
  Child pull = Spawn({"zmq-pull", std::to_string(n)});
  const std::string endpoint = pull.WaitReady();
  zmq::context_t ctx(1);
  zmq::socket_t push(ctx, zmq::socket_type::push);
  push.set(zmq::sockopt::sndhwm, 0);
  push.connect(endpoint);
  std::string payload = MakePayload(size);
  for (int64_t i = 0; i < n; ++i) {
    Stamp(&payload, i);
    push.send(zmq::buffer(payload), zmq::send_flags::none);
  }
  Flow f = ParseResult(pull.ReadLine(120), n);
  push.close();
  pull.Stop();
  return f;
}

// One `size`-byte message to `subs` subscriber processes: bytes delivered in
// all (GB/s, 1e9) from the start of the publish to the last delivery.
double BusFanout(const std::string& address, const std::string& topic, size_t size, int subs,
                 bool streamed) {
  std::vector<Child> readers;
  ::setenv("AGENTRT_BUS_LOCAL_FILES", streamed ? "0" : "1", 1);  // inherited by the subscribers
  for (int i = 0; i < subs; ++i) {
    readers.push_back(Spawn({"bus-sub", address, topic, "1", "0"}));
    readers.back().WaitReady();
  }
  ::unsetenv("AGENTRT_BUS_LOCAL_FILES");
  auto pub = Connect(address, "bench-pub");
  std::string payload = MakePayload(size);
  Stamp(&payload, 0);
  const int64_t t0 = SendNs(payload);
  agentrt::PublishOptions opts;
  opts.timeout = std::chrono::seconds(120);
  if (auto ack = pub->Publish(topic, payload, opts); !ack.ok()) Die(ack.status().ToString());
  const int64_t stored = NowNs();
  int64_t last = 0;
  for (auto& r : readers) {
    long long first = 0, recv = 0, bytes = 0;
    const std::string line = r.ReadLine(120);
    if (std::sscanf(line.c_str(), "result %lld %lld %lld", &first, &recv, &bytes) != 3 ||
        bytes != static_cast<long long>(size))
      Die("bad fan-out result: " + line);
    last = std::max<int64_t>(last, recv);
    r.Stop();
  }
  const double gbps = static_cast<double>(size) * subs / static_cast<double>(last - t0);
  std::fprintf(stderr,
               "bench_bus: %zu MiB to %d subscribers (%s): stored after %.0f ms, all delivered "
               "after %.0f ms: %.2f GB/s aggregate\n",
               size >> 20, subs, streamed ? "streamed" : "local files",
               static_cast<double>(stored - t0) / 1e6, static_cast<double>(last - t0) / 1e6, gbps);
  return gbps;
}

// A policy of `size` bytes in 16 float32 tensors, as the weight-stream
// figures publish it.
struct BenchPolicy {
  static constexpr int kTensors = 16;
  std::vector<std::vector<char>> model;
  std::vector<agentrt::WeightTensor> tensors;
  explicit BenchPolicy(size_t size) : model(kTensors, std::vector<char>(size / kTensors, 'w')) {
    for (int i = 0; i < kTensors; ++i) {
      tensors.push_back({"layer" + std::to_string(i),
                         "float32",
                         {static_cast<int64_t>(size / kTensors / 4)},
                         model[i].data(),
                         model[i].size()});
    }
  }
  // One memcpy of its bytes into memory already faulted in.
  double MemcpySeconds() const {
    std::vector<char> copy(model.size() * model[0].size());
    const int64_t m0 = NowNs();
    for (size_t i = 0; i < model.size(); ++i)
      std::memcpy(copy.data() + i * model[i].size(), model[i].data(), model[i].size());
    return static_cast<double>(NowNs() - m0) / 1e9;
  }
};

// When the last of the weight-stream subscribers `readers` held its version
// (their "result" lines); each is stopped.
int64_t LastLoaded(std::vector<Child>& readers) {
  int64_t last = 0;
  for (auto& r : readers) {
    long long first = 0, recv = 0, bytes = 0;
    const std::string line = r.ReadLine(120);
    if (std::sscanf(line.c_str(), "result %lld %lld %lld", &first, &recv, &bytes) != 3)
      Die("bad weights result: " + line);
    last = std::max<int64_t>(last, recv);
    r.Stop();
  }
  return last;
}

struct WeightsFigures {
  double gbps = 0;       // aggregate, publish start to the last load
  double publish_s = 0;  // the publisher's stall
  double memcpy_s = 0;   // one memcpy of the same bytes, same run
};

// One `size`-byte version (16 tensors) to `subs` subscriber processes.
WeightsFigures WeightsFanout(const std::string& address, const std::string& stream, size_t size,
                             int subs) {
  std::vector<Child> readers;
  for (int i = 0; i < subs; ++i) {
    readers.push_back(Spawn({"weights-sub", address, stream, "copy", "0"}));
    readers.back().WaitReady();
  }
  auto pub = Connect(address, "bench-pub");
  BenchPolicy policy(size);
  auto& tensors = policy.tensors;
  agentrt::WeightStream out(*pub, stream);
  WeightsFigures f;
  const int64_t t0 = NowNs();
  auto v = out.Publish(tensors, 1);
  const int64_t published = NowNs();
  if (!v.ok()) Die(v.status().ToString());
  const int64_t last = LastLoaded(readers);
  f.gbps = static_cast<double>(size) * subs / static_cast<double>(last - t0);
  f.publish_s = static_cast<double>(published - t0) / 1e9;
  f.memcpy_s = policy.MemcpySeconds();
  std::fprintf(stderr,
               "bench_bus: weights %zu MiB to %d subscribers: published in %.0f ms (memcpy %.0f "
               "ms), all loaded after %.0f ms: %.2f GB/s aggregate\n",
               size >> 20, subs, f.publish_s * 1e3, f.memcpy_s * 1e3,
               static_cast<double>(last - t0) / 1e6, f.gbps);
  return f;
}

// Delta versions: a `size`-byte policy (float32s) as versions 1 and 2, then
// 1% of its values changed as version 3, to one reader that streams every
// byte (another node's) and holds version 2. `delta`: the stream publishes
// and the reader reads deltas; else version 3 is read whole (the anchor).
// Once Publish(version 3) has returned (its delta published too), the time
// the reader takes to hold it, and the bytes that reached the reader for it.
// (Version 2 makes the stream's deltas known: a reader waits for the next
// version's delta only where one came before.)
struct DeltaFigures {
  double seconds = 0;
  double bytes = 0;
};
DeltaFigures WeightsDelta(const std::string& address, const std::string& stream, size_t size,
                          bool delta) {
  auto pub = Connect(address, "bench-pub");
  BenchPolicy policy(size);
  for (auto& t : policy.model) {  // float values, as a policy's
    auto* f = reinterpret_cast<float*>(t.data());
    for (size_t i = 0; i < t.size() / 4; ++i) f[i] = static_cast<float>(i % 1000) * 0.001f;
  }
  agentrt::WeightStream out(*pub, stream, 0, {.delta = delta});
  for (int64_t step = 1; step <= 2; ++step) {
    if (auto v = out.Publish(policy.tensors, step); !v.ok()) Die(v.status().ToString());
  }
  ::setenv("AGENTRT_BUS_LOCAL_FILES", "0", 1);  // for the reader (Spawn forks it)
  Child reader = Spawn({"weights-delta-sub", address, stream, delta ? "delta" : "whole"});
  ::unsetenv("AGENTRT_BUS_LOCAL_FILES");
  reader.WaitReady();
  if (reader.ReadLine(120) != "held") Die("the delta reader did not hold version 2");
  for (auto& t : policy.model) {  // 1% of the values change
    auto* f = reinterpret_cast<float*>(t.data());
    for (size_t i = 0; i < t.size() / 4; i += 100) f[i] += 1.0f;
  }
  const int64_t t0 = NowNs();
  if (auto v = out.Publish(policy.tensors, 3); !v.ok()) Die(v.status().ToString());
  const double publish_s = static_cast<double>(NowNs() - t0) / 1e9;
  ::kill(reader.pid, SIGUSR1);
  long long first = 0, recv = 0, bytes = 0;
  const std::string line = reader.ReadLine(120);
  if (std::sscanf(line.c_str(), "result %lld %lld %lld", &first, &recv, &bytes) != 3)
    Die("bad delta result: " + line);
  reader.Stop();
  DeltaFigures f{static_cast<double>(recv - first) / 1e9, static_cast<double>(bytes)};
  std::fprintf(stderr,
               "bench_bus: %s of a %zu MiB version with 1%% changed: read in %.0f ms, %.0f "
               "bytes (its Publish: %.0f ms)\n",
               delta ? "delta" : "whole read", size >> 20, f.seconds * 1e3, f.bytes,
               publish_s * 1e3);
  return f;
}

// A stream's steady state: version 1 published before the subscribers
// start, then version 2 with PublishAsync into the slot made ready after
// version 1, until all `subs` subscribers hold it as views of the broker's
// file (each checks the whole payload's CRC32C when it maps it). Aggregate
// GB/s from the publish's start.
double WeightsFanoutViews(const std::string& address, const std::string& stream, size_t size,
                          int subs, const Node& node = {}) {
  auto pub = Connect(address, "bench-pub");
  BenchPolicy policy(size);
  agentrt::WeightStream out(*pub, stream);
  if (agentrt::Status s = out.PublishAsync(policy.tensors, 1); !s.ok()) Die(s.ToString());
  if (auto v = out.Flush(std::chrono::seconds(120)); !v.ok()) Die(v.status().ToString());
  std::vector<Child> readers;
  for (int i = 0; i < subs; ++i) {
    readers.push_back(Spawn(
        {"weights-sub", address, stream, node.netns.empty() ? "views" : "streamed", "1"}, node));
    readers.back().WaitReady();
  }
  const int64_t t0 = NowNs();
  if (agentrt::Status s = out.PublishAsync(policy.tensors, 2); !s.ok()) Die(s.ToString());
  const int64_t last = LastLoaded(readers);
  if (auto v = out.Flush(std::chrono::seconds(120)); !v.ok()) Die(v.status().ToString());
  const double gbps = static_cast<double>(size) * subs / static_cast<double>(last - t0);
  std::fprintf(stderr,
               "bench_bus: weights %zu MiB to %d subscribers%s holding views, version 2 by "
               "PublishAsync: all hold it after %.0f ms: %.2f GB/s aggregate\n",
               size >> 20, subs, node.netns.empty() ? "" : (" in " + node.netns).c_str(),
               static_cast<double>(last - t0) / 1e6, gbps);
  return gbps;
}

// PublishAsync's stall: a version of `size` bytes (16 tensors) published
// twice; the second call finds its slot made ready after the first (a
// training loop's steady state), the first makes its own. Against one
// memcpy of the same bytes into memory already faulted in.
struct AsyncStall {
  double first_s = 0, steady_s = 0, memcpy_s = 0;
};
AsyncStall WeightsAsyncStall(const std::string& address, const std::string& stream, size_t size) {
  auto pub = Connect(address, "bench-pub");
  BenchPolicy policy(size);
  auto& tensors = policy.tensors;
  agentrt::WeightStream out(*pub, stream);
  AsyncStall f;
  for (int version = 1; version <= 2; ++version) {
    const int64_t t0 = NowNs();
    if (agentrt::Status s = out.PublishAsync(tensors, version); !s.ok()) Die(s.ToString());
    const double stall = static_cast<double>(NowNs() - t0) / 1e9;
    (version == 1 ? f.first_s : f.steady_s) = stall;
    for (auto& t : policy.model) t[0] = static_cast<char>(version);  // the loop trains on
    if (auto v = out.Flush(std::chrono::seconds(120)); !v.ok()) Die(v.status().ToString());
  }
  f.memcpy_s = policy.MemcpySeconds();
  std::fprintf(stderr,
               "bench_bus: PublishAsync of %zu MiB: the first call %.1f ms (readies its own "
               "slot), the next %.1f ms; memcpy %.1f ms\n",
               size >> 20, f.first_s * 1e3, f.steady_s * 1e3, f.memcpy_s * 1e3);
  return f;
}

// ZeroMQ's fan-out of one `size`-byte message to `subs` PULL receivers:
// bytes received in all (GB/s) from the send to the last receipt. `shared`:
// one buffer sent to every socket without a copy (a message on
// zmq_msg_init_data with no free function), as a large fan-out would be,
// so that 8 copies of 1 GiB never sit in the sender's memory.
double ZmqFanout(size_t size, int subs, const Node& node = {}, bool shared = false) {
  std::vector<Child> readers;
  zmq::context_t ctx(1);
  std::vector<zmq::socket_t> pushes;
  for (int i = 0; i < subs; ++i) {
    readers.push_back(Spawn({"zmq-pull", "1", node.host}, node));
    pushes.emplace_back(ctx, zmq::socket_type::push);
    pushes.back().set(zmq::sockopt::sndhwm, 0);
    pushes.back().connect(readers.back().WaitReady());
  }
  std::string payload = MakePayload(size);
  Stamp(&payload, 0);
  const int64_t t0 = SendNs(payload);
  for (auto& p : pushes) {
    if (shared) {
      zmq::message_t msg(payload.data(), payload.size(), nullptr);  // not copied, not freed
      p.send(msg, zmq::send_flags::none);
    } else {
      p.send(zmq::buffer(payload), zmq::send_flags::none);
    }
  }
  int64_t last = 0;
  for (auto& r : readers) {
    long long first = 0, recv = 0, bytes = 0;
    if (std::sscanf(r.ReadLine(120).c_str(), "result %lld %lld %lld", &first, &recv, &bytes) != 3)
      Die("bad zmq fan-out result");
    last = std::max<int64_t>(last, recv);
  }
  for (auto& p : pushes) p.close();
  for (auto& r : readers) r.Stop();
  return static_cast<double>(size) * subs / static_cast<double>(last - t0);
}

void PrintFigure(const std::string& metric, double value, const char* unit, const char* anchor,
                 double anchor_value) {
  agentrt::bench::PrintFigure("bus", metric, value, unit, anchor, anchor_value);
}

struct Recovery {
  std::string label;
  double recover_s = 0, read_s = 0;
};

// A broker's log of `mib` MiB (1 MiB messages, 64 MiB segments) read back by
// a new broker, against reading the same files once with read(2) (the page
// cache warm for both: the second read of each is what is timed).
Recovery MeasureRecovery(int mib) {
  char tmpl[] = "/tmp/agentrt-bench-recover.XXXXXX";
  if (::mkdtemp(tmpl) == nullptr) Die("mkdtemp failed");
  const std::string dir = tmpl;
  agentrt::BrokerOptions o;
  o.retention_messages = 1 << 20;
  o.retention_bytes = int64_t{4} << 30;
  o.log_dir = dir;
  o.durability = agentrt::BusDurability::kBatch;
  agentrt::BusAcl acl;
  acl.open = true;
  acl.agents = {"bench-pub"};
  {
    agentrt::Broker b(o, acl, kSecret, 1);
    std::vector<std::string> notes;
    if (auto s = b.Recover(&notes); !s.ok()) Die(s.ToString());
    const std::string payload = MakePayload(1 << 20);
    for (int i = 0; i < mib; ++i) {
      agentrt::bus::v1::PublishRequest req;
      req.set_topic("snapshots");
      req.set_payload(payload);
      agentrt::bus::v1::PublishResponse resp;
      if (auto s = b.Publish("bench-pub", req, &resp); !s.ok()) Die(s.ToString());
    }
  }
  auto read_all = [&] {
    std::vector<char> buf(8 << 20);
    size_t total = 0;
    for (const auto& e : std::filesystem::recursive_directory_iterator(dir)) {
      if (!e.is_regular_file()) continue;
      const int fd = ::open(e.path().c_str(), O_RDONLY | O_CLOEXEC);
      ssize_t n = 0;
      while ((n = ::read(fd, buf.data(), buf.size())) > 0) total += static_cast<size_t>(n);
      ::close(fd);
    }
    return total;
  };
  auto recover = [&] {
    agentrt::Broker b(o, acl, kSecret, 1);
    std::vector<std::string> notes;
    if (auto s = b.Recover(&notes); !s.ok()) Die(s.ToString());
    if (b.ListTopics("").at(0).end_offset() != mib) Die("recovery lost messages");
  };
  Recovery r;
  r.label = "recovery_" + std::to_string(mib) + "MiB";
  std::vector<double> rec_s, read_s;
  for (int rep = 0; rep < 3; ++rep) {
    int64_t t0 = NowNs();
    read_all();
    read_s.push_back(static_cast<double>(NowNs() - t0) / 1e9);
    t0 = NowNs();
    recover();
    rec_s.push_back(static_cast<double>(NowNs() - t0) / 1e9);
  }
  std::filesystem::remove_all(dir);
  r.recover_s = Median(rec_s);
  r.read_s = Median(read_s);
  std::fprintf(stderr, "bench_bus: %d MiB of log read back in %.2f s (reading the files: %.2f s)\n",
               mib, r.recover_s, r.read_s);
  return r;
}

// Across two nodes of the multi-node test cluster (cross_node.sh runs this
// in node A's network namespace): the broker and the publisher on A (at
// host_a), 4 subscribers on B (netns_b, host_b), every byte over the veth
// link between them; the anchor: ZeroMQ from A to 4 PULL processes on B.
int RunCrossNode(const std::string& netns_b, const std::string& host_a, const std::string& host_b,
                 bool quick) {
  const int reps = quick ? 1 : 3;
  const size_t size = (quick ? size_t{64} : size_t{256}) << 20;
  Child broker = Spawn({"broker", "", host_a});
  const std::string address = broker.WaitReady();
  const Node b{netns_b, host_b};
  std::vector<double> weights, each, zmq;
  for (int r = 0; r < reps; ++r) {
    weights.push_back(WeightsFanoutViews(address, "wx" + std::to_string(r), size, 4, b));
    // Without the node's folder: each subscriber has every byte streamed to it.
    ::setenv("AGENTRT_WEIGHTS_NODE_CACHE", "0", 1);
    each.push_back(WeightsFanoutViews(address, "wy" + std::to_string(r), size, 4, b));
    ::unsetenv("AGENTRT_WEIGHTS_NODE_CACHE");
    zmq.push_back(ZmqFanout(size, 4, b));
    std::fprintf(stderr,
                 "bench_bus: ZeroMQ, the same bytes from %s to 4 receivers on %s: %.2f GB/s\n",
                 host_a.c_str(), host_b.c_str(), zmq.back());
  }
  broker.Stop();
  // The node folder of subscribers stopped by a signal after their read.
  agentrt::SweepSharedNodeDirs(agentrt::kMpiShmRoot, agentrt::kBusNodeDirPrefix);
  PrintFigure("weights_" + std::to_string(size >> 20) + "MiB_4subs_cross_node", Median(weights),
              "GB/s", "zmq_push_pull_4_receivers_cross_node", Median(zmq));
  PrintFigure("weights_" + std::to_string(size >> 20) + "MiB_4subs_cross_node_no_node_cache",
              Median(each), "GB/s", "zmq_push_pull_4_receivers_cross_node", Median(zmq));
  return 0;
}

// The two flows of one publisher to one subscriber, 64 B and 1 MiB, each
// beside ZeroMQ's in the same repetition.
struct Flows {
  std::vector<double> bus_rate, zmq_rate, bus_bw, zmq_bw;

  void Measure(const std::string& address, int rep, int64_t tput_n, int64_t bw_n) {
    bus_rate.push_back(BusFlow(address, "tput-" + std::to_string(rep), tput_n, 64).rate);
    zmq_rate.push_back(ZmqFlow(tput_n, 64).rate);
    bus_bw.push_back(BusFlow(address, "bw-" + std::to_string(rep), bw_n, 1 << 20).mbps);
    zmq_bw.push_back(ZmqFlow(bw_n, 1 << 20).mbps);
  }
  void Print() const {
    PrintFigure("throughput_64B", Median(bus_rate), "msg/s", "zmq_push_pull_64B", Median(zmq_rate));
    PrintFigure("bandwidth_1MiB", Median(bus_bw), "MB/s", "zmq_push_pull_1MiB", Median(zmq_bw));
  }

  // What the memory of a kept 1 MiB payload costs on this machine, per
  // message, against ZeroMQ's whole time per 1 MiB message in the same run
  // (which reuses its buffers and keeps none): writing it into a new file of
  // the shared memory the spool and a memory broker's payload files use
  // (its pages allocated: a bus keeps every payload until retention drops
  // it, so each needs memory of its own); then, 300 MiB later (out of the
  // caches), the broker's check of it (mapped, CRC32C: FileCrc32c) and a
  // subscriber's read of it (ReadWholeFileMapped into a string, CRC32C);
  // and a write into pages a file has already (each file rewritten, out of
  // the caches too).
  // Measured with no broker holding memory.
  static void PrintKeptFloor(double zmq_mbps) {
    const std::string root = std::filesystem::is_directory("/dev/shm") ? "/dev/shm" : "/tmp";
    constexpr size_t kSize = 1 << 20;
    constexpr int kFiles = 300;
    if (struct statvfs fs{}; ::statvfs(root.c_str(), &fs) != 0 ||
                             static_cast<double>(fs.f_bavail) * static_cast<double>(fs.f_frsize) <
                                 2.0 * kSize * kFiles) {
      std::fprintf(stderr, "bench_bus: the kept payloads' floor skipped: %s has not %d MiB free\n",
                   root.c_str(), 2 * kFiles);
      return;
    }
    std::string dir = root + "/agentrt-bench-floor.XXXXXX";
    if (::mkdtemp(dir.data()) == nullptr) Die("mkdtemp failed");
    auto fail = [&](const std::string& what) {
      std::error_code ec;
      std::filesystem::remove_all(dir, ec);
      Die(what);
    };
    const std::string payload = MakePayload(kSize);
    const uint32_t expected = agentrt::Crc32c(payload.data(), kSize);
    std::vector<double> write_us, check_us, read_us, rewrite_us;
    auto per_file_us = [](int64_t since) {
      return static_cast<double>(NowNs() - since) / 1e3 / kFiles;
    };
    for (int rep = 0; rep < 3; ++rep) {
      std::vector<int> fds;
      int64_t t0 = NowNs();
      for (int i = 0; i < kFiles; ++i) {
        const std::string path = dir + "/" + std::to_string(i);
        const int fd = ::open(path.c_str(), O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
        if (fd < 0) fail("cannot create " + path);
        fds.push_back(fd);  // kept open, as a kept payload (named: a subscriber reads it by name)
        if (!agentrt::WriteAll(fd, payload.data(), kSize, "cannot write ", path).ok())
          fail("cannot write " + path + " (is " + root + " full?)");
      }
      write_us.push_back(per_file_us(t0));
      t0 = NowNs();
      for (int fd : fds) {
        auto crc = agentrt::FileCrc32c(fd, kSize, dir);
        if (!crc.ok() || *crc != expected) fail("the broker's check failed");
      }
      check_us.push_back(per_file_us(t0));
      t0 = NowNs();
      for (int i = 0; i < kFiles; ++i) {
        const auto bytes = agentrt::ReadWholeFileMapped(dir + "/" + std::to_string(i), kSize);
        if (!bytes.ok() || agentrt::Crc32c(bytes->data(), bytes->size()) != expected)
          fail("a subscriber's read failed");
      }
      read_us.push_back(per_file_us(t0));
      t0 = NowNs();
      for (int fd : fds) {
        if (::pwrite(fd, payload.data(), kSize, 0) != static_cast<ssize_t>(kSize))
          fail("a rewrite failed");
      }
      rewrite_us.push_back(per_file_us(t0));
      for (int i = 0; i < kFiles; ++i) {
        ::close(fds[static_cast<size_t>(i)]);
        ::unlink((dir + "/" + std::to_string(i)).c_str());
      }
    }
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
    const double zmq_us = static_cast<double>(kSize) / zmq_mbps;  // MB/s = bytes/us
    const char* anchor = "zmq_push_pull_1MiB_per_message";
    PrintFigure("kept_1MiB_fresh_shm_write", Median(write_us), "us", anchor, zmq_us);
    PrintFigure("kept_1MiB_broker_check_cold", Median(check_us), "us", anchor, zmq_us);
    PrintFigure("kept_1MiB_subscriber_read_cold", Median(read_us), "us", anchor, zmq_us);
    PrintFigure("1MiB_shm_rewrite_cold", Median(rewrite_us), "us", anchor, zmq_us);
  }
};

// `bench_bus --flows`: only the two flows, medians of 5: the figures a change
// to the bus's ordinary path moves, in a minute. Then the 1 MiB flow through
// a broker with a durable log (`durability: batch`, agentctl's default),
// whose spooled entries it reads and logs inline, medians of 3.
int RunFlows() {
  Child broker = Spawn({"broker"});
  const std::string address = broker.WaitReady();
  Flows flows;
  for (int r = 0; r < 5; ++r) flows.Measure(address, r, 200000, 300);
  flows.Print();
  broker.Stop();
  Flows::PrintKeptFloor(Median(flows.zmq_bw));
  DurableBroker durable = DurableBroker::Start();
  std::vector<double> bus_bw, zmq_bw;
  for (int r = 0; r < 3; ++r) {
    bus_bw.push_back(BusFlow(durable.address, "bw-" + std::to_string(r), 300, 1 << 20).mbps);
    zmq_bw.push_back(ZmqFlow(300, 1 << 20).mbps);
  }
  durable.Stop();
  PrintFigure("bandwidth_1MiB_durable_batch", Median(bus_bw), "MB/s", "zmq_push_pull_1MiB",
              Median(zmq_bw));
  return 0;
}

int RunParent(bool quick) {
  const int reps = quick ? 1 : 3;
  const int64_t lat_n = quick ? 500 : 2000;
  const int64_t tput_n = quick ? 50000 : 200000;
  const int64_t bw_n = quick ? 100 : 300;

  Child broker = Spawn({"broker"});
  const std::string address = broker.WaitReady();
  Child echo = Spawn({"echo-server"});
  const std::string echo_address = echo.WaitReady();
  std::fprintf(stderr, "bench_bus: broker %s, echo server %s\n", address.c_str(),
               echo_address.c_str());

  // Latency: one message at a time, publish -> delivered, interleaved with
  // the echo anchor's round trips so both see the same machine load.
  std::vector<int64_t> bus_lat, echo_rtt;
  {
    Child sub = Spawn({"bus-sub", address, "latency", std::to_string(lat_n), "1"});
    sub.WaitReady();
    auto pub = Connect(address, "bench-pub");
    auto stub = agentrt::bench::Echo::NewStub(
        grpc::CreateChannel(echo_address, grpc::InsecureChannelCredentials()));
    agentrt::bench::EchoMessage req, resp;
    req.set_payload(MakePayload(64));
    std::string payload = MakePayload(64);
    auto pause = [] {  // let the delivery finish before the next send
      const auto until = Clock::now() + std::chrono::microseconds(200);
      while (Clock::now() < until) {
      }
    };
    for (int64_t i = -100; i < lat_n; ++i) {  // 100 warm-up round trips first
      grpc::ClientContext ctx;
      ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
      const int64_t t0 = NowNs();
      if (!stub->Ping(&ctx, req, &resp).ok()) Die("echo call failed");
      if (i >= 0) echo_rtt.push_back(NowNs() - t0);
      pause();
      if (i < 0) continue;
      Stamp(&payload, i);
      if (auto ack = pub->Publish("latency", payload); !ack.ok()) Die(ack.status().ToString());
      pause();
    }
    sub.ReadLine(120);  // result line
    for (int64_t i = 0; i < lat_n; ++i) bus_lat.push_back(std::atoll(sub.ReadLine().c_str()));
    sub.Stop();
  }
  echo.Stop();

  // The same broker with its durable log (batch), next to the memory one.
  DurableBroker durable = DurableBroker::Start();

  Flows flows;
  std::vector<double> batch_rate, bus_fan, bus_fan_streamed, zmq_fan, weights_fan, weights_stall,
      weights_memcpy, async_stall, async_memcpy, weights_views, delta_s, delta_bytes, whole_s,
      whole_bytes;
  const size_t fan_size = (quick ? size_t{64} : size_t{256}) << 20;
  for (int r = 0; r < reps; ++r) {
    const WeightsFigures w = WeightsFanout(address, "w" + std::to_string(r), fan_size, 4);
    weights_fan.push_back(w.gbps);
    weights_stall.push_back(w.publish_s);
    weights_memcpy.push_back(w.memcpy_s);
    const AsyncStall a = WeightsAsyncStall(address, "wa" + std::to_string(r), fan_size);
    async_stall.push_back(a.steady_s);
    async_memcpy.push_back(a.memcpy_s);
    weights_views.push_back(WeightsFanoutViews(address, "wv" + std::to_string(r), fan_size, 4));
    const DeltaFigures d = WeightsDelta(address, "wd" + std::to_string(r), fan_size, true);
    const DeltaFigures whole = WeightsDelta(address, "ww" + std::to_string(r), fan_size, false);
    delta_s.push_back(d.seconds);
    delta_bytes.push_back(d.bytes);
    whole_s.push_back(whole.seconds);
    whole_bytes.push_back(whole.bytes);
    bus_fan.push_back(BusFanout(address, "fan-" + std::to_string(r), fan_size, 4, false));
    bus_fan_streamed.push_back(
        BusFanout(address, "fan-streamed-" + std::to_string(r), fan_size, 4, true));
    zmq_fan.push_back(ZmqFanout(fan_size, 4));
    flows.Measure(address, r, tput_n, bw_n);
    batch_rate.push_back(BusFlow(durable.address, "tput-" + std::to_string(r), tput_n, 64).rate);
  }
  // The memory broker's files (gigabytes of versions and payloads it keeps)
  // go with it, so that the 1 GiB figures below have the machine's memory.
  broker.Stop();
  // 1 GiB to 8 subscribers against the memcpy floor of the same bytes and
  // against ZeroMQ to 8 receivers, each repetition on a broker of its own
  // (the last one's 3 GiB freed).
  std::vector<double> big_fan, big_views, big_floor, big_zmq;
  if (!quick) {
    const size_t big =
        (size_t{1} << 30) - (size_t{1} << 16);  // with its header: 1 GiB, the bus's ceiling
    std::vector<char> src(big, 'x'), dst(big);
    for (int r = 0; r < reps; ++r) {
      Child big_broker = Spawn({"broker"});
      const std::string big_address = big_broker.WaitReady();
      big_fan.push_back(WeightsFanout(big_address, "wbig" + std::to_string(r), big, 8).gbps);
      big_views.push_back(WeightsFanoutViews(big_address, "wbigv" + std::to_string(r), big, 8));
      big_broker.Stop();
      const int64_t m0 = NowNs();
      for (int i = 0; i < 8; ++i) {
        src[static_cast<size_t>(i)] = static_cast<char>(i);  // each copy reads its own source
        std::memcpy(dst.data(), src.data(), big);
      }
      big_floor.push_back(static_cast<double>(big) * 8 / static_cast<double>(NowNs() - m0));
      big_zmq.push_back(ZmqFanout(big, 8, {}, /*shared=*/true));
    }
  }
  durable.Stop();
  // The node folders of weight-stream readers this bench stopped with a
  // signal (their lock free now) go with them.
  agentrt::SweepSharedNodeDirs(agentrt::kMpiShmRoot, agentrt::kBusNodeDirPrefix);
  const Recovery rec = MeasureRecovery(quick ? 256 : 1024);

  std::fprintf(stderr,
               "bench_bus: %lld latency samples, %d repetitions of %lld x 64 B and %lld x 1 MiB\n",
               static_cast<long long>(lat_n), reps, static_cast<long long>(tput_n),
               static_cast<long long>(bw_n));
  PrintFigure("latency_p50_64B", Percentile(bus_lat, 0.5) / 1e3, "us", "grpc_unary_echo_rtt_p50",
              Percentile(echo_rtt, 0.5) / 1e3);
  PrintFigure("latency_p99_64B", Percentile(bus_lat, 0.99) / 1e3, "us", "grpc_unary_echo_rtt_p99",
              Percentile(echo_rtt, 0.99) / 1e3);
  flows.Print();
  Flows::PrintKeptFloor(Median(flows.zmq_bw));  // the brokers stopped
  PrintFigure("throughput_64B_batch", Median(batch_rate), "msg/s", "throughput_64B_memory",
              Median(flows.bus_rate));
  const std::string fan_metric = "fanout_" + std::to_string(fan_size >> 20) + "MiB_4subs";
  PrintFigure(fan_metric.c_str(), Median(bus_fan_streamed), "GB/s", "zmq_push_pull_4_receivers",
              Median(zmq_fan));
  PrintFigure((fan_metric + "_local_files").c_str(), Median(bus_fan), "GB/s",
              "zmq_push_pull_4_receivers", Median(zmq_fan));
  const std::string weights_metric = "weights_" + std::to_string(fan_size >> 20) + "MiB_4subs";
  PrintFigure(weights_metric.c_str(), Median(weights_fan), "GB/s", "zmq_push_pull_4_receivers",
              Median(zmq_fan));
  PrintFigure(weights_metric + "_views", Median(weights_views), "GB/s", "zmq_push_pull_4_receivers",
              Median(zmq_fan));
  if (!big_fan.empty()) {
    PrintFigure("weights_1024MiB_8subs", Median(big_fan), "GB/s", "memcpy_floor_8_copies",
                Median(big_floor));
    PrintFigure("weights_1024MiB_8subs_views", Median(big_views), "GB/s", "memcpy_floor_8_copies",
                Median(big_floor));
    PrintFigure("weights_1024MiB_8subs_views_vs_zmq", Median(big_views), "GB/s",
                "zmq_push_pull_8_receivers_shared_send", Median(big_zmq));
  }
  // Lower is better: how long the publisher's loop waits, against one memcpy.
  PrintFigure(("weights_publish_stall_" + std::to_string(fan_size >> 20) + "MiB").c_str(),
              Median(weights_stall), "s", "memcpy", Median(weights_memcpy));
  PrintFigure(("weights_publish_async_stall_" + std::to_string(fan_size >> 20) + "MiB").c_str(),
              Median(async_stall), "s", "memcpy", Median(async_memcpy));
  // Lower is better: delta versions against reading the version whole.
  const std::string delta_metric = "weights_delta_" + std::to_string(fan_size >> 20) + "MiB_1pct";
  PrintFigure(delta_metric + "_bytes", Median(delta_bytes), "bytes", "whole_version_bytes",
              Median(whole_bytes));
  PrintFigure(delta_metric + "_time", Median(delta_s), "s", "whole_version_streamed",
              Median(whole_s));
  // Lower is better: the ratio says how much slower than reading the files is.
  PrintFigure(rec.label.c_str(), rec.recover_s, "s", "read_files_once", rec.read_s);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string role = argc > 1 ? argv[1] : "";
  if (role == "broker") return RunBroker(argc > 2 ? argv[2] : "", argc > 3 ? argv[3] : "127.0.0.1");
  if (role == "echo-server") return RunEchoServer();
  if (role == "bus-sub" && argc == 6) {
    return RunBusSubscriber(argv[2], argv[3], std::atoll(argv[4]), std::string(argv[5]) == "1");
  }
  if (role == "zmq-pull" && argc >= 3)
    return RunZmqPull(std::atoll(argv[2]), argc > 3 ? argv[3] : "127.0.0.1");
  if (role == "weights-delta-sub" && argc == 5)
    return RunWeightsDeltaSubscriber(argv[2], argv[3], std::string(argv[4]) == "delta");
  if (role == "weights-sub" && argc == 6)
    return RunWeightsSubscriber(argv[2], argv[3], argv[4], std::atoll(argv[5]));
  if (role == "--cross-node" && (argc == 5 || argc == 6))
    return RunCrossNode(argv[2], argv[3], argv[4], argc == 6 && std::string(argv[5]) == "--quick");
  if (role == "--flows") return RunFlows();
  if (role.empty() || role == "--quick") return RunParent(role == "--quick");
  std::fprintf(
      stderr,
      "usage: bench_bus [--quick | --flows]\n"
      "       bench_bus --cross-node NETNS_B HOST_A HOST_B [--quick]  (bench/bus/cross_node.sh)\n");
  return 2;
}
