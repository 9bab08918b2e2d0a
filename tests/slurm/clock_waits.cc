// Waits until a wall-clock instant 200 ms ahead, each way the clock shim
// (clock_offset_shim.cc) handles, and a steady one beside them, timed on the
// steady clock: run under the shim with any offset, each must take about
// 200 ms (a wait whose instant the shim did not move back lasts the offset
// longer, or ends at once). Prints a line per wait; exits 1 if any is off.
//
//   LD_PRELOAD=libagentrt_clock_offset.so AGENTRT_TESTCLUSTER_CLOCK_FILE=F clock_waits
#include <linux/futex.h>
#include <pthread.h>
#include <semaphore.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <functional>
#include <mutex>
#include <thread>

namespace {

constexpr long kWaitNs = 200'000'000;

// `clock`'s now plus 200 ms.
timespec Ahead(clockid_t clock) {
  timespec ts{};
  clock_gettime(clock, &ts);
  ts.tv_nsec += kWaitNs;
  if (ts.tv_nsec >= 1'000'000'000) {
    ts.tv_nsec -= 1'000'000'000;
    ts.tv_sec += 1;
  }
  return ts;
}

bool Timed(const char* name, const std::function<void()>& wait) {
  const auto t0 = std::chrono::steady_clock::now();
  wait();
  const double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  const bool ok = ms >= 150 && ms < 2000;
  std::printf("%s %s: %.0f ms\n", ok ? "ok" : "FAIL", name, ms);
  return ok;
}

void CondWait(clockid_t clock, bool shared) {
  pthread_condattr_t attr;
  pthread_condattr_init(&attr);
  pthread_condattr_setclock(&attr, clock);
  if (shared) pthread_condattr_setpshared(&attr, PTHREAD_PROCESS_SHARED);
  pthread_cond_t cond;
  pthread_cond_init(&cond, &attr);
  pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
  pthread_mutex_lock(&mu);
  const timespec at = Ahead(clock);
  while (pthread_cond_timedwait(&cond, &mu, &at) == 0) {
  }
  pthread_mutex_unlock(&mu);
  pthread_cond_destroy(&cond);
  pthread_condattr_destroy(&attr);
}

}  // namespace

int main() {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // a wait that never ends still shows the ones before
  bool ok = true;
  ok &= Timed("pthread_cond_timedwait, CLOCK_REALTIME", [] { CondWait(CLOCK_REALTIME, false); });
  ok &= Timed("pthread_cond_timedwait, CLOCK_MONOTONIC", [] { CondWait(CLOCK_MONOTONIC, false); });
  ok &= Timed("pthread_cond_timedwait, CLOCK_REALTIME, process-shared",
              [] { CondWait(CLOCK_REALTIME, true); });
  ok &= Timed("condition_variable::wait_until(system_clock) (pthread_cond_clockwait)", [] {
    std::mutex mu;
    std::condition_variable cv;
    std::unique_lock<std::mutex> lock(mu);
    const auto until = std::chrono::system_clock::now() + std::chrono::nanoseconds(kWaitNs);
    while (cv.wait_until(lock, until) != std::cv_status::timeout) {
    }
  });
  ok &= Timed("sem_timedwait", [] {
    sem_t sem;
    sem_init(&sem, 0, 0);
    const timespec at = Ahead(CLOCK_REALTIME);
    while (sem_timedwait(&sem, &at) == 0) {
    }
    sem_destroy(&sem);
  });
  ok &= Timed("pthread_mutex_timedlock", [] {
    pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
    pthread_mutex_lock(&mu);
    std::thread other([&] {
      const timespec at = Ahead(CLOCK_REALTIME);
      if (pthread_mutex_timedlock(&mu, &at) == 0) pthread_mutex_unlock(&mu);
    });
    other.join();
    pthread_mutex_unlock(&mu);
  });
  ok &= Timed("clock_nanosleep(CLOCK_REALTIME, TIMER_ABSTIME)", [] {
    const timespec at = Ahead(CLOCK_REALTIME);
    while (clock_nanosleep(CLOCK_REALTIME, TIMER_ABSTIME, &at, nullptr) != 0) {
    }
  });
  ok &= Timed("futex(FUTEX_WAIT_BITSET | FUTEX_CLOCK_REALTIME) through syscall()", [] {
    int word = 0;
    const timespec at = Ahead(CLOCK_REALTIME);
    while (syscall(SYS_futex, &word, FUTEX_WAIT_BITSET | FUTEX_PRIVATE_FLAG | FUTEX_CLOCK_REALTIME,
                   0, &at, nullptr, FUTEX_BITSET_MATCH_ANY) == 0) {
    }
  });
  // A reading through syscall() is the same clock as clock_gettime's.
  timespec direct{}, raw{};
  clock_gettime(CLOCK_REALTIME, &direct);
  syscall(SYS_clock_gettime, CLOCK_REALTIME, &raw);
  const bool same = raw.tv_sec - direct.tv_sec <= 1 && raw.tv_sec - direct.tv_sec >= 0;
  std::printf("%s syscall(SYS_clock_gettime) reads %+lld s from clock_gettime\n",
              same ? "ok" : "FAIL", static_cast<long long>(raw.tv_sec - direct.tv_sec));
  ok &= same;
  return ok ? 0 : 1;
}
