#include "agent_runtime/signals.h"

#include <fcntl.h>
#include <poll.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <csignal>
#include <cstring>

namespace agentrt {
namespace {

constexpr std::array<int, 3> kSignals = {SIGTERM, SIGINT, SIGUSR2};
constexpr unsigned char kShutdownByte = 0;

// Shared with the async signal handler: only lock-free atomics.
std::atomic<int> g_write_fd{-1};
std::atomic<uint64_t> g_counts[NSIG];
struct sigaction g_previous[NSIG];
std::atomic<bool> g_installed{false};

void Handler(int signo) {
  int saved_errno = errno;
  g_counts[signo].fetch_add(1, std::memory_order_relaxed);
  int fd = g_write_fd.load(std::memory_order_relaxed);
  if (fd >= 0) {
    auto byte = static_cast<unsigned char>(signo);
    // Non-blocking: if the pipe is full, the watcher already has work queued.
    ssize_t ignored = ::write(fd, &byte, 1);
    (void)ignored;
  }
  errno = saved_errno;
}

}  // namespace

Result<std::unique_ptr<SignalWatcher>> SignalWatcher::Install() {
  bool expected = false;
  if (!g_installed.compare_exchange_strong(expected, true)) {
    return FailedPrecondition(
        "signal watcher: already installed in this process (only one Runtime may own the "
        "SIGTERM/SIGINT/SIGUSR2 handlers)");
  }
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC | O_NONBLOCK) != 0) {
    g_installed = false;
    return ErrnoStatus(errno, "signal watcher: pipe2");
  }
  auto watcher = std::unique_ptr<SignalWatcher>(new SignalWatcher(fds[0], fds[1]));
  for (int signo : kSignals) g_counts[signo] = 0;
  g_write_fd = fds[1];
  for (int signo : kSignals) {
    struct sigaction sa;
    std::memset(&sa, 0, sizeof sa);
    sa.sa_handler = Handler;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    if (::sigaction(signo, &sa, &g_previous[signo]) != 0) {
      return ErrnoStatus(errno, "signal watcher: sigaction(" + std::to_string(signo) + ")");
    }
  }
  watcher->thread_ = std::thread([w = watcher.get()] { w->Run(); });
  return watcher;
}

SignalWatcher::SignalWatcher(int read_fd, int write_fd) : read_fd_(read_fd), write_fd_(write_fd) {}

SignalWatcher::~SignalWatcher() {
  for (int signo : kSignals) ::sigaction(signo, &g_previous[signo], nullptr);
  g_write_fd = -1;
  if (thread_.joinable()) {
    unsigned char byte = kShutdownByte;
    // The pipe is non-blocking; retry while it is full so the watcher wakes up.
    while (::write(write_fd_, &byte, 1) < 0 && (errno == EAGAIN || errno == EINTR)) {
      ::usleep(1000);
    }
    thread_.join();
  }
  ::close(read_fd_);
  ::close(write_fd_);
  g_installed = false;
}

void SignalWatcher::AddCallback(Callback callback) {
  std::lock_guard<std::mutex> lock(mu_);
  callbacks_.push_back(std::move(callback));
}

uint64_t SignalWatcher::count(int signo) const {
  if (signo <= 0 || signo >= NSIG) return 0;
  return g_counts[signo].load(std::memory_order_relaxed);
}

void SignalWatcher::Run() {
  for (;;) {
    pollfd pfd{read_fd_, POLLIN, 0};
    if (::poll(&pfd, 1, -1) < 0) {
      if (errno == EINTR) continue;
      return;
    }
    unsigned char buf[64];
    ssize_t n = ::read(read_fd_, buf, sizeof buf);
    if (n <= 0) continue;
    for (ssize_t i = 0; i < n; ++i) {
      if (buf[i] == kShutdownByte) return;
      std::vector<Callback> callbacks;
      {
        std::lock_guard<std::mutex> lock(mu_);
        callbacks = callbacks_;
      }
      for (auto& cb : callbacks) cb(buf[i]);
    }
  }
}

}  // namespace agentrt
