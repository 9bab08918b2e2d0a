// ShardWriterProcess (checkpoint_files.h): SaveAsync's copy-on-write
// snapshot. The child's protocol on its pipe to the parent:
//   'y' (every part is in its image; it writes) or 'n' (a part is not: it
//   wrote nothing), then, after 'y', the outcome: u32 status code, u64
//   length and the message, u64 count and the chunk checksums, u32 the
//   whole shard's checksum.
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <string>

#include "agent_runtime/checkpoint_files.h"
#include "common/file_util.h"

namespace agentrt::checkpoint_files {

namespace {

// Reads exactly `n` bytes; false at an end of file before them.
bool ReadExactly(int fd, void* dst, size_t n) {
  auto* p = static_cast<char*>(dst);
  while (n > 0) {
    const ssize_t got = ::read(fd, p, n);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) return false;
    p += got;
    n -= static_cast<size_t>(got);
  }
  return true;
}

// The parent is gone when this fails: nobody waits for the outcome.
void WriteExactly(int fd, const void* src, size_t n) {
  if (!WriteAll(fd, src, n, "", "").ok()) _exit(3);
}

// Whether every page of `part` is mapped in this process (mincore fails with
// ENOMEM on a page that is not). Asked in pieces, with no allocation.
bool Mapped(std::span<const std::byte> part) {
  if (part.empty()) return true;
  const auto page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  uintptr_t at = reinterpret_cast<uintptr_t>(part.data()) / page * page;
  const uintptr_t end = reinterpret_cast<uintptr_t>(part.data()) + part.size();
  unsigned char vec[4096];
  while (at < end) {
    const size_t len = std::min<uintptr_t>(end - at, sizeof(vec) * page);
    if (::mincore(reinterpret_cast<void*>(at), len, vec) != 0) return false;
    at += len;
  }
  return true;
}

// Closes every descriptor of the child but the standard ones and `keep`;
// false when the kernel cannot (close_range: Linux 5.9, and seccomp may
// refuse it).
bool CloseAllBut(std::vector<int> keep) {
  keep.push_back(2);
  std::sort(keep.begin(), keep.end());
  unsigned first = 3;
  for (int fd : keep) {
    if (fd >= static_cast<int>(first)) {
      if (static_cast<unsigned>(fd) > first &&
          ::close_range(first, static_cast<unsigned>(fd) - 1, 0) != 0)
        return false;
      first = static_cast<unsigned>(fd) + 1;
    }
  }
  return ::close_range(first, ~0u, 0) == 0;
}

// Exit codes of a child that wrote nothing (before its 'y').
constexpr int kParentGone = 2;
constexpr int kDescriptorsKept = 4;

// Every signal is blocked already (the forking thread blocked them around
// the fork), and `chunks` was made by the parent: its first use builds a
// table under a static's guard, which another thread might hold at the fork.
[[noreturn]] void RunChild(pid_t parent, int to_parent,
                           const std::vector<std::span<const std::byte>>& parts,
                           std::vector<int> keep, ChunkChecksums& chunks,
                           const std::function<Status(ChunkChecksums& chunks)>& write) {
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (::getppid() != parent) _exit(kParentGone);  // the process died meanwhile
  ::prctl(PR_SET_NAME, "agentrt-ckpt");
  keep.push_back(to_parent);
  if (!CloseAllBut(std::move(keep))) _exit(kDescriptorsKept);
  const bool whole = std::all_of(parts.begin(), parts.end(), Mapped);
  WriteExactly(to_parent, whole ? "y" : "n", 1);
  if (!whole) _exit(0);
  const Status s = write(chunks);
  const std::vector<uint32_t> crcs = chunks.Finish();
  const uint32_t code = static_cast<uint32_t>(s.code());
  const uint64_t length = s.message().size(), count = crcs.size();
  const uint32_t crc = chunks.Whole();
  WriteExactly(to_parent, &code, sizeof(code));
  WriteExactly(to_parent, &length, sizeof(length));
  WriteExactly(to_parent, s.message().data(), length);
  WriteExactly(to_parent, &count, sizeof(count));
  WriteExactly(to_parent, crcs.data(), count * sizeof(uint32_t));
  WriteExactly(to_parent, &crc, sizeof(crc));
  _exit(0);
}

}  // namespace

bool InPrivateMemory(const std::vector<std::span<const std::byte>>& parts) {
  const Result<std::string> maps = ReadWholeFile("/proc/self/maps", size_t{64} << 20);
  if (!maps.ok()) return false;
  struct Range {
    uintptr_t begin, end;
    bool is_private;
  };
  std::vector<Range> ranges;
  // "begin-end perms ...": parsed within each line (a process of thousands of
  // mappings is read while the caller waits).
  const std::string_view text = *maps;
  for (size_t at = 0; at < text.size();) {
    size_t eol = text.find('\n', at);
    if (eol == std::string_view::npos) eol = text.size();
    const std::string_view line = text.substr(at, eol - at);
    at = eol + 1;
    uintptr_t begin = 0, end = 0;
    const char* p = line.data();
    const char* last = line.data() + line.size();
    auto r = std::from_chars(p, last, begin, 16);
    if (r.ec != std::errc() || r.ptr == last || *r.ptr != '-') return false;
    r = std::from_chars(r.ptr + 1, last, end, 16);
    if (r.ec != std::errc() || last - r.ptr < 5 || *r.ptr != ' ') return false;
    ranges.push_back({begin, end, r.ptr[4] == 'p'});
  }
  for (const auto& part : parts) {
    uintptr_t at = reinterpret_cast<uintptr_t>(part.data());
    const uintptr_t end = at + part.size();
    // The ranges are sorted and disjoint: walk those covering the part.
    auto it = std::upper_bound(ranges.begin(), ranges.end(), at,
                               [](uintptr_t a, const Range& r) { return a < r.end; });
    while (at < end) {
      if (it == ranges.end() || it->begin > at || !it->is_private) return false;
      at = it->end;
      ++it;
    }
  }
  return true;
}

