#include "common/file_util.h"

#include <fcntl.h>
#include <linux/magic.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <utility>

#include "common/crc32c.h"

namespace agentrt {
namespace {

class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }
  bool ok() const { return fd_ >= 0; }
  // Closes now; the error of close() matters for written files.
  int Close() { return ::close(std::exchange(fd_, -1)); }
  void Reset(int fd) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = fd;
  }

 private:
  int fd_ = -1;
};

std::string ParentOf(const std::string& path) {
  const auto slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

std::string BaseOf(const std::string& path) {
  const auto slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

}  // namespace

Status WriteFileAtomicAt(int dir_fd, const std::string& dir_path, const std::string& name,
                         std::string_view contents, const AtomicWriteOptions& options) {
  // The pid keeps two processes writing the same file from sharing a temporary.
  const std::string tmp = name + "." + std::to_string(::getpid()) + ".tmp";
  const std::string tmp_path = dir_path + "/" + tmp;
  Fd fd(::openat(dir_fd, tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC,
                 options.mode));
  if (!fd.ok()) return ErrnoStatus(errno, "cannot create " + tmp_path);
  auto fail = [&](int err, const std::string& what) {
    ::unlinkat(dir_fd, tmp.c_str(), 0);
    return ErrnoStatus(err, what);
  };
  if (::fchmod(fd.get(), static_cast<mode_t>(options.mode)) != 0) {
    return fail(errno, "cannot chmod " + tmp_path);
  }
  const char* p = contents.data();
  size_t left = contents.size();
  while (left > 0) {
    const ssize_t n = ::write(fd.get(), p, left);
    if (n < 0) {
      if (errno == EINTR) continue;
      return fail(errno, "cannot write " + tmp_path);
    }
    p += n;
    left -= static_cast<size_t>(n);
  }
  if (options.sync_file && ::fsync(fd.get()) != 0) return fail(errno, "cannot fsync " + tmp_path);
  if (fd.Close() != 0) return fail(errno, "cannot close " + tmp_path);
  if (::renameat(dir_fd, tmp.c_str(), dir_fd, name.c_str()) != 0) {
    return fail(errno, "cannot rename " + tmp_path + " to " + name);
  }
  if (options.sync_dir && ::fsync(dir_fd) != 0)
    return ErrnoStatus(errno, "cannot fsync " + dir_path);
  return Status::Ok();
}

Status SyncFileSystemOf(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  const int synced = fd < 0 ? -1 : ::syncfs(fd);
  const int err = errno;
  if (fd >= 0) ::close(fd);
  if (synced != 0) return ErrnoStatus(err, "cannot sync the file system of " + dir);
  return Status::Ok();
}

Status AppendLine(const std::string& path, std::string_view line) {
  Fd fd(::open(path.c_str(), O_RDWR | O_CREAT | O_APPEND | O_CLOEXEC, 0644));
  if (!fd.ok()) return ErrnoStatus(errno, "cannot open " + path);
  // A torn last line (a crash mid-append) is ended first, so this record stands alone.
  std::string record;
  struct stat st {};
  char last = '\n';
  if (::fstat(fd.get(), &st) == 0 && st.st_size > 0 &&
      ::pread(fd.get(), &last, 1, st.st_size - 1) == 1 && last != '\n')
    record += '\n';
  record += line;
  record += '\n';
  const ssize_t n = ::write(fd.get(), record.data(), record.size());
  if (n < 0) return ErrnoStatus(errno, "cannot append to " + path);
  if (static_cast<size_t>(n) != record.size())
    return ErrnoStatus(ENOSPC, "short append to " + path);
  if (::fsync(fd.get()) != 0) return ErrnoStatus(errno, "cannot fsync " + path);
  if (fd.Close() != 0) return ErrnoStatus(errno, "cannot close " + path);
  return Status::Ok();
}

Status WriteFileAtomic(const std::string& path, std::string_view contents,
                       const AtomicWriteOptions& options) {
  const std::string dir = ParentOf(path);
  Fd dir_fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!dir_fd.ok()) return ErrnoStatus(errno, "cannot open directory " + dir + " to write " + path);
  return WriteFileAtomicAt(dir_fd.get(), dir, BaseOf(path), contents, options);
}

