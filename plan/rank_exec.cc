#include "plan/rank_exec.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <nlohmann/json.hpp>
#include <string_view>

#include "common/file_util.h"
#include "plan/agent_env.h"
#include "plan/mpi_shm.h"
#include "plan/port_lease.h"
#include "plan/run_dir.h"

extern char** environ;  // NOLINT: POSIX

namespace agentrt {
namespace {

// The node this rank runs on: SLURM's name for it, else the hostname.
std::string ThisNode(const EnvLookup& env) {
  std::string node = env("SLURMD_NODENAME").value_or("");
  if (node.empty()) {
    char host[256] = {};
    if (::gethostname(host, sizeof host - 1) == 0) node = host;
  }
  return node;
}

// The program the wrapper supervises (--exit-record), for the signal relay.
volatile sig_atomic_t g_child = 0;

void Relay(int sig) {
  if (g_child > 0) ::kill(static_cast<pid_t>(g_child), sig);
}

// Everything that ends or pauses a process when it arrives, except SIGKILL
// and SIGSTOP (which cannot be caught: SIGKILL of the wrapper reaches the
// program through its PDEATHSIG).
constexpr int kRelayed[] = {SIGTERM, SIGINT,  SIGHUP,  SIGQUIT, SIGUSR1,
                            SIGUSR2, SIGCONT, SIGTSTP, SIGALRM, SIGPIPE};

constexpr int kSignalFilePollMs = 100;

// Passes the signals the controller appended to a signal file (one number per
// line) on to the program, each once and in order.
class SignalFileRelay {
 public:
  SignalFileRelay(std::string path, pid_t child) : path_(std::move(path)), child_(child) {}

  void Pass() {
    const int fd = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return;  // nothing written yet
    char buf[256];
    for (;;) {
      // From the end of the last whole line: an unfinished one is read again.
      const ssize_t n = ::pread(fd, buf, sizeof buf, offset_);
      if (n <= 0) break;
      const off_t start = offset_;
      int sig = 0;
      for (ssize_t i = 0; i < n; ++i) {
        if (buf[i] != '\n') {
          if (buf[i] >= '0' && buf[i] <= '9' && sig < 1000) sig = sig * 10 + (buf[i] - '0');
          continue;
        }
        if (sig > 0 && sig < NSIG) ::kill(child_, sig);
        sig = 0;
        offset_ = start + i + 1;
      }
      if (n < static_cast<ssize_t>(sizeof buf) || offset_ == start) break;
    }
    ::close(fd);
  }

