// Device weight streams over the fake device (CUDA IPC through memfds, so
// that it crosses processes as on a GPU) and a real broker on loopback: a
// version moves device to device to a reader process of the node, and
// through pinned host memory to a reader elsewhere, in the publisher's
// process, or one whose IPC open fails; a slot a reader holds is never
// rewritten and a killed reader releases it; a reused slot is noticed; the
// device topic follows the stream's ACL; nothing is left behind.
#include "agent_runtime/device_weights.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "common/crc32c.h"
#include "comms/bus_server.h"
#include "tests/agent_runtime/fake_device.h"
#include "tests/common/temp_dir.h"
#include "tests/comms/bus_test_util.h"

using namespace agentrt;
using namespace std::chrono_literals;

namespace {

constexpr char kSecret[] = "device-weights-test-secret-0123456789";
constexpr size_t kFloats = 1 << 16;
constexpr size_t kBytes = kFloats * sizeof(float);

std::unique_ptr<BusServer> Start() {
  BusAcl acl;
  acl.agents = {"pub", "sub", "outsider"};
  acl.channels = {{"weights/*", {"pub"}, {"sub"}}};
  BusServerOptions o;
  o.broker.limits.max_message_bytes = 64 << 20;
  return testing::StartBus(o, kSecret, acl);
}

// A broker on loopback and a client of its publisher and of its subscriber.
struct Bus {
  std::unique_ptr<BusServer> server = Start();
  std::unique_ptr<BusClient> pub = testing::ConnectBus(server->address(), kSecret, "pub");
  std::unique_ptr<BusClient> sub = testing::ConnectBus(server->address(), kSecret, "sub");
};

// A child's exit status and what it printed on stdout; `line_only`: return
// after its first line, leaving it running (its pid in `pid`).
struct Child {
  pid_t pid = -1;
  std::string out;
};

Child Spawn(std::vector<std::string> args, bool line_only, const char* env = nullptr) {
  const char* bin = std::getenv("DEVICE_WEIGHTS_READER");
  REQUIRE(bin != nullptr);
  int fds[2];
  REQUIRE(::pipe2(fds, O_CLOEXEC) == 0);
  Child c;
  c.pid = ::fork();
  REQUIRE(c.pid >= 0);
  if (c.pid == 0) {
    ::dup2(fds[1], 1);
    if (env != nullptr) ::putenv(const_cast<char*>(env));
    std::vector<char*> argv{const_cast<char*>(bin)};
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    ::execv(bin, argv.data());
    std::_Exit(127);
  }
  ::close(fds[1]);
  const auto deadline = std::chrono::steady_clock::now() + 30s;
  char buf[4096];
  while (std::chrono::steady_clock::now() < deadline) {
    if (line_only && c.out.find('\n') != std::string::npos) break;
    pollfd p{fds[0], POLLIN, 0};
    if (::poll(&p, 1, 100) <= 0) continue;
    const ssize_t n = ::read(fds[0], buf, sizeof buf);
    if (n <= 0) break;
    c.out.append(buf, static_cast<size_t>(n));
  }
  ::close(fds[0]);
  return c;
}

// Runs a reader to its end; its printed line as JSON.
nlohmann::json ReadInChild(const std::string& address, const std::string& stream, int64_t version,
                           const char* env = nullptr) {
  Child c = Spawn(
      {"read", address, kSecret, stream, std::to_string(version), "w", std::to_string(kBytes)},
      false, env);
  int status = 0;
  REQUIRE(::waitpid(c.pid, &status, 0) == c.pid);
  INFO(c.out);
  REQUIRE(WIFEXITED(status));
  REQUIRE(WEXITSTATUS(status) == 0);
  return nlohmann::json::parse(c.out);
}

std::vector<float> Values(uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<float> v(kFloats);
  for (float& x : v) x = static_cast<float>(rng() % 1000) / 7.0f;
  return v;
}

uint32_t CrcOf(const std::vector<float>& v) { return Crc32c(v.data(), v.size() * sizeof(float)); }

// A publisher's device and its tensor "w" in device memory.
struct Publisher {
  testing::FakeDevice api;
  void* w = nullptr;
  Publisher() { w = *api.Malloc(kBytes); }
  ~Publisher() { api.Free(w); }
  Result<int64_t> Publish(DeviceWeightStream& s, const std::vector<float>& values, int64_t step) {
    std::memcpy(w, values.data(), kBytes);  // fake device memory is host memory
    return s.Publish({{"w", "float32", {static_cast<int64_t>(kFloats)}, w, kBytes}}, step);
  }
};

DeviceWeightRecord NewestRecord(BusClient& bus, const std::string& stream) {
  const std::string topic = WeightDeviceTopic(stream);
  auto topics = bus.ListTopics(topic);
  REQUIRE(topics.ok());
  int64_t end = 0;
  for (const auto& t : *topics)
    if (t.topic() == topic) end = t.end_offset();
  REQUIRE(end > 0);
  auto got = bus.Fetch(topic, end - 1, 1, 5s);
  REQUIRE(got.ok());
  REQUIRE(got->size() == 1);
  auto r = DeviceWeightRecord::Decode(got->front().payload());
  REQUIRE(r.ok());
  return *r;
}

}  // namespace

