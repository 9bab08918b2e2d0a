// `agentctl dashboard RUN_DIR [--listen HOST:PORT] [--token-file F]` — serves
// the web dashboard and Prometheus metrics of a run, running or finished
// (dashboard/server.h), until SIGINT or SIGTERM. It prints the URL first.
// Loopback by default; another address needs --token-file (a 0600 file whose
// content every request must present): the token is never in argv or logs.
#include <fmt/format.h>
#include <signal.h>

#include <cstdio>
#include <memory>
#include <string>

#include "common/file_util.h"
#include "dashboard/server.h"
#include "plan/run_dir.h"
#include "tools/agentctl/commands.h"

namespace agentctl {

void RegisterDashboard(CLI::App& app) {
  struct Options {
    std::string run_dir;
    std::string listen = "127.0.0.1:0";
    std::string token_file;
  };
  auto opts = std::make_shared<Options>();
  CLI::App* cmd =
      app.add_subcommand("dashboard", "Serve a run's web dashboard and /metrics (Prometheus)");
  cmd->add_option("run_dir", opts->run_dir, "the run directory")->required();
  cmd->add_option("--listen", opts->listen, "HOST:PORT to serve on (port 0: any free one)")
      ->capture_default_str();
  cmd->add_option("--token-file", opts->token_file,
                  "a 0600 file holding the token every request must present (needed off loopback)");
  cmd->callback([opts] {
    const auto colon = opts->listen.rfind(':');
    if (colon == std::string::npos) {
      Fail("dashboard", agentrt::InvalidArgument("--listen " + opts->listen +
                                                 ": expected HOST:PORT, e.g. 127.0.0.1:8265"));
    }
    agentrt::DashboardOptions o;
    o.host = opts->listen.substr(0, colon);
    if (o.host.size() > 2 && o.host.front() == '[') o.host = o.host.substr(1, o.host.size() - 2);
    const std::string port = opts->listen.substr(colon + 1);
    char* end = nullptr;
    const long n = std::strtol(port.c_str(), &end, 10);
    if (port.empty() || end != port.c_str() + port.size() || n < 0 || n > 65535) {
      Fail("dashboard", agentrt::InvalidArgument("--listen " + opts->listen + ": port \"" + port +
                                                 "\" is not a number in 0..65535"));
    }
    o.port = static_cast<int>(n);
    if (!opts->token_file.empty()) {
      auto token = agentrt::ReadPrivateFile(opts->token_file, "dashboard token file");
      if (!token.ok()) Fail("dashboard", token.status());
      o.token = *token;
      while (!o.token.empty() && (o.token.back() == '\n' || o.token.back() == '\r'))
        o.token.pop_back();
      if (o.token.empty())
        Fail("dashboard", agentrt::InvalidArgument(opts->token_file + " is empty"));
    }
    if (!agentrt::ReadWholeFile(agentrt::RunDir(opts->run_dir).PlanPath(), 1 << 26).ok()) {
      Fail("dashboard",
           agentrt::NotFound(opts->run_dir + " has no plan.json: is it a run directory?"));
    }
    // Signals are taken by sigwait below; block them before the server starts threads.
    sigset_t signals;
    sigemptyset(&signals);
    sigaddset(&signals, SIGINT);
    sigaddset(&signals, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &signals, nullptr);
    auto dashboard = agentrt::Dashboard::Start(opts->run_dir, o);
    if (!dashboard.ok()) Fail("dashboard", dashboard.status());
    std::printf("dashboard of %s: %s\n", opts->run_dir.c_str(), (*dashboard)->url().c_str());
    std::fflush(stdout);
    int sig = 0;
    sigwait(&signals, &sig);
    (*dashboard)->Stop();
  });
}

}  // namespace agentctl
