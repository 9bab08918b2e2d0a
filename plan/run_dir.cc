#include "plan/run_dir.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <ctime>
#include <filesystem>

#include "common/file_util.h"
#include "common/random.h"

namespace agentrt {
namespace fs = std::filesystem;

std::string UtcTimestamp(std::chrono::system_clock::time_point t) {
  const std::time_t secs = std::chrono::system_clock::to_time_t(t);
  std::tm tm{};
  ::gmtime_r(&secs, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y%m%dT%H%M%SZ", &tm);
  return buf;
}

Result<RunDir> RunDir::Create(const std::string& base_dir, const std::string& run_name,
                              std::chrono::system_clock::time_point now) {
  if (run_name.empty() || run_name.find('/') != std::string::npos || run_name == "." ||
      run_name == "..") {
    return InvalidArgument("run name '" + run_name + "' cannot be used as a directory name");
  }
  std::error_code ec;
  fs::create_directories(base_dir.empty() ? "." : base_dir, ec);
  if (ec) return Internal("cannot create run base directory " + base_dir + ": " + ec.message());
  const std::string stem =
      (base_dir.empty() ? std::string(".") : base_dir) + "/" + run_name + "-" + UtcTimestamp(now);
  std::string path = stem;
  for (int n = 1;; ++n) {
    if (::mkdir(path.c_str(), 0755) == 0) break;
    if (errno != EEXIST) return ErrnoStatus(errno, "cannot create run directory " + path);
    if (n > 1000) return Internal("cannot find a free run directory name for " + stem);
    path = stem + "-" + std::to_string(n);
  }
  RunDir dir(fs::absolute(path).lexically_normal().string());
  for (const std::string sub : {"/logs", "/checkpoints", "/agents"}) {
    if (::mkdir((dir.path() + sub).c_str(), 0755) != 0) {
      return ErrnoStatus(errno, "cannot create " + dir.path() + sub);
    }
  }
  if (::mkdir(dir.SecretsDir().c_str(), 0700) != 0) {
    return ErrnoStatus(errno, "cannot create " + dir.SecretsDir());
  }
  ::chmod(dir.SecretsDir().c_str(), 0700);  // whatever the umask says
  return dir;
}

std::string RunDir::HangReportPath(const std::string& agent,
                                   std::chrono::system_clock::time_point at) const {
  return HangsDir() + "/" + agent + "-" + UtcTimestamp(at) + ".json";
}

std::string RunDir::Resolve(const std::string& relative) const {
  if (!relative.empty() && relative.front() == '/') return relative;
  if (relative.empty()) return path_;
  return path_ + "/" + relative;
}

std::string RunDir::TelemetryIpcEndpoint() const {
  const std::string sock = path_ + "/telemetry.sock";
  if (sock.size() >= 100) return "";  // sockaddr_un.sun_path holds 108 bytes
  return "ipc://" + sock;
}

Result<std::string> RunDir::CreateSecret(size_t bytes) const {
  if (::mkdir(SecretsDir().c_str(), 0700) != 0 && errno != EEXIST) {
    return ErrnoStatus(errno, "cannot create " + SecretsDir());
  }
  if (::chmod(SecretsDir().c_str(), 0700) != 0)
    return ErrnoStatus(errno, "chmod 700 " + SecretsDir());
  AGENTRT_ASSIGN_OR_RETURN(std::string secret, RandomBytes(bytes));
  AGENTRT_RETURN_IF_ERROR(WriteFileAtomic(SecretPath(), secret, {.mode = 0600, .sync_dir = true}));
  return secret;
}

Result<std::string> ReadSecretFile(const std::string& path) {
  AGENTRT_ASSIGN_OR_RETURN(std::string secret, ReadPrivateFile(path, "run secret"));
  if (secret.empty()) return DataLoss("run secret " + path + " is empty");
  return secret;
}

Result<std::string> RunDir::ReadSecret() const { return ReadSecretFile(SecretPath()); }

Result<std::string> RunDir::LoadOrCreateSecret() const {
  Result<std::string> existing = ReadSecret();
  if (existing.ok() || existing.status().code() != StatusCode::kNotFound) return existing;
  return CreateSecret();
}

Result<std::unique_ptr<ControllerLock>> ControllerLock::Acquire(const RunDir& dir) {
  const std::string path = dir.ControllerLockPath();
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoStatus(errno, "cannot open " + path);
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    ::close(fd);
    if (err == EWOULDBLOCK) {
      const auto pid = ReadWholeFile(dir.ControllerPidPath(), 64).value_or("?");
      return FailedPrecondition("run " + dir.path() + " is driven by a live controller (pid " +
                                pid.substr(0, pid.find('\n')) + ")");
    }
    return ErrnoStatus(err, "cannot lock " + path);
  }
  return std::unique_ptr<ControllerLock>(new ControllerLock(fd));
}

ControllerLock::~ControllerLock() { ::close(fd_); }

bool ControllerRunning(const std::string& run_dir) {
  const int fd = ::open(RunDir(run_dir).ControllerLockPath().c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;  // no controller ever ran here
  const bool held = ::flock(fd, LOCK_SH | LOCK_NB) != 0 && errno == EWOULDBLOCK;
  ::close(fd);  // drops the shared lock taken when it was free
  return held;
}

pid_t LiveControllerPid(const std::string& run_dir) {
  if (!ControllerRunning(run_dir)) return 0;
  auto text = ReadWholeFile(RunDir(run_dir).ControllerPidPath(), 64);
  if (!text.ok()) return 0;
  long pid = 0;
  try {
    pid = std::stol(*text);
  } catch (const std::exception&) {
    return 0;
  }
  return pid > 0 ? static_cast<pid_t>(pid) : 0;
}

}  // namespace agentrt