TEST_CASE("a device slot's record round-trips and a malformed one is refused") {
  DeviceWeightRecord r;
  r.version = 7;
  r.step = 1200;
  r.node = "boot-id";
  r.pid = 4242;
  r.fd = 9;
  r.nonce = "0123456789abcdef";
  r.slot = 1;
  r.slots = 2;
  r.device = 3;
  for (size_t i = 0; i < r.handle.bytes.size(); ++i) r.handle.bytes[i] = static_cast<char>(i * 7);
  r.tensors = {{"fc.w", "float32", {4, 8}, 128, 128}, {"fc.b", "bfloat16", {8}, 256, 16}};
  auto back = DeviceWeightRecord::Decode(r.Encode());
  REQUIRE(back.ok());
  CHECK(back->Encode() == r.Encode());
  CHECK(back->handle.bytes == r.handle.bytes);
  CHECK(back->tensors[1].shape == std::vector<int64_t>{8});

  CHECK(DeviceWeightRecord::Decode("[]").status().message().find("not a JSON object") !=
        std::string::npos);
  auto bad = nlohmann::json::parse(r.Encode());
  bad["handle"] = "zz";
  CHECK(DeviceWeightRecord::Decode(bad.dump()).status().message().find("handle") !=
        std::string::npos);
  bad = nlohmann::json::parse(r.Encode());
  bad["slot"] = -2;
  CHECK(DeviceWeightRecord::Decode(bad.dump()).status().code() == StatusCode::kInvalidArgument);
  bad = nlohmann::json::parse(r.Encode());
  bad["nonce"] = "";  // would match any file
  CHECK(DeviceWeightRecord::Decode(bad.dump()).status().message().find("nonce") !=
        std::string::npos);
  // A version without a slot needs no table.
  DeviceWeightRecord none;
  none.version = 8;
  none.slots = 2;
  auto none_back = DeviceWeightRecord::Decode(none.Encode());
  REQUIRE(none_back.ok());
  CHECK(none_back->slot == -1);
  bad = nlohmann::json::parse(r.Encode());
  bad.erase("pid");
  CHECK(DeviceWeightRecord::Decode(bad.dump()).status().message().find("pid") != std::string::npos);
}

