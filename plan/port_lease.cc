#include "plan/port_lease.h"

#include <dirent.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <nlohmann/json.hpp>

#include "common/file_util.h"

namespace agentrt {

bool PortBindable(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  const int one = 1;
  (void)::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_ANY);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  const bool free = ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
  ::close(fd);
  return free;
}
namespace {

bool Writable(const std::string& dir) { return ::access(dir.c_str(), W_OK | X_OK) == 0; }

// mkdir with the sticky, world-writable mode of a shared lock directory.
Status MakeSharedDir(const std::string& dir) {
  if (::mkdir(dir.c_str(), 01777) != 0 && errno != EEXIST) {
    return ErrnoStatus(errno, "cannot create the port lease directory " + dir);
  }
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0) return ErrnoStatus(errno, "cannot stat " + dir);
  if (!S_ISDIR(st.st_mode)) return FailedPrecondition(dir + " is not a directory");
  if (st.st_uid == ::geteuid()) ::chmod(dir.c_str(), 01777);  // whatever the umask said
  return Status::Ok();
}

struct flock Range(short type, int first, int last) {
  struct flock fl {};
  fl.l_type = type;
  fl.l_whence = SEEK_SET;
  fl.l_start = first;
  fl.l_len = static_cast<off_t>(last) - first + 1;
  return fl;
}

// Calls f(run, pid) for every live owner file of `dir` that claims `port`;
// owner files of dead pids are removed (their locks are gone already).
template <typename F>
void ForEachOwner(const std::string& dir, int port, F&& f) {
  const std::string owners = dir + "/owners";
  DIR* d = ::opendir(owners.c_str());
  if (d == nullptr) return;
  while (dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    if (name.size() < 6 || name.substr(name.size() - 5) != ".json") continue;
    const std::string path = owners + "/" + name;
    auto text = ReadWholeFile(path, 1 << 20);
    if (!text.ok()) continue;
    const nlohmann::json j = nlohmann::json::parse(*text, nullptr, /*allow_exceptions=*/false);
    if (!j.is_object()) continue;
    const long pid = j.value("pid", 0L);
    if (!PidAlive(pid)) {
      ::unlink(path.c_str());
      continue;
    }
    for (const auto& r : j.value("ranges", nlohmann::json::array())) {
      if (r.is_array() && r.size() == 2 && r[0].is_number_integer() && r[1].is_number_integer() &&
          r[0].get<int>() <= port && port <= r[1].get<int>()) {
        f(j.value("run", std::string("?")), pid);
      }
    }
  }
  ::closedir(d);
}

}  // namespace

bool PidAlive(long pid) {
  return pid > 0 && (::kill(static_cast<pid_t>(pid), 0) == 0 || errno == EPERM);
}

std::string DefaultPortLeaseDir() {
  if (const char* d = std::getenv("AGENTRT_PORT_LEASE_DIR"); d != nullptr && *d != '\0') return d;
  if (Writable("/run/lock")) return "/run/lock/agentrt";
  return "/tmp/agentrt-ports";
}

Result<std::unique_ptr<PortLeases>> PortLeases::Open(std::string owner, std::string dir) {
  AGENTRT_RETURN_IF_ERROR(MakeSharedDir(dir));
  AGENTRT_RETURN_IF_ERROR(MakeSharedDir(dir + "/owners"));
  const std::string path = dir + "/ports.lock";
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0666);
  if (fd < 0) return ErrnoStatus(errno, "cannot open the port lease file " + path);
  struct stat st {};
  if (::fstat(fd, &st) == 0 && st.st_uid == ::geteuid()) ::fchmod(fd, 0666);
  return std::unique_ptr<PortLeases>(new PortLeases(std::move(owner), std::move(dir), fd));
}

PortLeases::PortLeases(std::string owner, std::string dir, int fd)
    : owner_(std::move(owner)), dir_(std::move(dir)), fd_(fd) {}

PortLeases::~PortLeases() {
  ::unlink((dir_ + "/owners/" + std::to_string(::getpid()) + ".json").c_str());
  ::close(fd_);  // the kernel drops every lock of this descriptor
}

