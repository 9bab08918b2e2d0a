// A node's wall clock, stepped: an LD_PRELOAD library that the multi-node
// test cluster (slurm/testcluster/start.sh --clock-shim) gives every task of
// a node, so a test can step one node's clock while the others keep theirs
// (the nodes are network namespaces of one kernel, which has one wall clock).
//
// It adds the node's offset to every reading of the wall clock:
// clock_gettime of CLOCK_REALTIME and its variants (also through syscall()),
// gettimeofday, time, timespec_get. The steady clocks (CLOCK_MONOTONIC,
// CLOCK_BOOTTIME) are left alone, as an NTP step leaves them. The offset is
// the signed 64-bit count of nanoseconds (native byte order) at the start of
// the file named by AGENTRT_TESTCLUSTER_CLOCK_FILE, mapped once, so a test
// that stores a new one steps the clock of every process of the node at
// once. Without the variable, or with a file that cannot be mapped, the
// clock is the host's.
//
// A wait until a wall-clock instant is timed by the kernel on the host's
// clock, so the shim moves the instant back by the offset in:
// futex(FUTEX_WAIT_BITSET | FUTEX_CLOCK_REALTIME) through syscall()
// (Abseil's mutexes, and so gRPC's), pthread_cond_timedwait on a condition
// variable of CLOCK_REALTIME, pthread_cond_clockwait, sem_timedwait,
// sem_clockwait, pthread_mutex_timedlock, pthread_mutex_clocklock and
// clock_nanosleep(TIMER_ABSTIME), each of the wall clock. Not in: read-write
// locks, message queues, timers (timerfd_settime, timer_settime) and
// priority-inheritance futexes, which nothing of a test run waits on this
// way. Without it a forward step would make each such wait last the step
// longer. What it cannot do is what the kernel does at a real step: a wait
// already under way ends at the instant it was given, on the clock as it
// was when it began.
#include <dlfcn.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <pthread.h>
#include <semaphore.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cstdarg>
#include <cstdint>
#include <cstdlib>

