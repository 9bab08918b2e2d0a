#include "plan/mpi_shm.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <ctime>
#include <filesystem>
#include <string_view>

#include "plan/port_lease.h"

namespace agentrt {
namespace {

constexpr std::string_view kPrefix = "agentrt-mpi.";
constexpr std::string_view kStepPrefix = "agentrt-mpi.step.";
constexpr const char* kLockName = "/.lock";
constexpr time_t kUnlockedGraceS = 60;
constexpr int kJoinTries = 8;

void RemoveTree(const std::string& dir) {
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
}

// With `fd`'s exclusive lock held: the folder leaves its name first, so that
// a rank joining meanwhile makes a new one (or, holding the old lock file,
// sees it is no longer the folder's and starts over), then goes. A remover
// killed in between leaves a "<name>.removing.<pid>" folder with a free lock,
// which the next sweep takes.
void RemoveLockedStepDir(const std::string& dir, int fd) {
  const std::string doomed = dir + ".removing." + std::to_string(::getpid());
  if (::rename(dir.c_str(), doomed.c_str()) == 0) RemoveTree(doomed);
  ::close(fd);
}

bool SameFile(const struct stat& a, const struct stat& b) {
  return a.st_ino == b.st_ino && a.st_dev == b.st_dev;
}

// A folder (lstat: not a link) of this process's user that no other user
// may enter.
bool ClosedFolderOfOurs(const struct stat& st) {
  return S_ISDIR(st.st_mode) && st.st_uid == ::geteuid() && (st.st_mode & 077) == 0;
}

}  // namespace

std::string MakeControllerMpiShmDir(const std::string& root, const std::string& agent,
                                    const std::string& incarnation) {
  const std::string dir = root + "/" + std::string(kPrefix) + std::to_string(::getpid()) + "." +
                          agent + "." +
                          (incarnation.empty() ? std::to_string(::time(nullptr)) : incarnation);
  RemoveTree(dir);
  std::error_code ec;
  if (!std::filesystem::create_directory(dir, ec) || ec) return "";
  ::chmod(dir.c_str(), 0700);
  return dir;
}

void RemoveMpiShmDir(std::string& dir) {
  if (dir.empty()) return;
  RemoveTree(dir);
  dir.clear();
}

void SweepControllerMpiShmDirs(const std::string& root) {
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(root, ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind(kPrefix, 0) != 0) continue;
    const size_t dot = name.find('.', kPrefix.size());
    const std::string pid_text = name.substr(kPrefix.size(), dot - kPrefix.size());
    // Step folders ("agentrt-mpi.step.") have no pid and are not ours.
    long pid = 0;
    const auto [end, err] =
        std::from_chars(pid_text.data(), pid_text.data() + pid_text.size(), pid);
    if (pid_text.empty() || err != std::errc() || end != pid_text.data() + pid_text.size())
      continue;
    if (!PidAlive(pid)) RemoveTree(e.path().string());
  }
}

SharedNodeDir::SharedNodeDir(SharedNodeDir&& other) noexcept
    : dir_(std::move(other.dir_)), lock_fd_(other.lock_fd_) {
  other.dir_.clear();
  other.lock_fd_ = -1;
}

SharedNodeDir& SharedNodeDir::operator=(SharedNodeDir&& other) noexcept {
  if (this != &other) {
    Leave();
    dir_ = std::move(other.dir_);
    lock_fd_ = other.lock_fd_;
    other.dir_.clear();
    other.lock_fd_ = -1;
  }
  return *this;
}

SharedNodeDir::~SharedNodeDir() { Leave(); }

SharedNodeDir SharedNodeDir::Join(const std::string& root, const std::string& name) {
  SharedNodeDir joined;
  if (name.empty() || name.find('/') != std::string::npos || name == "." || name == "..")
    return joined;
  const std::string dir = root + "/" + name;
  const std::string lock = dir + kLockName;
  for (int attempt = 0; attempt < kJoinTries; ++attempt) {
    if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) return joined;
    // /dev/shm is everybody's: only a real folder of this user's, closed to
    // others, is joined (not a link, nor a folder another user made first).
    struct stat own {};
    if (::lstat(dir.c_str(), &own) != 0) {
      if (errno == ENOENT) continue;  // removed meanwhile
      return joined;
    }
    if (!ClosedFolderOfOurs(own)) return joined;
    const int fd = ::open(lock.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd < 0) {
      if (errno == ENOENT) continue;  // removed between our mkdir and open
      return joined;
    }
    while (::flock(fd, LOCK_SH) != 0 && errno == EINTR) {
    }
    // Still the folder's lock file? (A sweep or the last leaver may have
    // removed it while we waited.)
    struct stat held {
    }, named{};
    if (::fstat(fd, &held) == 0 && ::stat(lock.c_str(), &named) == 0 && SameFile(held, named)) {
      joined.dir_ = dir;
      joined.lock_fd_ = fd;
      return joined;
    }
    ::close(fd);
  }
  return joined;
}

void SharedNodeDir::Leave() {
  if (lock_fd_ < 0) return;
  // Unlock first, then try for the whole folder: of ranks leaving together,
  // the one whose try comes after every unlock wins; a try while another
  // rank still holds its lock fails, and that rank tries after.
  ::flock(lock_fd_, LOCK_UN);
  if (::flock(lock_fd_, LOCK_EX | LOCK_NB) == 0) {
    struct stat held {
    }, named{};
    if (::fstat(lock_fd_, &held) == 0 && ::stat((dir_ + kLockName).c_str(), &named) == 0 &&
        SameFile(held, named)) {
      RemoveLockedStepDir(dir_, lock_fd_);
    } else {
      ::close(lock_fd_);  // somebody removed it already
    }
  } else {
    ::close(lock_fd_);
  }
  lock_fd_ = -1;
  dir_.clear();
}

StepMpiShm JoinStepMpiShm(const std::string& root, const std::string& job,
                          const std::string& step) {
  if (job.empty() || step.empty()) return {};  // (Join refuses a name with a '/')
  return SharedNodeDir::Join(root, std::string(kStepPrefix) + job + "." + step);
}

int SweepStepMpiShmDirs(const std::string& root) { return SweepSharedNodeDirs(root, kStepPrefix); }

int SweepSharedNodeDirs(const std::string& root, std::string_view prefix) {
  int removed = 0;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(root, ec)) {
    const std::string name = e.path().filename().string();
    if (prefix.empty() || name.rfind(prefix, 0) != 0) continue;
    const std::string dir = e.path().string();
    // Only a real folder of this user's, closed to others, as Join makes
    // them: never a link, nor anything another user put under the name.
    struct stat own {};
    if (::lstat(dir.c_str(), &own) != 0 || !ClosedFolderOfOurs(own)) continue;
    const int fd = ::open((dir + kLockName).c_str(), O_RDWR | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
    if (fd < 0) {
      // A folder with no lock file: being made right now, or its maker died
      // before locking it. Only an old one is left over.
      struct stat st {};
      if (errno == ENOENT && ::stat(dir.c_str(), &st) == 0 &&
          st.st_mtime + kUnlockedGraceS < ::time(nullptr)) {
        RemoveTree(dir);
        ++removed;
      }
      continue;
    }
    if (::flock(fd, LOCK_EX | LOCK_NB) == 0) {
      RemoveLockedStepDir(dir, fd);
      ++removed;
    } else {
      ::close(fd);
    }
  }
  return removed;
}

}  // namespace agentrt