TEST_CASE(
    "on one node a version moves device to device through CUDA IPC; elsewhere through "
    "pinned host memory") {
  Bus bus;
  Publisher p;
  const auto v1 = Values(1), v2 = Values(2);
  {
    WeightStream out(*bus.pub, "gpu");
    DeviceWeightStream gpu(out, p.api, 0);
    REQUIRE(p.Publish(gpu, v1, 10).value() == 1);
    REQUIRE(p.Publish(gpu, v2, 20).value() == 2);
    CHECK(gpu.stats().versions_shared == 2);
    CHECK(p.api.pinned_blocks() == 1);  // the staging buffer

    SECTION("a reader process of the node copies from the slot, and closes it when it goes") {
      auto got = ReadInChild(bus.server->address(), "gpu", 0);
      CHECK(got["version"] == 2);
      CHECK(got["by_ipc"] == 1);
      CHECK(got["staged"] == 0);
      CHECK(got["crc32c"] == CrcOf(v2));
      CHECK(got["ipc_opened"] == 0);
      CHECK(got["device_blocks"] == 0);
      // A pinned older version, still in its slot.
      got = ReadInChild(bus.server->address(), "gpu", 1);
      CHECK(got["by_ipc"] == 1);
      CHECK(got["crc32c"] == CrcOf(v1));
    }
    SECTION("the host version is the same bytes: the publisher's own process reads it staged") {
      WeightStream in(*bus.sub, "gpu");
      testing::FakeDevice api;
      DeviceWeightStream reader(in, api, 0);
      void* target = *api.Malloc(kBytes);
      REQUIRE(reader.ReadInto(0, {{"w", target, kBytes}}, 5s).value() == 2);
      CHECK(reader.stats().versions_staged == 1);
      CHECK(reader.last_staged_reason() == "published by this process");
      CHECK(Crc32c(target, kBytes) == CrcOf(v2));
      // Targets that do not fit the version: nothing read, the tensor named.
      auto wrong = reader.ReadInto(0, {{"w", target, kBytes - 4}}, 5s);
      CHECK(wrong.status().code() == StatusCode::kInvalidArgument);
      CHECK(wrong.status().message().find("tensor \"w\"") != std::string::npos);
      CHECK(reader.ReadInto(0, {}, 5s).status().message().find("has no target") !=
            std::string::npos);
      // A target of another dtype or shape, same size: refused, not reinterpreted.
      const auto n = static_cast<int64_t>(kFloats);
      auto as_int = reader.ReadInto(0, {{"w", target, kBytes, "int32", {n}}}, 5s);
      CHECK(as_int.status().code() == StatusCode::kInvalidArgument);
      CHECK(as_int.status().message().find("is float32 (" + std::to_string(n) +
                                           "), its target int32") != std::string::npos);
      auto reshaped = reader.ReadInto(0, {{"w", target, kBytes, "float32", {n / 2, 2}}}, 5s);
      CHECK(reshaped.status().code() == StatusCode::kInvalidArgument);
      REQUIRE(reader.ReadInto(0, {{"w", target, kBytes, "float32", {n}}}, 5s).value() == 2);
      api.Free(target);
    }
    SECTION("a reader whose IPC open fails reads the host version") {
      auto got = ReadInChild(bus.server->address(), "gpu", 2, "DEVICE_WEIGHTS_FAIL_IPC=1");
      CHECK(got["by_ipc"] == 0);
      CHECK(got["staged"] == 1);
      CHECK(got["crc32c"] == CrcOf(v2));
      CHECK(got["reason"].get<std::string>().find("injected by the test") != std::string::npos);
    }
  }
  // The publisher's stream is gone: its slots and staging buffer are freed,
  // and its slot table with its process's descriptor.
  CHECK(p.api.device_blocks() == 1);  // p.w only
  CHECK(p.api.pinned_blocks() == 0);
  auto got = ReadInChild(bus.server->address(), "gpu", 2);
  CHECK(got["staged"] == 1);
  CHECK(got["crc32c"] == CrcOf(v2));
  CHECK(got["reason"].get<std::string>().find("slot table is not open") != std::string::npos);
}