 private:
  std::string path_;
  pid_t child_;
  off_t offset_ = 0;
};

// The agent's environment instead of the inherited one; the launcher's own
// variables for this task (srun's SLURM_*, PMIx and Open MPI wiring) stay.
void ReplaceEnvironment(const std::vector<std::string>& agent_env) {
  std::vector<std::string> launcher;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string_view v(*e);
    for (std::string_view prefix : {"SLURM_", "PMI", "OMPI_"}) {
      if (v.substr(0, prefix.size()) == prefix) launcher.emplace_back(v);
    }
  }
  ::clearenv();
  const std::vector<std::string>* lists[] = {&agent_env, &launcher};
  for (const std::vector<std::string>* list : lists) {
    for (const std::string& entry : *list) {
      const size_t eq = entry.find('=');
      if (eq != std::string::npos && eq > 0)
        ::setenv(entry.substr(0, eq).c_str(), entry.c_str() + eq + 1, 1);
    }
  }
}

double UnixNow() {
  timespec ts{};
  ::clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

[[noreturn]] void ExecProgram(const RankExecOptions& options, const std::string& rank,
                              const EnvLookup& env) {
  if (!options.log_dir.empty()) {
    const std::string path = RankLogFile(options.log_dir, rank);
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd < 0) {
      std::fprintf(stderr, "exec-rank: cannot open %s: %s\n", path.c_str(), std::strerror(errno));
      std::_Exit(126);
    }
    ::dup2(fd, 1);
    ::dup2(fd, 2);
  }
  if (const auto workdir = env("AGENTRT_WORKDIR"); workdir && !workdir->empty()) {
    if (::chdir(workdir->c_str()) != 0) {
      std::fprintf(stderr, "exec-rank: cannot enter the agent's working directory %s: %s\n",
                   workdir->c_str(), std::strerror(errno));
      std::_Exit(126);
    }
  }
  std::vector<char*> args;
  args.reserve(options.command.size() + 1);
  for (const auto& a : options.command) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  ::execv(args[0], args.data());
  std::fprintf(stderr, "exec-rank: cannot execute %s: %s\n", args[0], std::strerror(errno));
  std::_Exit(errno == ENOENT ? 127 : 126);
}

// Runs the program as a child, relays signals, records how it ended and ends
// the same way.
[[noreturn]] void Supervise(const RankExecOptions& options, const std::string& rank,
                            const EnvLookup& env, StepMpiShm& mpi_shm) {
  // A signal that arrives before the child's pid is known waits (blocked)
  // and is relayed as soon as it is: none is lost during start-up.
  sigset_t relayed, previous;
  sigemptyset(&relayed);
  for (int sig : kRelayed) sigaddset(&relayed, sig);
  ::sigprocmask(SIG_BLOCK, &relayed, &previous);
  struct sigaction relay {};
  relay.sa_handler = Relay;
  sigemptyset(&relay.sa_mask);
  relay.sa_flags = SA_RESTART;
  for (int sig : kRelayed) ::sigaction(sig, &relay, nullptr);
  const pid_t wrapper = ::getpid();
  const pid_t child = ::fork();
  if (child < 0) {
    std::fprintf(stderr, "exec-rank: fork: %s\n", std::strerror(errno));
    std::_Exit(126);
  }
  if (child == 0) {
    struct sigaction dfl {};
    dfl.sa_handler = SIG_DFL;
    sigemptyset(&dfl.sa_mask);
    for (int sig : kRelayed) ::sigaction(sig, &dfl, nullptr);
    ::sigprocmask(SIG_SETMASK, &previous, nullptr);
    if (::prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || ::getppid() != wrapper) std::_Exit(127);
    ExecProgram(options, rank, env);
  }
  g_child = child;
  ::sigprocmask(SIG_SETMASK, &previous, nullptr);
  int status = 0;
  if (options.signal_file.empty()) {
    while (::waitpid(child, &status, 0) < 0 && errno == EINTR) {
    }
  } else {
    SignalFileRelay relay_file(options.signal_file, child);
    for (;;) {
      const pid_t done = ::waitpid(child, &status, WNOHANG);
      if (done == child || (done < 0 && errno != EINTR)) break;
      relay_file.Pass();
      ::poll(nullptr, 0, kSignalFilePollMs);
    }
  }
  mpi_shm.Leave();
  // A bus client's node folder (comms/bus_client.h) that the program's
  // killing left with no member goes now, not at the node's next reader.
  SweepSharedNodeDirs(kMpiShmRoot, kBusNodeDirPrefix);
  RankExit e;
  e.rank = std::atoi(rank.c_str());
  e.pid = child;
  e.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 0;
  e.signal = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
  e.restart_count = std::atoi(env("AGENTRT_RESTART_COUNT").value_or("0").c_str());
  e.time = UnixNow();
  e.node = ThisNode(env);
  if (!options.log_dir.empty()) {
    const Status s =
        WriteFileAtomic(RankExitPath(options.log_dir, e.rank), e.ToJson().dump() + "\n");
    if (!s.ok()) std::fprintf(stderr, "exec-rank: %s\n", s.message().c_str());
  }
  if (e.signal != 0) {
    struct sigaction dfl {};
    dfl.sa_handler = SIG_DFL;
    sigemptyset(&dfl.sa_mask);
    ::sigaction(e.signal, &dfl, nullptr);
    ::kill(::getpid(), e.signal);  // end the way the program ended
  }
  std::_Exit(e.signal != 0 ? 128 + e.signal : e.exit_code);
}

}  // namespace

