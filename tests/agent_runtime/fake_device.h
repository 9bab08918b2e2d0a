// A device::Api that runs on the host, for unit tests of the logic around
// CUDA and NCCL calls (ordering, polling, abort, deadlines, rendezvous, device
// choice). Like a GPU it runs work asynchronously: each stream is a queue of
// operations that complete only when the device makes progress (on every
// stream query, synchronisation or communicator poll), in stream order, with
// events and stream waits ordering one stream after another. Collectives
// complete when every rank of their communicator has reached them; ranks are
// threads of the test sharing one FakeDevice. Device memory is host memory
// tagged with the device it was allocated on; using a stream from a thread
// whose current device is another fails, as CUDA does.
//
// Device memory is a memfd mapping, so that CUDA IPC works across processes
// as on a GPU: a handle names the allocating process and the memfd, and
// IpcOpenMemHandle maps /proc/<pid>/fd/<fd> (refused in the allocating
// process, as CUDA refuses it).
//
// Knobs for faults: Hang() holds a stream until ReleaseHangs(), and CommAbort
// waits while a hang is held (as ncclCommAbort waits behind user work);
// FailComms() makes every communicator report an async error; SetDeviceCount
// sets what DeviceCount() answers (or an error); FailIpcOpen makes
// IpcOpenMemHandle fail.
#pragma once

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "agent_runtime/device_api.h"

namespace agentrt::testing {

class FakeDevice final : public device::Api {
 public:
  using Clock = std::chrono::steady_clock;

  explicit FakeDevice(int devices = 1) : devices_(devices) {}
  ~FakeDevice() override {
    for (auto& [p, block] : memory_) Unmap(p, block);
    for (auto& [p, bytes] : opened_) ::munmap(p, std::max<size_t>(bytes, 1));
    for (void* p : pinned_) delete[] static_cast<char*>(p);
  }

