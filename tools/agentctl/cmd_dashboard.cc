// `agentctl dashboard RUN_DIR [--listen HOST:PORT] [--token-file F]` — serves
// the web dashboard and Prometheus metrics of a run, running or finished
// (dashboard/server.h), until SIGINT or SIGTERM. It prints the URL first.
// Loopback by default; another address needs --token-file (a 0600 file whose
// content every request must present): the token is never in argv or logs.
// Off loopback it serves HTTPS only, with --tls-cert/--tls-key or else a
// certificate the run's own CA (comms/run_ca.h) signs for this host's names
// and addresses, so the token never crosses the network in the clear.
#include <fmt/format.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "common/file_util.h"
#include "comms/run_ca.h"
#include "dashboard/server.h"
#include "plan/run_dir.h"
#include "tools/agentctl/commands.h"

namespace agentctl {
namespace {

// The names a browser may dial a dashboard on `host` by: the host itself, or
// for a wildcard address this machine's name and every address it has.
std::vector<std::string> DialNames(const std::string& host) {
  if (host != "0.0.0.0" && host != "::" && !host.empty()) return {host};
  std::vector<std::string> names;
  char name[256] = {};
  if (::gethostname(name, sizeof name - 1) == 0) names.emplace_back(name);
  ifaddrs* addrs = nullptr;
  if (::getifaddrs(&addrs) != 0) return names;
  for (const ifaddrs* a = addrs; a != nullptr; a = a->ifa_next) {
    if (a->ifa_addr == nullptr) continue;
    const int family = a->ifa_addr->sa_family;
    if (family != AF_INET && family != AF_INET6) continue;
    char text[NI_MAXHOST] = {};
    const socklen_t size = family == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6);
    if (::getnameinfo(a->ifa_addr, size, text, sizeof text, nullptr, 0, NI_NUMERICHOST) == 0 &&
        std::string_view(text).find('%') == std::string_view::npos) {
      names.emplace_back(text);
    }
  }
  ::freeifaddrs(addrs);
  return names;
}

}  // namespace

void RegisterDashboard(CLI::App& app) {
  struct Options {
    std::string run_dir;
    std::string listen = "127.0.0.1:0";
    std::string token_file;
    std::string tls_cert;
    std::string tls_key;
  };
  auto opts = std::make_shared<Options>();
  CLI::App* cmd =
      app.add_subcommand("dashboard", "Serve a run's web dashboard and /metrics (Prometheus)");
  cmd->add_option("run_dir", opts->run_dir, "the run directory")->required();
  cmd->add_option("--listen", opts->listen, "HOST:PORT to serve on (port 0: any free one)")
      ->capture_default_str();
  cmd->add_option("--token-file", opts->token_file,
                  "a 0600 file holding the token every request must present (needed off loopback)");
  cmd->add_option("--tls-cert", opts->tls_cert,
                  "PEM certificate to serve HTTPS with (off loopback the default is one from the "
                  "run's CA, RUN_DIR/secrets/ca.pem)");
  cmd->add_option("--tls-key", opts->tls_key, "PEM private key of --tls-cert");
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
    const agentrt::RunDir dir(opts->run_dir);
    if (!agentrt::ReadWholeFile(dir.PlanPath(), 1 << 26).ok()) {
      Fail("dashboard",
           agentrt::NotFound(opts->run_dir + " has no plan.json: is it a run directory?"));
    }
    o.tls_cert_file = opts->tls_cert;
    o.tls_key_file = opts->tls_key;
    std::string trust_note;
    if (o.tls_cert_file.empty() && !agentrt::IsLoopbackHost(o.host) && !o.token.empty()) {
      // The token crosses the network: HTTPS with a certificate of the run's CA.
      agentrt::Status made = agentrt::EnsureRunCa(dir);
      if (made.ok()) {
        made = agentrt::IssueServerCertificate(dir, "agentrt dashboard", DialNames(o.host),
                                               dir.DashboardCertPath(), dir.DashboardKeyPath());
      }
      if (!made.ok()) {
        Fail("dashboard", made.WithContext("serving HTTPS off loopback needs a certificate (the "
                                           "run's CA could not sign one; give --tls-cert and "
                                           "--tls-key)"));
      }
      o.tls_cert_file = dir.DashboardCertPath();
      o.tls_key_file = dir.DashboardKeyPath();
      trust_note = fmt::format(
          " (HTTPS; its certificate is signed by the run's CA, {}: "
          "curl --cacert, or import it into the browser)",
          dir.RunCaPath());
    }
    // Signals are taken by sigwait below; block them before the server starts threads.
    sigset_t signals;
    sigemptyset(&signals);
    sigaddset(&signals, SIGINT);
    sigaddset(&signals, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &signals, nullptr);
    auto dashboard = agentrt::Dashboard::Start(opts->run_dir, o);
    if (!dashboard.ok()) Fail("dashboard", dashboard.status());
    std::printf("dashboard of %s: %s%s\n", opts->run_dir.c_str(), (*dashboard)->url().c_str(),
                trust_note.c_str());
    std::fflush(stdout);
    int sig = 0;
    sigwait(&signals, &sig);
    (*dashboard)->Stop();
  });
}

}  // namespace agentctl