std::vector<std::string> RankExecArgs(const RankExecOptions& options) {
  std::vector<std::string> args;
  if (!options.log_dir.empty()) args.insert(args.end(), {"--log-dir", options.log_dir});
  for (const auto& g : options.node_gpus) args.insert(args.end(), {"--gpus", g});
  if (!options.step_id_file.empty())
    args.insert(args.end(), {"--step-id-file", options.step_id_file});
  if (options.exit_record) args.emplace_back("--exit-record");
  if (options.lease_first > 0) {
    args.insert(args.end(), {"--lease-ports", std::to_string(options.lease_first) + "-" +
                                                  std::to_string(options.lease_last)});
  }
  args.push_back("--");
  args.insert(args.end(), options.command.begin(), options.command.end());
  return args;
}

nlohmann::json RankExecOptions::ToJson() const {
  return {{"log_dir", log_dir},           {"node_gpus", node_gpus},
          {"step_id_file", step_id_file}, {"exit_record", exit_record},
          {"lease_first", lease_first},   {"lease_last", lease_last},
          {"command", command},           {"env", env},
          {"rank_base", rank_base},       {"world_size", world_size},
          {"signal_file", signal_file}};
}

Result<RankExecOptions> RankExecOptions::FromJson(const nlohmann::json& j) {
  if (!j.is_object()) return InvalidArgument("a rank task is not a JSON object");
  RankExecOptions o;
  try {
    o.log_dir = j.value("log_dir", "");
    o.node_gpus = j.value("node_gpus", std::vector<std::string>{});
    o.step_id_file = j.value("step_id_file", "");
    o.exit_record = j.value("exit_record", false);
    o.lease_first = j.value("lease_first", 0);
    o.lease_last = j.value("lease_last", 0);
    o.command = j.value("command", std::vector<std::string>{});
    o.env = j.value("env", std::vector<std::string>{});
    o.rank_base = j.value("rank_base", -1);
    o.world_size = j.value("world_size", 0);
    o.signal_file = j.value("signal_file", "");
  } catch (const nlohmann::json::exception& ex) {
    return InvalidArgument(std::string("a rank task: ") + ex.what());
  }
  if (o.command.empty()) return InvalidArgument("a rank task has no command");
  if (o.rank_base >= 0 && o.world_size < 1) {
    return InvalidArgument("a rank task with rank_base " + std::to_string(o.rank_base) +
                           " needs a world_size of at least 1");
  }
  return o;
}

nlohmann::json RankExit::ToJson() const {
  return {{"rank", rank},
          {"pid", pid},
          {"exit_code", exit_code},
          {"signal", signal},
          {"restart_count", restart_count},
          {"time", time},
          {"node", node}};
}

Result<RankExit> RankExit::FromJson(const nlohmann::json& j) {
  if (!j.is_object()) return InvalidArgument("a rank exit record is not a JSON object");
  RankExit e;
  try {
    e.rank = j.value("rank", -1);
    e.pid = j.value("pid", int64_t{0});
    e.exit_code = j.value("exit_code", 0);
    e.signal = j.value("signal", 0);
    e.restart_count = j.value("restart_count", -1);
    e.time = j.value("time", 0.0);
    e.node = j.value("node", "");
  } catch (const nlohmann::json::exception& ex) {
    return InvalidArgument(std::string("a rank exit record: ") + ex.what());
  }
  return e;
}

std::string RankExitPath(const std::string& log_dir, int rank) {
  return log_dir + "/rank" + std::to_string(rank) + ".exit";
}

namespace {

// Calls `fn` with the path of every rank exit record in `log_dir`.
template <typename Fn>
void ForEachRankExitFile(const std::string& log_dir, Fn fn) {
  DIR* d = ::opendir(log_dir.c_str());
  if (d == nullptr) return;
  while (dirent* entry = ::readdir(d)) {
    const std::string name = entry->d_name;
    if (name.rfind("rank", 0) == 0 && name.size() >= 10 && name.substr(name.size() - 5) == ".exit")
      fn(log_dir + "/" + name);
  }
  ::closedir(d);
}

}  // namespace

