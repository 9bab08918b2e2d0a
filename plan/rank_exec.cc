#include "plan/rank_exec.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "common/file_util.h"
#include "plan/agent_env.h"

namespace agentrt {

std::vector<std::string> RankExecArgs(const RankExecOptions& options) {
  std::vector<std::string> args;
  if (!options.log_dir.empty()) args.insert(args.end(), {"--log-dir", options.log_dir});
  for (const auto& g : options.node_gpus) args.insert(args.end(), {"--gpus", g});
  if (!options.step_id_file.empty())
    args.insert(args.end(), {"--step-id-file", options.step_id_file});
  args.push_back("--");
  args.insert(args.end(), options.command.begin(), options.command.end());
  return args;
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
  const EnvLookup env = ProcessEnvLookup();
  auto vars = RankVariablesFromLauncher(env);
  if (!vars.ok()) {
    std::fprintf(stderr, "exec-rank: %s\n", vars.status().message().c_str());
    return 2;
  }
  for (const auto& [k, v] : *vars) ::setenv(k.c_str(), v.c_str(), 1);
  const std::string rank = vars->at("RANK");

  if (!options.node_gpus.empty()) {
    std::string node = env("SLURMD_NODENAME").value_or("");
    if (node.empty()) {
      char host[256] = {};
      if (::gethostname(host, sizeof host - 1) == 0) node = host;
    }
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

  if (!options.log_dir.empty()) {
    const std::string path = options.log_dir + "/rank" + rank + ".log";
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd < 0) {
      std::fprintf(stderr, "exec-rank: cannot open %s: %s\n", path.c_str(), std::strerror(errno));
      return 126;
    }
    ::dup2(fd, 1);
    ::dup2(fd, 2);
  }
  if (const auto workdir = env("AGENTRT_WORKDIR"); workdir && !workdir->empty()) {
    if (::chdir(workdir->c_str()) != 0) {
      std::fprintf(stderr, "exec-rank: cannot enter the agent's working directory %s: %s\n",
                   workdir->c_str(), std::strerror(errno));
      return 126;
    }
  }
  std::vector<char*> args;
  args.reserve(options.command.size() + 1);
  for (const auto& a : options.command) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  ::execv(args[0], args.data());
  std::fprintf(stderr, "exec-rank: cannot execute %s: %s\n", args[0], std::strerror(errno));
  return errno == ENOENT ? 127 : 126;
}

int ExecRankMain(int argc, char** argv) {
  RankExecOptions options;
  int i = 1;
  auto usage = [&] {
    std::fprintf(stderr,
                 "usage: %s [--log-dir DIR] [--gpus NODE=LIST]... [--step-id-file FILE] -- "
                 "/abs/program args...\n",
                 argv[0]);
    return 2;
  };
  for (; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--") {
      ++i;
      break;
    }
    if (i + 1 >= argc) return usage();
    if (a == "--log-dir") {
      options.log_dir = argv[++i];
    } else if (a == "--gpus") {
      options.node_gpus.emplace_back(argv[++i]);
    } else if (a == "--step-id-file") {
      options.step_id_file = argv[++i];
    } else {
      return usage();
    }
  }
  for (; i < argc; ++i) options.command.emplace_back(argv[i]);
  return ExecRank(options);
}

}  // namespace agentrt