TEST_CASE("a version published on another node is read through the host") {
  Bus bus;
  Publisher p;
  WeightStream out(*bus.pub, "far");
  DeviceWeightOptions o;
  o.node = "another-node";
  DeviceWeightStream gpu(out, p.api, 0, o);
  const auto v = Values(3);
  REQUIRE(p.Publish(gpu, v, 1).ok());
  auto got = ReadInChild(bus.server->address(), "far", 0);
  CHECK(got["staged"] == 1);
  CHECK(got["reason"] == "published on another node");
  CHECK(got["crc32c"] == CrcOf(v));
}

TEST_CASE("over a stream with delta versions, a device version's host copy is a delta too") {
  Bus bus;
  testing::FakeDevice dev;
  // Larger than a message carries inline: only such versions have deltas read.
  const size_t n = 32 * kFloats, bytes = n * sizeof(float);  // 8 MiB
  void* w = *dev.Malloc(bytes);
  WeightStream out(*bus.pub, "gpu-delta", 0, WeightStreamOptions{.delta = true});
  DeviceWeightStream gpu(out, dev, 0);
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<float>(i % 1000) / 7.0f;
  auto publish = [&](int64_t step) {
    std::memcpy(w, v.data(), bytes);  // fake device memory is host memory
    return gpu.Publish({{"w", "float32", {static_cast<int64_t>(n)}, w, bytes}}, step);
  };
  REQUIRE(publish(1).value() == 1);
  const uint32_t crc1 = Crc32c(v.data(), bytes);
  for (size_t i = 0; i < n; i += 100) v[i] += 1.0f;  // 1% of the values
  REQUIRE(publish(2).value() == 2);
  const uint32_t crc2 = Crc32c(v.data(), bytes);
  CHECK(out.stats().deltas_published == 1);
  CHECK(out.stats().delta_bytes_published * 20 < static_cast<int64_t>(bytes));
  // A reader that reads through the host as one on another node does (the
  // publisher's process: no IPC): version 2 from its delta to version 1.
  auto sub = testing::ConnectRemoteBus(bus.server->address(), kSecret, "sub");
  WeightStream in(*sub, "gpu-delta", 0, WeightStreamOptions{.delta = true});
  testing::FakeDevice api;
  DeviceWeightStream reader(in, api, 0);
  void* target = *api.Malloc(bytes);
  REQUIRE(reader.ReadInto(1, {{"w", target, bytes}}, 5s).value() == 1);
  CHECK(Crc32c(target, bytes) == crc1);
  REQUIRE(reader.ReadInto(2, {{"w", target, bytes}}, 5s).value() == 2);
  CHECK(Crc32c(target, bytes) == crc2);
  CHECK(reader.stats().versions_staged == 2);
  CHECK(in.stats().versions_from_delta == 1);
  CHECK(in.stats().delta_mismatches == 0);
  api.Free(target);
  dev.Free(w);
}

TEST_CASE(
    "a record whose descriptor is no longer a slot table (now a FIFO without a writer) is "
    "read through the host, without waiting in open") {
  Bus bus;
  Publisher p;
  WeightStream out(*bus.pub, "fifo");
  DeviceWeightStream gpu(out, p.api, 0);
  REQUIRE(p.Publish(gpu, Values(5), 1).value() == 1);
  DeviceWeightRecord r = NewestRecord(*bus.sub, "fifo");
  // Version 2 without a device record; then a record for it naming a
  // process's descriptor that is a FIFO nobody writes to (as a publisher's
  // table number reused after its stream went).
  const auto v2 = Values(6);
  REQUIRE(out.Publish({{"w", "float32", {static_cast<int64_t>(kFloats)}, v2.data(), kBytes}}, 2)
              .value() == 2);
  testing::TempDir dir;
  const std::string fifo = dir.path + "/fifo";
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  int fds[2];
  REQUIRE(::pipe2(fds, O_CLOEXEC) == 0);
  const pid_t holder = ::fork();
  REQUIRE(holder >= 0);
  if (holder == 0) {
    const int fd = ::open(fifo.c_str(), O_RDONLY | O_NONBLOCK);
    const int32_t got = fd;
    (void)!::write(fds[1], &got, sizeof got);
    ::pause();
    std::_Exit(0);
  }
  ::close(fds[1]);
  int32_t fifo_fd = -1;
  REQUIRE(::read(fds[0], &fifo_fd, sizeof fifo_fd) == sizeof fifo_fd);
  ::close(fds[0]);
  REQUIRE(fifo_fd >= 0);
  r.version = 2;
  r.pid = holder;
  r.fd = fifo_fd;
  REQUIRE(bus.pub->Publish(WeightDeviceTopic("fifo"), r.Encode()).ok());
  auto got = ReadInChild(bus.server->address(), "fifo", 2);
  CHECK(got["staged"] == 1);
  CHECK(got["reason"].get<std::string>().find("slot table is not open") != std::string::npos);
  CHECK(got["crc32c"] == CrcOf(v2));
  ::kill(holder, SIGKILL);
  ::waitpid(holder, nullptr, 0);
}