std::vector<RankExit> ReadRankExits(const std::string& log_dir, int restart_count) {
  std::vector<RankExit> out;
  ForEachRankExitFile(log_dir, [&](const std::string& path) {
    auto text = ReadWholeFile(path, 4096);
    if (!text.ok()) return;
    const Result<RankExit> e =
        RankExit::FromJson(nlohmann::json::parse(*text, nullptr, /*allow_exceptions=*/false));
    if (e.ok() && e->restart_count == restart_count) out.push_back(*e);
  });
  std::sort(out.begin(), out.end(),
            [](const RankExit& a, const RankExit& b) { return a.rank < b.rank; });
  return out;
}

void RemoveRankExits(const std::string& log_dir) {
  ForEachRankExitFile(log_dir, [](const std::string& path) { ::unlink(path.c_str()); });
}

Result<RouteInterface> InterfaceToward(const std::string& addr) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* found = nullptr;
  if (const int rc = ::getaddrinfo(addr.c_str(), "9", &hints, &found); rc != 0 || !found) {
    return NotFound("cannot resolve " + addr + ": " + ::gai_strerror(rc));
  }
  sockaddr_in to{};
  std::memcpy(&to, found->ai_addr, sizeof to);
  ::freeaddrinfo(found);
  // A connected UDP socket: the kernel picks the route and source address, sends nothing.
  const int fd = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return ErrnoStatus(errno, "socket");
  sockaddr_in local{};
  socklen_t len = sizeof local;
  const bool ok = ::connect(fd, reinterpret_cast<sockaddr*>(&to), sizeof to) == 0 &&
                  ::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) == 0;
  const int err = errno;
  ::close(fd);
  if (!ok) return ErrnoStatus(err, "no route to " + addr);
  ifaddrs* ifs = nullptr;
  if (::getifaddrs(&ifs) != 0) return ErrnoStatus(errno, "getifaddrs");
  RouteInterface found_if;
  for (ifaddrs* i = ifs; i != nullptr && found_if.name.empty(); i = i->ifa_next) {
    if (i->ifa_addr == nullptr || i->ifa_addr->sa_family != AF_INET) continue;
    if (reinterpret_cast<sockaddr_in*>(i->ifa_addr)->sin_addr.s_addr == local.sin_addr.s_addr) {
      found_if.name = i->ifa_name;
      found_if.loopback = (i->ifa_flags & IFF_LOOPBACK) != 0;
    }
  }
  ::freeifaddrs(ifs);
  if (found_if.name.empty()) {
    char text[INET_ADDRSTRLEN] = {};
    ::inet_ntop(AF_INET, &local.sin_addr, text, sizeof text);
    return NotFound(std::string("no interface holds ") + text + ", the route to " + addr);
  }
  return found_if;
}

Result<SocketInterfaces> SocketInterfacesFor(const std::string& iface, bool loopback,
                                             bool ranks_span_nodes,
                                             const std::string& master_addr) {
  if (loopback && ranks_span_nodes) {
    return FailedPrecondition("MASTER_ADDR " + master_addr + " is reached through the loopback " +
                              "interface " + iface +
                              " here, but the agent's ranks span nodes: the other nodes cannot "
                              "reach rank 0 there. Give the node an address other nodes reach "
                              "(e.g. NodeAddr in slurm.conf), not one /etc/hosts maps to 127.x");
  }
  return SocketInterfaces{"=" + iface, iface};
}