Status PortLeases::Acquire(int first, int last) {
  if (first < 1 || last > 65535 || first > last) {
    return InvalidArgument("cannot lease ports " + std::to_string(first) + "-" +
                           std::to_string(last) + ": not a range within 1-65535");
  }
  struct flock fl = Range(F_WRLCK, first, last);
  if (::fcntl(fd_, F_OFD_SETLK, &fl) != 0) {
    if (errno != EAGAIN && errno != EACCES) {
      return ErrnoStatus(errno, "cannot lock ports " + std::to_string(first) + "-" +
                                    std::to_string(last) + " in " + dir_ + "/ports.lock");
    }
    // Which port is taken, and by whom.
    struct flock probe = Range(F_WRLCK, first, last);
    int port = first;
    if (::fcntl(fd_, F_OFD_GETLK, &probe) == 0 && probe.l_type != F_UNLCK) {
      port = static_cast<int>(std::max<off_t>(probe.l_start, first));
    }
    const std::string holder = Holder(port);
    return AlreadyExists("port " + std::to_string(port) + " (of " + std::to_string(first) + "-" +
                         std::to_string(last) + ") is leased by " +
                         (holder.empty() ? std::string("another run on this machine") : holder));
  }
  held_.emplace_back(first, last);
  if (batch_depth_ == 0) WriteOwnerFile();
  return Status::Ok();
}

Status PortLeases::Release(int first, int last) {
  struct flock fl = Range(F_UNLCK, first, last);
  if (::fcntl(fd_, F_OFD_SETLK, &fl) != 0) {
    return ErrnoStatus(
        errno, "cannot release ports " + std::to_string(first) + "-" + std::to_string(last));
  }
  std::erase(held_, std::make_pair(first, last));
  if (batch_depth_ == 0) WriteOwnerFile();
  return Status::Ok();
}

bool PortLeases::Free(int first, int last) const {
  if (first < 1 || last > 65535 || first > last) return false;
  struct flock probe = Range(F_WRLCK, first, last);
  if (::fcntl(fd_, F_OFD_GETLK, &probe) != 0) return false;
  if (probe.l_type != F_UNLCK) return false;
  // Our own leases do not conflict with us in the kernel's eyes; they are not free.
  for (const auto& [f, l] : held_) {
    if (first <= l && f <= last) return false;
  }
  return true;
}

void PortLeases::WriteOwnerFile() const {
  nlohmann::json j = {{"pid", ::getpid()}, {"run", owner_}, {"ranges", nlohmann::json::array()}};
  for (const auto& [f, l] : held_) j["ranges"].push_back({f, l});
  // Only names the holder in another run's error message; the flocks are the
  // leases, so a run whose owner file could not be written still holds them,
  // and one that a crash lost is not missed (stale ones are removed anyway):
  // no fsync.
  WriteFileAtomic(dir_ + "/owners/" + std::to_string(::getpid()) + ".json", j.dump() + "\n",
                  {.mode = 0644, .sync_file = false})
      .IgnoreError();
}

std::string PortLeases::Holder(int port) const {
  std::string found;
  ForEachOwner(dir_, port, [&](const std::string& run, long pid) {
    found = "run " + run + " (pid " + std::to_string(pid) + ")";
  });
  return found;
}

std::vector<std::string> PortLeases::HolderRuns(int port) const {
  std::vector<std::string> runs;
  ForEachOwner(dir_, port, [&](const std::string& run, long) { runs.push_back(run); });
  return runs;
}

Status PortLeases::AcquireForRun(int first, int last) {
  Batch batch(*this);
  Status s = Acquire(first, last);
  if (s.ok() || s.code() != StatusCode::kAlreadyExists) return s;
  auto ours = [this](int port) {
    const std::vector<std::string> runs = HolderRuns(port);
    return std::find(runs.begin(), runs.end(), owner_) != runs.end();
  };
  // The stretches the run does not hold yet, each leased here.
  std::vector<std::pair<int, int>> taken;
  for (int port = first; port <= last; ++port) {
    if (ours(port)) continue;
    int end = port;
    while (end < last && !ours(end + 1)) ++end;
    Status part = Acquire(port, end);
    if (!part.ok()) {
      for (const auto& [a, b] : taken) Release(a, b).IgnoreError();
      return part;
    }
    taken.emplace_back(port, end);
    port = end;
  }
  return Status::Ok();
}

int MovedMasterPort(int master_port, int old_first, int first, int last) {
  const int offset = master_port - old_first;
  return offset >= 0 && offset <= last - first ? first + offset : first;
}

Result<int> PickFreePort(const std::string& agent, int preferred, int first, int last) {
  if (first <= 0 || last < first || last > 65535) {
    return InvalidArgument("agent " + agent + ": bad port block " + std::to_string(first) + "-" +
                           std::to_string(last));
  }
  if (preferred < first || preferred > last) preferred = first;
  std::vector<int> order;
  for (int p = preferred; p <= last; ++p) order.push_back(p);
  for (int p = first; p < preferred; ++p) order.push_back(p);
  for (int port : order) {
    if (PortBindable(port)) return port;
  }
  return ResourceExhausted(
      "agent " + agent + ": every port of its block " + std::to_string(first) + "-" +
      std::to_string(last) +
      " is taken by another process; free one or give the agent a larger block "
      "(cluster.ports.per_agent)");
}

}  // namespace agentrt