namespace {

// A file of stat `st` (named `path` in messages) may be read whole: a
// regular one of at most `max_bytes`.
Status CheckWholeRead(const std::string& path, const struct stat& st, size_t max_bytes) {
  if (!S_ISREG(st.st_mode)) return DataLoss(path + " is not a regular file");
  if (static_cast<size_t>(st.st_size) > max_bytes) {
    return DataLoss(path + " is " + std::to_string(st.st_size) + " bytes, more than the " +
                    std::to_string(max_bytes) + " expected");
  }
  return Status::Ok();
}

// Reads the open file `fd` (named `path` in messages) to its end.
Result<std::string> ReadOpenFile(int fd, const std::string& path, const struct stat& st,
                                 size_t max_bytes) {
  AGENTRT_RETURN_IF_ERROR(CheckWholeRead(path, st, max_bytes));
  // Read straight into the string (one copy; a large message's payload file
  // is read this way per delivery), with a byte to spare for the read that
  // sees the end; grown only for a file that grew since its stat.
  std::string out(static_cast<size_t>(st.st_size) + 1, '\0');
  size_t have = 0;
  for (;;) {
    if (have == out.size()) {
      const size_t limit = max_bytes == SIZE_MAX ? max_bytes : max_bytes + 1;
      out.resize(std::min(limit, std::max<size_t>(2 * have, 4096)));
    }
    const ssize_t n = ::read(fd, out.data() + have, out.size() - have);
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoStatus(errno, "cannot read " + path);
    }
    if (n == 0) break;
    have += static_cast<size_t>(n);
    if (have > max_bytes) {
      return DataLoss(path + " holds more than the " + std::to_string(max_bytes) +
                      " bytes expected");
    }
  }
  out.resize(have);
  return out;
}

// `name` in `dir_fd` opened for reading (not following a symlink at its last
// component) and its stat; NotFound when it is not there.
Status OpenToRead(int dir_fd, const std::string& name, const std::string& path, Fd* fd,
                  struct stat* st) {
  fd->Reset(::openat(dir_fd, name.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC));
  if (!fd->ok()) {
    if (errno == ENOENT) return NotFound(path + ": no such file");
    return ErrnoStatus(errno, "cannot read " + path);
  }
  if (::fstat(fd->get(), st) != 0) return ErrnoStatus(errno, "cannot stat " + path);
  return Status::Ok();
}

// [at, at + size) of `fd` mapped to be read once, in order: MADV_SEQUENTIAL,
// so that neither the faults (each maps the pages around it too) nor the
// unmap mark the pages recently used (moving them on the LRU lists), which
// read() and MAP_POPULATE both do.
class ReadOnceMapping {
 public:
  ReadOnceMapping(int fd, int64_t at, size_t size) : size_(size) {
    void* map = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, static_cast<off_t>(at));
    if (map == MAP_FAILED) return;
    data_ = static_cast<const char*>(map);
    (void)::madvise(map, size, MADV_SEQUENTIAL);  // advice: the read is right without it
  }
  ReadOnceMapping(const ReadOnceMapping&) = delete;
  ReadOnceMapping& operator=(const ReadOnceMapping&) = delete;
  ~ReadOnceMapping() {
    if (data_ != nullptr) ::munmap(const_cast<char*>(data_), size_);
  }
  const char* data() const { return data_; }  // null (errno set) if it could not be mapped

 private:
  const char* data_ = nullptr;
  size_t size_;
};

}  // namespace

Result<std::string> ReadWholeFileAt(int dir_fd, const std::string& name, const std::string& path,
                                    size_t max_bytes) {
  Fd fd;
  struct stat st {};
  AGENTRT_RETURN_IF_ERROR(OpenToRead(dir_fd, name, path, &fd, &st));
  return ReadOpenFile(fd.get(), path, st, max_bytes);
}

Result<std::string> ReadWholeFile(const std::string& path, size_t max_bytes) {
  return ReadWholeFileAt(AT_FDCWD, path, path, max_bytes);
}

Result<std::string> ReadWholeFileMapped(const std::string& path, size_t max_bytes) {
  Fd fd;
  struct stat st {};
  AGENTRT_RETURN_IF_ERROR(OpenToRead(AT_FDCWD, path, path, &fd, &st));
  // A page of a file in memory cannot fail to read; one on a disk or another
  // node's file system can (EIO, ESTALE), and in a mapping that is SIGBUS.
  if (struct statfs fs{}; ::fstatfs(fd.get(), &fs) != 0 || fs.f_type != TMPFS_MAGIC) {
    return ReadOpenFile(fd.get(), path, st, max_bytes);
  }
  AGENTRT_RETURN_IF_ERROR(CheckWholeRead(path, st, max_bytes));
  const auto size = static_cast<size_t>(st.st_size);
  if (size == 0) return std::string();
  ReadOnceMapping map(fd.get(), 0, size);
  if (map.data() == nullptr) return ErrnoStatus(errno, "cannot map " + path);
  return std::string(map.data(), size);  // the one copy, into memory not zeroed first
}

Result<std::string> ReadPrivateFile(const std::string& path, std::string_view what) {
  const std::string name = std::string(what) + " " + path;
  Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd.ok()) {
    if (errno == ENOENT) return NotFound(name + ": no such file");
    return ErrnoStatus(errno, "cannot open " + name);
  }
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) return ErrnoStatus(errno, "cannot stat " + name);
  if ((st.st_mode & 077) != 0) {
    char mode[8];
    std::snprintf(mode, sizeof mode, "%04o", static_cast<unsigned>(st.st_mode & 07777));
    return PermissionDenied(name + " has mode " + mode +
                            "; it must be readable by its owner only (chmod 600)");
  }
  return ReadOpenFile(fd.get(), name, st, size_t{1} << 20);
}