namespace {

// The next definition of `name` (libc's), looked up once per call site.
template <typename F>
F Next(std::atomic<F>* cache, const char* name) {
  F f = cache->load(std::memory_order_acquire);
  if (f == nullptr) {
    f = reinterpret_cast<F>(dlsym(RTLD_NEXT, name));
    cache->store(f, std::memory_order_release);
  }
  return f;
}

using ClockGettime = int (*)(clockid_t, struct timespec*);
std::atomic<ClockGettime> g_clock_gettime{nullptr};
ClockGettime Real() { return Next(&g_clock_gettime, "clock_gettime"); }

using Syscall = long (*)(long, ...);
std::atomic<Syscall> g_syscall{nullptr};

// The node's offset, mapped; null until looked up or when there is none.
std::atomic<const std::atomic<int64_t>*> g_offset{nullptr};
std::atomic<bool> g_looked{false};

int64_t OffsetNs() {
  if (!g_looked.load(std::memory_order_acquire)) {
    const char* path = std::getenv("AGENTRT_TESTCLUSTER_CLOCK_FILE");
    const std::atomic<int64_t>* mapped = nullptr;
    if (path != nullptr && *path != '\0') {
      const int fd = ::open(path, O_RDONLY | O_CLOEXEC);
      struct stat st {};
      if (fd >= 0 && ::fstat(fd, &st) == 0 && st.st_size >= 8) {
        void* p = ::mmap(nullptr, 8, PROT_READ, MAP_SHARED, fd, 0);
        if (p != MAP_FAILED) mapped = static_cast<const std::atomic<int64_t>*>(p);
      }
      if (fd >= 0) ::close(fd);
    }
    // Two threads may both look: each maps the same file; one mapping stays.
    g_offset.store(mapped, std::memory_order_release);
    g_looked.store(true, std::memory_order_release);
  }
  const std::atomic<int64_t>* offset = g_offset.load(std::memory_order_acquire);
  return offset == nullptr ? 0 : offset->load(std::memory_order_relaxed);
}

bool IsWallClock(clockid_t id) {
  return id == CLOCK_REALTIME || id == CLOCK_REALTIME_COARSE || id == CLOCK_TAI ||
         id == CLOCK_REALTIME_ALARM;
}

// `ts` moved by `ns` nanoseconds. An instant moved before 1970 is 1970 (Abseil
// waits until 0.1 s after 1970 for "at once"); "forever" (past what int64
// nanoseconds hold) and a malformed `ts` (the callee says EINVAL) stay as
// they are.
struct timespec Moved(struct timespec ts, int64_t ns) {
  constexpr int64_t kNs = 1000000000;
  if (ts.tv_nsec < 0 || ts.tv_nsec >= kNs || ts.tv_sec < 0) return ts;
  int64_t t = 0;
  if (__builtin_mul_overflow(static_cast<int64_t>(ts.tv_sec), kNs, &t) ||
      __builtin_add_overflow(t, static_cast<int64_t>(ts.tv_nsec), &t) ||
      __builtin_add_overflow(t, ns, &t))
    return ts;  // "forever" (from a non-negative instant, only an upward overflow)
  if (t < 0) return {0, 0};
  return {static_cast<time_t>(t / kNs), static_cast<long>(t % kNs)};
}

void Shift(struct timespec* ts) { *ts = Moved(*ts, OffsetNs()); }

// The instant `at` of a wait as the kernel must be given it: a wall-clock
// one (`wall`) of this node as the host's clock reads it, any other as it is.
struct timespec HostInstant(const struct timespec* at, bool wall = true) {
  return wall ? Moved(*at, -OffsetNs()) : *at;
}

// Resolves libc's functions and maps the offset before the program's own
// code runs, so that a first reading inside a signal handler takes no lock.
__attribute__((constructor)) void Prepare() {
  Real();
  Next(&g_syscall, "syscall");
  OffsetNs();
}

int WallNow(clockid_t id, struct timespec* ts) {
  const ClockGettime real = Real();
  if (real == nullptr) return -1;
  const int rc = real(id, ts);
  if (rc == 0) Shift(ts);
  return rc;
}

}  // namespace