TEST_CASE(
    "a slot a reader holds is never rewritten, a killed reader releases it, and a reused "
    "slot is noticed") {
  Bus bus;
  Publisher p;
  WeightStream out(*bus.pub, "held");
  DeviceWeightStream gpu(out, p.api, 0);  // two slots
  std::vector<std::vector<float>> v;
  for (uint32_t i = 0; i < 5; ++i) v.push_back(Values(10 + i));
  REQUIRE(p.Publish(gpu, v[0], 1).value() == 1);  // slot 0
  const DeviceWeightRecord first = NewestRecord(*bus.sub, "held");
  REQUIRE(first.slot == 0);
  // A reader copying from slot 0 (killed later, mid-copy as it were).
  Child holder = Spawn({"hold", std::to_string(first.pid), std::to_string(first.fd), "0"}, true);
  REQUIRE(holder.out == "held\n");
  REQUIRE(p.Publish(gpu, v[1], 2).value() == 2);  // slot 1
  REQUIRE(p.Publish(gpu, v[2], 3).value() == 3);  // slot 0 held: slot 1 again
  CHECK(NewestRecord(*bus.sub, "held").slot == 1);
  CHECK(gpu.stats().versions_shared == 3);
  // Version 1 is still in slot 0 (readers share the lock); version 2's slot now holds 3.
  auto got = ReadInChild(bus.server->address(), "held", 1);
  CHECK(got["by_ipc"] == 1);
  CHECK(got["crc32c"] == CrcOf(v[0]));
  got = ReadInChild(bus.server->address(), "held", 2);
  CHECK(got["staged"] == 1);
  CHECK(got["reason"] == "its slot now holds version 3");
  CHECK(got["crc32c"] == CrcOf(v[1]));

  SECTION("with every slot held the version is the host's only") {
    WeightStream one_out(*bus.pub, "one");
    DeviceWeightOptions o;
    o.slots = 1;
    DeviceWeightStream one(one_out, p.api, 0, o);
    REQUIRE(p.Publish(one, v[3], 1).ok());
    const DeviceWeightRecord r = NewestRecord(*bus.sub, "one");
    Child h = Spawn({"hold", std::to_string(r.pid), std::to_string(r.fd), "0"}, true);
    REQUIRE(h.out == "held\n");
    REQUIRE(p.Publish(one, v[4], 2).value() == 2);
    CHECK(one.stats().versions_not_shared == 1);
    got = ReadInChild(bus.server->address(), "one", 2);
    CHECK(got["staged"] == 1);
    CHECK(got["reason"].get<std::string>().find("has no device slot") != std::string::npos);
    CHECK(got["crc32c"] == CrcOf(v[4]));
    ::kill(h.pid, SIGKILL);
    ::waitpid(h.pid, nullptr, 0);
  }
  SECTION("the killed reader's slot is taken again") {
    ::kill(holder.pid, SIGKILL);
    REQUIRE(::waitpid(holder.pid, nullptr, 0) == holder.pid);
    holder.pid = -1;
    REQUIRE(p.Publish(gpu, v[3], 4).value() == 4);
    CHECK(NewestRecord(*bus.sub, "held").slot == 0);
    got = ReadInChild(bus.server->address(), "held", 0);
    CHECK(got["by_ipc"] == 1);
    CHECK(got["crc32c"] == CrcOf(v[3]));
  }
  if (holder.pid > 0) {
    ::kill(holder.pid, SIGKILL);
    ::waitpid(holder.pid, nullptr, 0);
  }
}