std::vector<std::string> ReadLastLines(const std::string& path, size_t max_lines,
                                       size_t window_bytes, std::string_view filter, int64_t from) {
  std::vector<std::string> out;
  Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  struct stat st {};
  if (!fd.ok() || ::fstat(fd.get(), &st) != 0 || max_lines == 0 || st.st_size <= from) return out;
  const off_t read_from =
      std::max<off_t>(std::max<off_t>(0, from), st.st_size - static_cast<off_t>(window_bytes));
  std::string text(static_cast<size_t>(st.st_size - read_from), '\0');
  const ssize_t n = ::pread(fd.get(), text.data(), text.size(), read_from);
  text.resize(n > 0 ? static_cast<size_t>(n) : 0);
  size_t begin = 0;  // where the first whole line starts
  if (read_from > from)
    begin = text.find('\n') == std::string::npos ? text.size() : text.find('\n') + 1;
  if (begin >= text.size()) return out;
  size_t end = text.size();  // one past the line being looked at, scanning backwards
  if (text[end - 1] == '\n') --end;
  while (out.size() < max_lines) {
    const size_t nl = end > begin ? text.rfind('\n', end - 1) : std::string::npos;
    const size_t start = nl == std::string::npos || nl < begin ? begin : nl + 1;
    const std::string_view line(text.data() + start, end - start);
    if (filter.empty() || line.find(filter) != std::string_view::npos) out.emplace_back(line);
    if (start == begin) break;
    end = start - 1;
  }
  std::reverse(out.begin(), out.end());
  return out;
}

Result<uint32_t> FileCrc32c(int fd, int64_t size, const std::string& path) {
  // A read-once mapping a window at a time (reading into a buffer instead
  // costs a copy more): a fifth less time a byte than mapping each window
  // with MAP_POPULATE, from 1 MiB files to 64 MiB ones on the development
  // machine.
  constexpr int64_t kWindow = int64_t{16} << 20;
  uint32_t crc = 0;
  for (int64_t at = 0; at < size; at += kWindow) {
    const auto n = static_cast<size_t>(std::min(kWindow, size - at));
    ReadOnceMapping map(fd, at, n);
    if (map.data() == nullptr) return ErrnoStatus(errno, "cannot map " + path);
    crc = Crc32c(map.data(), n, crc);
  }
  return crc;
}

ssize_t ReadAllAt(int fd, void* data, size_t size, off_t offset) {
  size_t done = 0;
  while (done < size) {
    const ssize_t n = ::pread(fd, static_cast<char*>(data) + done, size - done,
                              offset + static_cast<off_t>(done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return -1;
    if (n == 0) break;
    done += static_cast<size_t>(n);
  }
  return static_cast<ssize_t>(done);
}

Status WriteAll(int fd, const void* data, size_t size, std::string_view what,
                std::string_view name) {
  const auto* p = static_cast<const char*>(data);
  while (size > 0) {
    const ssize_t n = ::write(fd, p, size);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return ErrnoStatus(n < 0 ? errno : EIO, std::string(what).append(name));
    p += n;
    size -= static_cast<size_t>(n);
  }
  return Status::Ok();
}

namespace {
std::atomic<bool> g_open_files_raised{false};
rlimit g_open_files_before{};
}  // namespace

void RaiseOpenFileLimit() {
  rlimit now{};
  if (g_open_files_raised.load() || ::getrlimit(RLIMIT_NOFILE, &now) != 0) return;
  if (now.rlim_cur >= now.rlim_max) return;
  g_open_files_before = now;
  rlimit raised = now;
  raised.rlim_cur = now.rlim_max;
  if (::setrlimit(RLIMIT_NOFILE, &raised) == 0) g_open_files_raised.store(true);
}

void RestoreOpenFileLimit() {
  if (g_open_files_raised.load()) (void)::setrlimit(RLIMIT_NOFILE, &g_open_files_before);
}

Status FsyncDir(const std::string& path) {
  Fd fd(::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!fd.ok()) return ErrnoStatus(errno, "cannot open directory " + path);
  // A file system that cannot sync directories at all says EINVAL: nothing
  // more can be done there, and that is not a failing disk.
  if (::fsync(fd.get()) != 0 && errno != EINVAL) return ErrnoStatus(errno, "cannot fsync " + path);
  return Status::Ok();
}

std::string BootId() {
  Result<std::string> id = ReadWholeFile("/proc/sys/kernel/random/boot_id", 256);
  if (!id.ok()) return {};
  std::string out = std::move(id).value();
  while (!out.empty() && (out.back() == '\n' || out.back() == ' ')) out.pop_back();
  return out;
}

}  // namespace agentrt