extern "C" {

__attribute__((visibility("default"))) int clock_gettime(clockid_t id, struct timespec* ts) {
  if (!IsWallClock(id)) {
    const ClockGettime real = Real();
    return real == nullptr ? -1 : real(id, ts);
  }
  return WallNow(id, ts);
}

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wnonnull-compare"  // glibc says nonnull; the kernel takes NULL
__attribute__((visibility("default"))) int gettimeofday(struct timeval* tv, void* tz) {
  struct timespec ts {};
  const int rc = WallNow(CLOCK_REALTIME, &ts);
  if (rc == 0 && tv != nullptr) {
    tv->tv_sec = ts.tv_sec;
    tv->tv_usec = static_cast<suseconds_t>(ts.tv_nsec / 1000);
  }
  if (rc == 0 && tz != nullptr) *static_cast<struct timezone*>(tz) = {0, 0};
  return rc;
}
#pragma GCC diagnostic pop

__attribute__((visibility("default"))) time_t time(time_t* out) {
  struct timespec ts {};
  if (WallNow(CLOCK_REALTIME, &ts) != 0) return static_cast<time_t>(-1);
  if (out != nullptr) *out = ts.tv_sec;
  return ts.tv_sec;
}

__attribute__((visibility("default"))) int timespec_get(struct timespec* ts, int base) {
  if (base != TIME_UTC || WallNow(CLOCK_REALTIME, ts) != 0) return 0;
  return base;
}

// The waits until a wall-clock instant.

// Six arguments are read whatever the call has, as glibc's own syscall()
// does: on x86-64 and aarch64 the unused ones are whatever the registers hold.
__attribute__((visibility("default"))) long syscall(long number, ...) {
  va_list ap;
  va_start(ap, number);
  long a[6];
  for (long& x : a) x = va_arg(ap, long);
  va_end(ap);
  const auto real = Next(&g_syscall, "syscall");
  if (number == SYS_clock_gettime && IsWallClock(static_cast<clockid_t>(a[0]))) {
    const long rc = real(number, a[0], a[1]);
    if (rc == 0) Shift(reinterpret_cast<struct timespec*>(a[1]));
    return rc;
  }
  const int op = static_cast<int>(a[1]);
  if (number == SYS_futex && a[3] != 0 && (op & FUTEX_CLOCK_REALTIME) != 0 &&
      (op & FUTEX_CMD_MASK) == FUTEX_WAIT_BITSET) {
    struct timespec at = HostInstant(reinterpret_cast<const struct timespec*>(a[3]));
    return real(number, a[0], a[1], a[2], reinterpret_cast<long>(&at), a[4], a[5]);
  }
  return real(number, a[0], a[1], a[2], a[3], a[4], a[5]);
}

__attribute__((visibility("default"))) int pthread_cond_timedwait(pthread_cond_t* cond,
                                                                  pthread_mutex_t* mutex,
                                                                  const struct timespec* at) {
  using F = int (*)(pthread_cond_t*, pthread_mutex_t*, const struct timespec*);
  static std::atomic<F> next{nullptr};
  // glibc (2.25 on) keeps a condition variable's clock in bit 1 of __wrefs
  // (set: CLOCK_MONOTONIC); bit 0 says it is process-shared.
  const struct timespec host = HostInstant(at, (cond->__data.__wrefs & 2) == 0);
  return Next(&next, "pthread_cond_timedwait")(cond, mutex, &host);
}

__attribute__((visibility("default"))) int pthread_cond_clockwait(pthread_cond_t* cond,
                                                                  pthread_mutex_t* mutex,
                                                                  clockid_t clock,
                                                                  const struct timespec* at) {
  using F = int (*)(pthread_cond_t*, pthread_mutex_t*, clockid_t, const struct timespec*);
  static std::atomic<F> next{nullptr};
  const struct timespec host = HostInstant(at, IsWallClock(clock));
  return Next(&next, "pthread_cond_clockwait")(cond, mutex, clock, &host);
}

__attribute__((visibility("default"))) int sem_timedwait(sem_t* sem, const struct timespec* at) {
  using F = int (*)(sem_t*, const struct timespec*);
  static std::atomic<F> next{nullptr};
  const struct timespec host = HostInstant(at);
  return Next(&next, "sem_timedwait")(sem, &host);
}

__attribute__((visibility("default"))) int sem_clockwait(sem_t* sem, clockid_t clock,
                                                         const struct timespec* at) {
  using F = int (*)(sem_t*, clockid_t, const struct timespec*);
  static std::atomic<F> next{nullptr};
  const struct timespec host = HostInstant(at, IsWallClock(clock));
  return Next(&next, "sem_clockwait")(sem, clock, &host);
}

__attribute__((visibility("default"))) int pthread_mutex_timedlock(pthread_mutex_t* mutex,
                                                                   const struct timespec* at) {
  using F = int (*)(pthread_mutex_t*, const struct timespec*);
  static std::atomic<F> next{nullptr};
  const struct timespec host = HostInstant(at);
  return Next(&next, "pthread_mutex_timedlock")(mutex, &host);
}

__attribute__((visibility("default"))) int pthread_mutex_clocklock(pthread_mutex_t* mutex,
                                                                   clockid_t clock,
                                                                   const struct timespec* at) {
  using F = int (*)(pthread_mutex_t*, clockid_t, const struct timespec*);
  static std::atomic<F> next{nullptr};
  const struct timespec host = HostInstant(at, IsWallClock(clock));
  return Next(&next, "pthread_mutex_clocklock")(mutex, clock, &host);
}

__attribute__((visibility("default"))) int clock_nanosleep(clockid_t clock, int flags,
                                                           const struct timespec* at,
                                                           struct timespec* left) {
  using F = int (*)(clockid_t, int, const struct timespec*, struct timespec*);
  static std::atomic<F> next{nullptr};
  const struct timespec host = HostInstant(at, (flags & TIMER_ABSTIME) != 0 && IsWallClock(clock));
  return Next(&next, "clock_nanosleep")(clock, flags, &host, left);
}

}  // extern "C"