int ExecRank(const RankExecOptions& options) {
  if (options.command.empty()) {
    std::fprintf(stderr, "exec-rank: no command given\n");
    return 2;
  }
  const pid_t parent = ::getppid();
  if (::prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || parent == 1 || ::getppid() != parent) {
    return 127;  // our launcher is already gone
  }
  if (!options.env.empty()) ReplaceEnvironment(options.env);
  const EnvLookup env = ProcessEnvLookup();
  auto vars = RankVariablesFromLauncher(env);
  if (!vars.ok()) {
    std::fprintf(stderr, "exec-rank: %s\n", vars.status().message().c_str());
    return 2;
  }
  if (options.rank_base >= 0) {
    // One agent's ranks among a node step's tasks (all on this node).
    const int task = std::atoi(vars->at("RANK").c_str());
    const int r = task - options.rank_base;
    if (r < 0 || r >= options.world_size) {
      std::fprintf(stderr, "exec-rank: task %d is not one of the agent's tasks %d-%d\n", task,
                   options.rank_base, options.rank_base + options.world_size - 1);
      return 2;
    }
    (*vars)["RANK"] = (*vars)["LOCAL_RANK"] = std::to_string(r);
    (*vars)["WORLD_SIZE"] = (*vars)["LOCAL_WORLD_SIZE"] = std::to_string(options.world_size);
  }
  for (const auto& [k, v] : *vars) ::setenv(k.c_str(), v.c_str(), 1);
  const std::string rank = vars->at("RANK");

  // NCCL and gloo pick an interface by themselves, often one the other nodes
  // cannot reach: name the one that leads to rank 0 (unless the agent did).
  // (Ranks of one node talk over loopback: nothing to choose.)
  if (const auto master = env("MASTER_ADDR");
      master && !master->empty() && *master != "localhost" && master->rfind("127.", 0) != 0) {
    const bool nccl_set = env("NCCL_SOCKET_IFNAME").has_value();
    const bool gloo_set = env("GLOO_SOCKET_IFNAME").has_value();
    if (!nccl_set || !gloo_set) {
      auto iface = InterfaceToward(*master);
      if (iface.ok()) {
        const bool spans_nodes = vars->at("LOCAL_WORLD_SIZE") != vars->at("WORLD_SIZE");
        auto names = SocketInterfacesFor(iface->name, iface->loopback, spans_nodes, *master);
        if (!names.ok()) {
          std::fprintf(stderr, "exec-rank: rank %s: %s\n", rank.c_str(),
                       names.status().message().c_str());
          return 2;
        }
        if (!nccl_set) ::setenv("NCCL_SOCKET_IFNAME", names->nccl.c_str(), 1);
        if (!gloo_set) ::setenv("GLOO_SOCKET_IFNAME", names->gloo.c_str(), 1);
      } else {
        std::fprintf(stderr, "exec-rank: rank %s: MASTER_ADDR %s: %s\n", rank.c_str(),
                     master->c_str(), iface.status().message().c_str());
      }
    }
  }

  if (!options.node_gpus.empty()) {
    const std::string node = ThisNode(env);
    bool found = false;
    for (const auto& entry : options.node_gpus) {
      const auto eq = entry.find('=');
      if (eq != std::string::npos && entry.compare(0, eq, node) == 0 && eq == node.size()) {
        ::setenv("CUDA_VISIBLE_DEVICES", entry.c_str() + eq + 1, 1);
        found = true;
      }
    }
    if (!found) {
      std::fprintf(stderr, "exec-rank: rank %s runs on node '%s', which the plan gives no GPUs\n",
                   rank.c_str(), node.c_str());
      return 2;
    }
  }

  if (!options.step_id_file.empty() && rank == "0") {
    const auto job = env("SLURM_JOB_ID");
    const auto step = env("SLURM_STEP_ID");
    if (job && step) {
      const Status s = WriteFileAtomic(options.step_id_file, *job + "." + *step + "\n");
      if (!s.ok()) std::fprintf(stderr, "exec-rank: %s\n", s.message().c_str());
    }
  }
  if (options.lease_first > 0 && vars->at("LOCAL_RANK") == "0") {
    // Held by this process until it ends (Supervise never returns).
    const std::string node = env("SLURMD_NODENAME").value_or("this node");
    auto leases = PortLeases::Open(env(std::string(kEnvRunDir)).value_or("?"));
    Status leased = leases.ok() ? (*leases)->AcquireForRun(options.lease_first, options.lease_last)
                                : leases.status();
    if (!leased.ok()) {
      std::fprintf(stderr,
                   "exec-rank: rank %s on node %s: cannot lease its agent's ports %d-%d: %s\n",
                   rank.c_str(), node.c_str(), options.lease_first, options.lease_last,
                   leased.message().c_str());
      return 2;
    }
    static std::unique_ptr<PortLeases> held;
    held = std::move(leases).value();
  }
  if (options.exit_record || options.lease_first > 0 || !options.signal_file.empty()) {
    // An MPI step under srun (PMIx's variables set): Open MPI's shared
    // memory on this node goes in the step's folder, which the last rank to
    // leave removes; the node's first rank first removes those of steps
    // whose ranks were killed (plan/mpi_shm.h). Only a supervised rank can
    // leave; a user's own setting wins.
    StepMpiShm mpi_shm;
    const auto job = env("SLURM_JOB_ID");
    const auto step = env("SLURM_STEP_ID");
    if (job && step && env("PMIX_RANK") && !env(kOmpiVaderBackingVar)) {
      if (vars->at("LOCAL_RANK") == "0") SweepStepMpiShmDirs(kMpiShmRoot);
      mpi_shm = JoinStepMpiShm(kMpiShmRoot, *job, *step);
      if (!mpi_shm.dir().empty()) ::setenv(kOmpiVaderBackingVar, mpi_shm.dir().c_str(), 1);
    }
    Supervise(options, rank, env, mpi_shm);
  }
  ExecProgram(options, rank, env);
}