TEST_CASE("the device topic follows the stream's ACL") {
  Bus bus;
  auto outsider = testing::ConnectBus(bus.server->address(), kSecret, "outsider");
  Publisher p;
  WeightStream out(*bus.pub, "acl");
  DeviceWeightStream gpu(out, p.api, 0);
  REQUIRE(p.Publish(gpu, Values(4), 1).ok());
  CHECK(outsider->Fetch(WeightDeviceTopic("acl"), 0, 1, 1s).status().code() ==
        StatusCode::kPermissionDenied);
  CHECK(outsider->Publish(WeightDeviceTopic("acl"), "{}").status().code() ==
        StatusCode::kPermissionDenied);
  // The outsider's reader gets nothing by either path.
  WeightStream in(*outsider, "acl");
  testing::FakeDevice api;
  DeviceWeightStream reader(in, api, 0);
  void* target = *api.Malloc(kBytes);
  CHECK(reader.ReadInto(1, {{"w", target, kBytes}}, 1s).status().code() ==
        StatusCode::kPermissionDenied);
  api.Free(target);
}

TEST_CASE(
    "copies are ordered after the caller's stream, and a slot is freed only once no reader "
    "copies from it") {
  Bus bus;
  Publisher p;
  auto out = std::make_unique<WeightStream>(*bus.pub, "order");
  auto gpu = std::make_unique<DeviceWeightStream>(*out, p.api, 0);
  const auto v1 = Values(21), v2 = Values(22);
  std::memcpy(p.w, v1.data(), kBytes);
  // The training stream writes v2 into the tensor late (a kernel still
  // running when Publish is called): the version must be v2.
  auto training = p.api.CreateStream();
  REQUIRE(training.ok());
  p.api.EnqueueHostWork(
      *training, [&] { std::memcpy(p.w, v2.data(), kBytes); }, 50ms);
  REQUIRE(gpu->Publish({{"w", "float32", {static_cast<int64_t>(kFloats)}, p.w, kBytes}}, 1, 10s,
                       *training)
              .value() == 1);
  auto got = ReadInChild(bus.server->address(), "order", 1);
  CHECK(got["by_ipc"] == 1);
  CHECK(got["crc32c"] == CrcOf(v2));

  // A reader copying from slot 0 when the publisher's stream goes: the slot
  // is not freed until the reader lets go.
  const DeviceWeightRecord r = NewestRecord(*bus.sub, "order");
  Child holder = Spawn({"hold", std::to_string(r.pid), std::to_string(r.fd), "0"}, true);
  REQUIRE(holder.out == "held\n");
  const size_t before = p.api.device_blocks();  // p.w and slot 0
  std::thread closing([&] { gpu.reset(); });
  // The destructor has begun (its pinned buffer goes first) and waits on the
  // held lock: the slot stays allocated (a negative, so given a moment).
  const auto until = std::chrono::steady_clock::now() + 10s;
  while (p.api.pinned_blocks() != 0 && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(1ms);
  CHECK(p.api.pinned_blocks() == 0);
  std::this_thread::sleep_for(100ms);
  CHECK(p.api.device_blocks() == before);
  ::kill(holder.pid, SIGKILL);
  REQUIRE(::waitpid(holder.pid, nullptr, 0) == holder.pid);
  closing.join();
  CHECK(p.api.device_blocks() == before - 1);
  CHECK(p.api.pinned_blocks() == 0);
}