  // ---- knobs and counters (thread-safe) ----
  void SetDeviceCount(Result<int> count) {
    std::lock_guard<std::mutex> lock(mu_);
    devices_ = std::move(count);
  }
  // Work on `stream` (nullptr: the current device's legacy stream) that runs
  // `fn` once `delay` has passed, then completes: a kernel that writes late.
  void EnqueueHostWork(device::Stream stream, std::function<void()> fn,
                       std::chrono::milliseconds delay) {
    std::lock_guard<std::mutex> lock(mu_);
    const auto at = Clock::now() + delay;
    StreamOf(stream).ops.push_back([fn = std::move(fn), at] {
      if (Clock::now() < at) return false;
      fn();
      return true;
    });
  }
  // Holds `stream` until ReleaseHangs(): a kernel that never finishes.
  void Hang(device::Stream stream) {
    std::lock_guard<std::mutex> lock(mu_);
    hung_ = true;
    StreamOf(stream).ops.push_back([this] { return !hung_; });
  }
  void ReleaseHangs() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      hung_ = false;
    }
    cv_.notify_all();
  }
  void FailIpcOpen(std::string why) {
    std::lock_guard<std::mutex> lock(mu_);
    ipc_open_error_ = std::move(why);
  }
  // Device allocations not freed, and IPC mappings not closed.
  size_t device_blocks() const {
    std::lock_guard<std::mutex> lock(mu_);
    return memory_.size();
  }
  size_t ipc_opened() const {
    std::lock_guard<std::mutex> lock(mu_);
    return opened_.size();
  }
  // IPC mappings opened, in all.
  int64_t ipc_opens() const {
    std::lock_guard<std::mutex> lock(mu_);
    return ipc_opens_;
  }
  // Copies of this kind done, in all.
  int64_t copies(device::CopyKind kind) const {
    return copies_[static_cast<size_t>(kind)].load(std::memory_order_relaxed);
  }
  void FailComms(std::string why) {
    std::lock_guard<std::mutex> lock(mu_);
    comm_error_ = std::move(why);
  }
  int64_t stream_queries() const {
    std::lock_guard<std::mutex> lock(mu_);
    return stream_queries_;
  }
  int aborts_started() const {
    std::lock_guard<std::mutex> lock(mu_);
    return aborts_started_;
  }
  // Waits (bounded) until `n` aborts have started.
  bool WaitAbortsStarted(int n, std::chrono::milliseconds timeout) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, timeout, [&] { return aborts_started_ >= n; });
  }
  // Waits (bounded) until `n` aborts have finished.
  bool WaitAbortsFinished(int n, std::chrono::milliseconds timeout) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, timeout, [&] { return aborts_finished_ >= n; });
  }
  // Every stream the device knows has drained (bounded wait).
  bool WaitIdle(std::chrono::milliseconds timeout) {
    const auto until = Clock::now() + timeout;
    for (;;) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        Pump();
        bool idle = true;
        for (auto& s : streams_) idle &= s->ops.empty();
        if (idle) return true;
      }
      if (Clock::now() >= until) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }

  // ---- device::Api ----
  Result<int> DeviceCount() override {
    std::lock_guard<std::mutex> lock(mu_);
    return devices_;
  }
  Result<int> CurrentDevice() override {
    std::lock_guard<std::mutex> lock(mu_);
    return Current();
  }
  Status SetDevice(int device) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (!devices_.ok() || device < 0 || device >= *devices_) {
      return InvalidArgument("fake cudaSetDevice(" + std::to_string(device) +
                             "): invalid device ordinal");
    }
    current_[std::this_thread::get_id()] = device;
    return Status::Ok();
  }
  Result<bool> CanAccessPeer(int device, int peer) override {
    return (device / 2) == (peer / 2);  // pairs of GPUs share a link
  }
  Result<device::Stream> CreateStream() override {
    std::lock_guard<std::mutex> lock(mu_);
    streams_.push_back(std::make_unique<FakeStream>());
    streams_.back()->device = Current();
    return static_cast<device::Stream>(streams_.back().get());
  }
  void DestroyStream(device::Stream stream) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (stream != nullptr) static_cast<FakeStream*>(stream)->destroyed = true;
  }
  Result<device::Event> CreateEvent() override {
    std::lock_guard<std::mutex> lock(mu_);
    events_.push_back(std::make_unique<FakeEvent>());
    return static_cast<device::Event>(events_.back().get());
  }
  void DestroyEvent(device::Event) override {}
  Status RecordEvent(device::Event event, device::Stream stream) override {
    std::lock_guard<std::mutex> lock(mu_);
    AGENTRT_RETURN_IF_ERROR(CheckStream(stream, "cudaEventRecord"));
    auto* e = static_cast<FakeEvent*>(event);
    const uint64_t gen = ++e->recorded;
    StreamOf(stream).ops.push_back([e, gen] {
      e->completed = std::max(e->completed, gen);
      return true;
    });
    return Status::Ok();
  }
  Status StreamWaitEvent(device::Stream stream, device::Event event) override {
    std::lock_guard<std::mutex> lock(mu_);
    AGENTRT_RETURN_IF_ERROR(CheckStream(stream, "cudaStreamWaitEvent"));
    auto* e = static_cast<FakeEvent*>(event);
    const uint64_t gen = e->recorded;
    StreamOf(stream).ops.push_back([e, gen] { return e->completed >= gen; });
    return Status::Ok();
  }
  Result<device::Progress> QueryStream(device::Stream stream) override {
    std::lock_guard<std::mutex> lock(mu_);
    ++stream_queries_;
    AGENTRT_RETURN_IF_ERROR(CheckStream(stream, "cudaStreamQuery"));
    Pump();
    return StreamOf(stream).ops.empty() ? device::Progress::kDone : device::Progress::kPending;
  }
  Status SynchronizeStream(device::Stream stream) override {
    const auto until = Clock::now() + std::chrono::seconds(10);
    for (;;) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        AGENTRT_RETURN_IF_ERROR(CheckStream(stream, "cudaStreamSynchronize"));
        Pump();
        if (StreamOf(stream).ops.empty()) return Status::Ok();
      }
      if (Clock::now() >= until) return Internal("fake cudaStreamSynchronize: stuck for 10 s");
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  }
  Result<void*> Malloc(size_t bytes) override {
    std::lock_guard<std::mutex> lock(mu_);
    const size_t len = std::max<size_t>(bytes, 1);
    const int fd = ::memfd_create("agentrt-fake-device", MFD_CLOEXEC);
    if (fd < 0) return ResourceExhausted("fake cudaMalloc: memfd_create failed");
    void* p = ::ftruncate(fd, static_cast<off_t>(len)) == 0
                  ? ::mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)
                  : MAP_FAILED;
    if (p == MAP_FAILED) {
      ::close(fd);
      return ResourceExhausted("fake cudaMalloc of " + std::to_string(bytes) + " bytes failed");
    }
    memory_[p] = {bytes, Current(), fd};
    return p;
  }
  void Free(void* ptr) override {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = memory_.find(ptr);
    if (it == memory_.end()) return;
    Unmap(it->first, it->second);
    memory_.erase(it);
  }
  // The handle: "fake-ipc <pid> <fd> <inode> <bytes>" (the inode tells a
  // reused descriptor number from the allocation's).
  Result<device::IpcMemHandle> IpcGetMemHandle(void* ptr) override {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = memory_.find(ptr);
    if (it == memory_.end())
      return InvalidArgument("fake cudaIpcGetMemHandle: not the start of an allocation");
    struct stat st {};
    ::fstat(it->second.fd, &st);
    const std::string text = "fake-ipc " + std::to_string(::getpid()) + " " +
                             std::to_string(it->second.fd) + " " + std::to_string(st.st_ino) + " " +
                             std::to_string(it->second.bytes);
    device::IpcMemHandle h;
    std::copy(text.begin(), text.end(), h.bytes.begin());
    return h;
  }
  Result<void*> IpcOpenMemHandle(const device::IpcMemHandle& handle) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (!ipc_open_error_.empty()) return Internal("fake cudaIpcOpenMemHandle: " + ipc_open_error_);
    long pid = 0, fd = -1;
    unsigned long inode = 0;
    size_t bytes = 0;
    const std::string text(handle.bytes.data(), strnlen(handle.bytes.data(), handle.bytes.size()));
    if (std::sscanf(text.c_str(), "fake-ipc %ld %ld %lu %zu", &pid, &fd, &inode, &bytes) != 4)
      return InvalidArgument("fake cudaIpcOpenMemHandle: invalid handle");
    if (pid == ::getpid())
      return InvalidArgument("fake cudaIpcOpenMemHandle: opened in the process that allocated it");
    const std::string path = "/proc/" + std::to_string(pid) + "/fd/" + std::to_string(fd);
    const int f = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
    struct stat st {};
    if (f < 0 || ::fstat(f, &st) != 0 || st.st_ino != inode) {
      if (f >= 0) ::close(f);
      return InvalidArgument("fake cudaIpcOpenMemHandle: the allocation is gone");
    }
    void* p = ::mmap(nullptr, std::max<size_t>(bytes, 1), PROT_READ | PROT_WRITE, MAP_SHARED, f, 0);
    ::close(f);
    if (p == MAP_FAILED) return Internal("fake cudaIpcOpenMemHandle: mmap failed");
    opened_[p] = bytes;
    ++ipc_opens_;
    return p;
  }
  Status IpcCloseMemHandle(void* ptr) override {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = opened_.find(ptr);
    if (it == opened_.end()) return InvalidArgument("fake cudaIpcCloseMemHandle: not opened");
    ::munmap(it->first, std::max<size_t>(it->second, 1));
    opened_.erase(it);
    return Status::Ok();
  }
  Result<void*> HostAlloc(size_t bytes) override {
    std::lock_guard<std::mutex> lock(mu_);
    void* p = new char[std::max<size_t>(bytes, 1)];
    pinned_.insert(p);
    return p;
  }
  void HostFree(void* ptr) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (pinned_.erase(ptr) > 0) delete[] static_cast<char*>(ptr);
  }
  // Pinned host blocks not freed yet.
  size_t pinned_blocks() {
    std::lock_guard<std::mutex> lock(mu_);
    return pinned_.size();
  }
  Status MemsetAsync(void* ptr, int value, size_t bytes, device::Stream stream) override {
    std::lock_guard<std::mutex> lock(mu_);
    AGENTRT_RETURN_IF_ERROR(CheckStream(stream, "cudaMemsetAsync"));
    StreamOf(stream).ops.push_back([=] {
      std::memset(ptr, value, bytes);
      return true;
    });
    return Status::Ok();
  }
  Status CopyAsync(void* dst, const void* src, size_t bytes, device::CopyKind kind,
                   device::Stream stream) override {
    std::lock_guard<std::mutex> lock(mu_);
    AGENTRT_RETURN_IF_ERROR(CheckStream(stream, "cudaMemcpyAsync"));
    StreamOf(stream).ops.push_back([=, this] {
      std::memmove(dst, src, bytes);
      copies_[static_cast<size_t>(kind)].fetch_add(1, std::memory_order_relaxed);
      return true;
    });
    return Status::Ok();
  }
  Status LaunchAdamW(float* params, const float* grads, float* m, float* v, size_t n,
                     const AdamWScalars& s, device::Stream stream) override {
    std::lock_guard<std::mutex> lock(mu_);
    AGENTRT_RETURN_IF_ERROR(CheckStream(stream, "AdamW kernel launch"));
    StreamOf(stream).ops.push_back([=] {
      AdamWUpdate(params, grads, m, v, n, s);
      return true;
    });
    return Status::Ok();
  }
  Status LaunchSquaredNorm(const float* x, size_t n, double* out, device::Stream stream) override {
    std::lock_guard<std::mutex> lock(mu_);
    AGENTRT_RETURN_IF_ERROR(CheckStream(stream, "squared-norm kernel launch"));
    StreamOf(stream).ops.push_back([=] {
      double sum = 0;
      for (size_t i = 0; i < n; ++i) sum += static_cast<double>(x[i]) * x[i];
      *out += sum;
      return true;
    });
    return Status::Ok();
  }

  Result<device::UniqueId> GetUniqueId() override {
    std::lock_guard<std::mutex> lock(mu_);
    device::UniqueId id;
    const std::string text = "fake-nccl-id-" + std::to_string(++ids_);
    std::copy(text.begin(), text.end(), id.bytes.begin());
    return id;
  }
  Result<device::Comm> CommInitRank(int world_size, const device::UniqueId& id, int rank) override {
    std::lock_guard<std::mutex> lock(mu_);
    World& w = worlds_[std::string(id.bytes.data(), id.bytes.size())];
    w.size = world_size;
    w.joined += 1;
    comms_.push_back(std::make_unique<FakeComm>());
    comms_.back()->world = &w;
    comms_.back()->rank = rank;
    return static_cast<device::Comm>(comms_.back().get());
  }
  Result<device::Progress> CommProgress(device::Comm comm) override {
    std::lock_guard<std::mutex> lock(mu_);
    auto* c = static_cast<FakeComm*>(comm);
    if (c->aborted) return Internal("fake NCCL: communicator used after abort");
    if (!comm_error_.empty()) return Internal("fake NCCL: " + comm_error_);
    Pump();
    return c->world->joined < c->world->size ? device::Progress::kPending : device::Progress::kDone;
  }
  Status CommFinalize(device::Comm) override { return Status::Ok(); }
  void CommDestroy(device::Comm) override {}
  void CommAbort(device::Comm comm) override {
    std::unique_lock<std::mutex> lock(mu_);
    ++aborts_started_;
    static_cast<FakeComm*>(comm)->aborted = true;
    cv_.notify_all();
    cv_.wait(lock, [&] { return !hung_; });  // behind the device's other work
    ++aborts_finished_;
    cv_.notify_all();
  }

  Result<device::Progress> AllReduce(const void* send, void* recv, size_t count, DataType type,
                                     ReduceOp op, device::Comm comm,
                                     device::Stream stream) override {
    return Collective(
        comm, stream, send, count * DataTypeSize(type),
        [=](const std::vector<std::string>& in, int) { Reduce(in, recv, count, type, op); });
  }
  Result<device::Progress> ReduceScatter(const void* send, void* recv, size_t recv_count,
                                         DataType type, ReduceOp op, device::Comm comm,
                                         device::Stream stream) override {
    auto* c = static_cast<FakeComm*>(comm);
    const size_t block = recv_count * DataTypeSize(type);
    return Collective(comm, stream, send, block * static_cast<size_t>(c->world->size),
                      [=](const std::vector<std::string>& in, int rank) {
                        std::vector<std::string> blocks;
                        for (const std::string& s : in)
                          blocks.push_back(s.substr(static_cast<size_t>(rank) * block, block));
                        Reduce(blocks, recv, recv_count, type, op);
                      });
  }
  Result<device::Progress> AllGather(const void* send, void* recv, size_t send_count, DataType type,
                                     device::Comm comm, device::Stream stream) override {
    const size_t block = send_count * DataTypeSize(type);
    return Collective(comm, stream, send, block, [=](const std::vector<std::string>& in, int) {
      for (size_t r = 0; r < in.size(); ++r)
        std::memcpy(static_cast<char*>(recv) + r * block, in[r].data(), block);
    });
  }
  Result<device::Progress> Broadcast(void* buf, size_t count, DataType type, int root,
                                     device::Comm comm, device::Stream stream) override {
    const size_t bytes = count * DataTypeSize(type);
    return Collective(comm, stream, buf, bytes, [=](const std::vector<std::string>& in, int) {
      std::memcpy(buf, in[static_cast<size_t>(root)].data(), bytes);
    });
  }

 private:
  using Op = std::function<bool()>;  // true once complete; run under mu_
  struct FakeStream {
    int device = 0;
    bool destroyed = false;
    std::deque<Op> ops;
  };
  struct FakeEvent {
    uint64_t recorded = 0;
    uint64_t completed = 0;
  };
  struct Slot {
    std::vector<std::string> in;
    int arrived = 0;
  };
  struct World {
    int size = 0;
    int joined = 0;
    std::map<uint64_t, Slot> slots;
  };
  struct FakeComm {
    World* world = nullptr;
    int rank = 0;
    uint64_t next = 0;
    bool aborted = false;
  };

  int Current() {
    auto it = current_.find(std::this_thread::get_id());
    return it == current_.end() ? 0 : it->second;
  }
  FakeStream& StreamOf(device::Stream stream) {
    if (stream != nullptr) return *static_cast<FakeStream*>(stream);
    auto& legacy = legacy_[Current()];
    if (!legacy) {
      legacy = std::make_unique<FakeStream>();
      legacy->device = Current();
      legacy_list_.push_back(legacy.get());
    }
    return *legacy;
  }
  Status CheckStream(device::Stream stream, const char* call) {
    FakeStream& s = StreamOf(stream);
    if (s.destroyed) return Internal(std::string("fake ") + call + ": destroyed stream");
    if (s.device != Current()) {
      return Internal(std::string("fake ") + call + ": invalid resource handle (stream of device " +
                      std::to_string(s.device) + " used while device " + std::to_string(Current()) +
                      " is current)");
    }
    return Status::Ok();
  }
  // Runs every stream's ready work, in order, until nothing moves.
  void Pump() {
    for (bool moved = true; moved;) {
      moved = false;
      auto run = [&](FakeStream& s) {
        while (!s.ops.empty() && s.ops.front()()) {
          s.ops.pop_front();
          moved = true;
        }
      };
      for (auto& s : streams_) run(*s);
      for (FakeStream* s : legacy_list_) run(*s);
    }
  }
  template <typename Finish>
  Result<device::Progress> Collective(device::Comm comm, device::Stream stream, const void* send,
                                      size_t send_bytes, Finish finish) {
    std::lock_guard<std::mutex> lock(mu_);
    AGENTRT_RETURN_IF_ERROR(CheckStream(stream, "nccl collective"));
    auto* c = static_cast<FakeComm*>(comm);
    if (c->aborted) return Internal("fake NCCL: communicator used after abort");
    const uint64_t seq = c->next++;
    World* w = c->world;
    const int rank = c->rank;
    auto contributed = std::make_shared<bool>(false);
    StreamOf(stream).ops.push_back([=] {
      Slot& slot = w->slots[seq];
      if (!*contributed) {
        slot.in.resize(static_cast<size_t>(w->size));
        slot.in[static_cast<size_t>(rank)].assign(static_cast<const char*>(send), send_bytes);
        slot.arrived += 1;
        *contributed = true;
      }
      if (slot.arrived < w->size) return false;
      finish(slot.in, rank);
      return true;
    });
    return device::Progress::kDone;
  }
  static void Reduce(const std::vector<std::string>& in, void* out, size_t count, DataType type,
                     ReduceOp op) {
    auto combine = [&](auto zero) {
      using T = decltype(zero);
      std::vector<T> acc(count, zero);
      for (size_t r = 0; r < in.size(); ++r) {
        const T* x = reinterpret_cast<const T*>(in[r].data());
        for (size_t i = 0; i < count; ++i)
          acc[i] = (op == ReduceOp::kMax && r > 0) ? std::max(acc[i], x[i]) : acc[i] + x[i];
      }
      if (op == ReduceOp::kAvg)
        for (T& a : acc) a /= static_cast<T>(in.size());
      std::memcpy(out, acc.data(), count * sizeof(T));
    };
    if (type == DataType::kInt64) {
      combine(int64_t{0});
    } else {
      combine(0.0f);  // the fake reduces float32 only among the float types
    }
  }

  mutable std::mutex mu_;
  std::condition_variable cv_;
  Result<int> devices_;
  std::map<std::thread::id, int> current_;
  std::vector<std::unique_ptr<FakeStream>> streams_;
  std::map<int, std::unique_ptr<FakeStream>> legacy_;
  std::vector<FakeStream*> legacy_list_;
  std::vector<std::unique_ptr<FakeEvent>> events_;
  std::map<std::string, World> worlds_;
  std::vector<std::unique_ptr<FakeComm>> comms_;
  struct Block {
    size_t bytes = 0;
    int device = 0;
    int fd = -1;  // the memfd
  };
  // Freed memory is poisoned first: a process that still maps it (IPC)
  // reads garbage, as it could on a GPU.
  static void Unmap(void* p, const Block& b) {
    std::memset(p, 0xa5, b.bytes);
    ::munmap(p, std::max<size_t>(b.bytes, 1));
    ::close(b.fd);
  }
  std::map<void*, Block> memory_;
  std::map<void*, size_t> opened_;  // IPC mappings: their bytes
  int64_t ipc_opens_ = 0;
  std::atomic<int64_t> copies_[3] = {};  // done, by device::CopyKind
  std::string ipc_open_error_;
  std::set<void*> pinned_;
  bool hung_ = false;
  std::string comm_error_;
  int64_t stream_queries_ = 0;
  int aborts_started_ = 0;
  int aborts_finished_ = 0;
  uint64_t ids_ = 0;
};

}  // namespace agentrt::testing