int ExecRankMain(int argc, char** argv) {
  RankExecOptions options;
  int i = 1;
  auto usage = [&] {
    std::fprintf(stderr,
                 "usage: %s [--log-dir DIR] [--gpus NODE=LIST]... [--step-id-file FILE] "
                 "[--exit-record] [--lease-ports FIRST-LAST] -- /abs/program args...\n"
                 "       %s --task-file FILE\n"
                 "       %s --sweep-mpi-shm\n",
                 argv[0], argv[0], argv[0]);
    return 2;
  };
  for (; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--") {
      ++i;
      break;
    }
    if (a == "--exit-record") {
      options.exit_record = true;
      continue;
    }
    if (a == "--sweep-mpi-shm") {
      // For a node's clean-up (an epilog): the step folders of killed ranks.
      std::printf(
          "removed %d step folder(s) of Open MPI shared memory and %d bus folder(s) from %s\n",
          SweepStepMpiShmDirs(kMpiShmRoot), SweepSharedNodeDirs(kMpiShmRoot, kBusNodeDirPrefix),
          kMpiShmRoot);
      return 0;
    }
    if (i + 1 >= argc) return usage();
    if (a == "--task-file") {
      const std::string path = argv[++i];
      auto text = ReadWholeFile(path, size_t{16} << 20);
      auto task = text.ok() ? RankExecOptions::FromJson(
                                  nlohmann::json::parse(*text, nullptr, /*allow_exceptions=*/false))
                            : Result<RankExecOptions>(text.status());
      if (!task.ok()) {
        std::fprintf(stderr, "exec-rank: --task-file %s: %s\n", path.c_str(),
                     task.status().message().c_str());
        return 2;
      }
      return ExecRank(*task);
    }
    if (a == "--log-dir") {
      options.log_dir = argv[++i];
    } else if (a == "--gpus") {
      options.node_gpus.emplace_back(argv[++i]);
    } else if (a == "--step-id-file") {
      options.step_id_file = argv[++i];
    } else if (a == "--lease-ports") {
      const std::string range = argv[++i];
      if (std::sscanf(range.c_str(), "%d-%d", &options.lease_first, &options.lease_last) != 2 ||
          options.lease_first < 1 || options.lease_last < options.lease_first ||
          options.lease_last > 65535) {
        std::fprintf(stderr, "exec-rank: --lease-ports %s: expected FIRST-LAST within 1-65535\n",
                     range.c_str());
        return 2;
      }
    } else {
      return usage();
    }
  }
  for (; i < argc; ++i) options.command.emplace_back(argv[i]);
  return ExecRank(options);
}

}  // namespace agentrt