std::unique_ptr<ShardWriterProcess> ShardWriterProcess::Start(
    const std::vector<std::span<const std::byte>>& parts, std::vector<int> keep_fds,
    ChunkChecksums& chunks, const std::function<Status(ChunkChecksums& chunks)>& write,
    std::string* why_not) {
  int pipe_fds[2];
  if (::pipe2(pipe_fds, O_CLOEXEC) != 0) {
    *why_not = std::string("no pipe to a writer process: ") + std::strerror(errno);
    return nullptr;
  }
  // No signal may run the process's handlers in the child before it is
  // ready: blocked here, around the fork, and so in the child from its start.
  sigset_t all, before;
  ::sigfillset(&all);
  ::pthread_sigmask(SIG_SETMASK, &all, &before);
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::close(pipe_fds[0]);
    RunChild(parent, pipe_fds[1], parts, std::move(keep_fds), chunks, write);
  }
  const int fork_errno = errno;
  ::pthread_sigmask(SIG_SETMASK, &before, nullptr);
  ::close(pipe_fds[1]);
  if (pid < 0) {
    *why_not = std::string("fork failed: ") + std::strerror(fork_errno);
    ::close(pipe_fds[0]);
    return nullptr;
  }
  std::unique_ptr<ShardWriterProcess> child(new ShardWriterProcess(pid, pipe_fds[0]));
  char ready = 0;
  if (!ReadExactly(child->from_child_, &ready, 1) || ready != 'y') {
    // It wrote nothing and ends (or ended) by itself: reaped here, not killed.
    const Status ended = child->Reap();
    if (ready == 'n') {
      *why_not = "part of the state is not inherited by a forked process (MADV_DONTFORK memory)";
    } else if (ended.ok()) {
      *why_not = "the writer process ended before it started";
    } else {
      *why_not = ended.message() + ", before it started";
    }
    return nullptr;
  }
  return child;
}

Status ShardWriterProcess::Reap() {
  if (pid_ < 0) return Status::Ok();
  int status = 0;
  pid_t got;
  do {
    got = ::waitpid(pid_, &status, 0);
  } while (got < 0 && errno == EINTR);
  const pid_t pid = std::exchange(pid_, -1);
  if (got < 0)
    return Status::Ok();  // reaped by someone else's waitpid(-1): the pipe said how it ended
  if (WIFSIGNALED(status))
    return Unavailable("the checkpoint writer process " + std::to_string(pid) +
                       " was killed by signal " + std::to_string(WTERMSIG(status)));
  if (WIFEXITED(status) && WEXITSTATUS(status) != 0)
    return Unavailable("the checkpoint writer process " + std::to_string(pid) +
                       " exited with code " + std::to_string(WEXITSTATUS(status)) +
                       (WEXITSTATUS(status) == kDescriptorsKept
                            ? " (it could not close the descriptors it inherited: close_range)"
                            : ""));
  return Status::Ok();
}

ShardWriterProcess::~ShardWriterProcess() {
  if (pid_ > 0) ::kill(pid_, SIGKILL);
  (void)Reap();
  if (from_child_ >= 0) ::close(from_child_);
}

Status ShardWriterProcess::Finish(std::string_view context, std::vector<uint32_t>* chunk_crcs,
                                  uint32_t* whole) {
  uint32_t code = 0;
  uint64_t length = 0, count = 0;
  std::string message;
  bool complete = ReadExactly(from_child_, &code, sizeof(code)) &&
                  ReadExactly(from_child_, &length, sizeof(length)) && length <= (1u << 20);
  if (complete) {
    message.resize(length);
    complete = ReadExactly(from_child_, message.data(), length) &&
               ReadExactly(from_child_, &count, sizeof(count)) && count <= (uint64_t{1} << 28);
  }
  if (complete) {
    chunk_crcs->resize(count);
    complete = ReadExactly(from_child_, chunk_crcs->data(), count * sizeof(uint32_t)) &&
               ReadExactly(from_child_, whole, sizeof(*whole));
  }
  if (!complete && pid_ > 0) ::kill(pid_, SIGKILL);  // it may be stuck writing to a full pipe
  const Status reaped = Reap();
  if (!complete) {
    return (reaped.ok() ? Unavailable("the checkpoint writer process ended without its outcome")
                        : reaped)
        .WithContext(std::string(context));
  }
  if (code != 0) return Status(static_cast<StatusCode>(code), std::move(message));
  return Status::Ok();
}

}  // namespace agentrt::checkpoint_files
