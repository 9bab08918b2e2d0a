#include "scheduler/run_dir.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <sstream>

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
  for (const std::string sub : {"/logs", "/checkpoints"}) {
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

std::string RunDir::TelemetryIpcEndpoint() const {
  const std::string sock = path_ + "/telemetry.sock";
  if (sock.size() >= 100) return "";  // sockaddr_un.sun_path holds 108 bytes
  return "ipc://" + sock;
}

Result<std::string> RunDir::CreateSecret(size_t bytes) const {
  std::string secret(bytes, '\0');
  {
    std::ifstream urandom("/dev/urandom", std::ios::binary);
    if (!urandom.read(secret.data(), static_cast<std::streamsize>(bytes))) {
      return Internal("cannot read " + std::to_string(bytes) + " bytes from /dev/urandom");
    }
  }
  AGENTRT_RETURN_IF_ERROR(WriteFileAtomic(SecretPath(), secret, 0600));
  return secret;
}

pid_t LiveControllerPid(const std::string& run_dir) {
  auto text = ReadWholeFile(run_dir + "/controller.pid");
  if (!text.ok()) return 0;
  long pid = 0;
  try {
    pid = std::stol(*text);
  } catch (const std::exception&) {
    return 0;
  }
  if (pid <= 0) return 0;
  auto cmdline = ReadWholeFile("/proc/" + std::to_string(pid) + "/cmdline");
  if (!cmdline.ok()) return 0;
  const std::string argv0 = cmdline->substr(0, cmdline->find('\0'));
  if (fs::path(argv0).filename().string().find("agentctl") == std::string::npos) return 0;
  return static_cast<pid_t>(pid);
}

Status WriteFileAtomic(const std::string& path, const std::string& contents, int mode) {
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, mode);
  if (fd < 0) return ErrnoStatus(errno, "cannot create " + tmp);
  ::fchmod(fd, static_cast<mode_t>(mode));
  size_t done = 0;
  while (done < contents.size()) {
    const ssize_t n = ::write(fd, contents.data() + done, contents.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      const int err = errno;
      ::close(fd);
      ::unlink(tmp.c_str());
      return ErrnoStatus(err, "cannot write " + tmp);
    }
    done += static_cast<size_t>(n);
  }
  if (::fsync(fd) != 0 || ::close(fd) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    return ErrnoStatus(err, "cannot flush " + tmp);
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    return ErrnoStatus(err, "cannot rename " + tmp + " to " + path);
  }
  return Status::Ok();
}

Result<std::string> ReadWholeFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    if (errno == ENOENT) return NotFound(path + ": no such file");
    return ErrnoStatus(errno, "cannot read " + path);
  }
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace agentrt
