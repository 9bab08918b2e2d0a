#include "dashboard/server.h"

#include <fmt/format.h>
#include <httplib.h>
#include <openssl/evp.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <ctime>
#include <optional>
#include <sstream>
#include <thread>

#include "common/file_util.h"
#include "comms/auth.h"
#include "dashboard/page.h"
#include "dashboard/views.h"
#include "plan/run_dir.h"
#include "scheduler/control.h"

namespace agentrt {

namespace {

double NowUnix() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::vector<std::string> SplitComma(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream in(s);
  for (std::string part; std::getline(in, part, ',');) {
    if (!part.empty()) out.push_back(part);
  }
  return out;
}

// The page's Content-Security-Policy: its one inline script, by hash (so no
// injected script runs), its inline styles, requests to itself only, and no
// framing by other pages.
std::string PageSecurityPolicy(std::string_view page) {
  const size_t open = page.find("<script>");
  const size_t close = page.find("</script>");
  std::string hash;
  if (open != std::string_view::npos && close != std::string_view::npos && close > open) {
    const std::string_view script = page.substr(open + 8, close - open - 8);
    unsigned char digest[EVP_MAX_MD_SIZE];
    unsigned int size = 0;
    EVP_Digest(script.data(), script.size(), digest, &size, EVP_sha256(), nullptr);
    unsigned char b64[2 * EVP_MAX_MD_SIZE];
    const int n = EVP_EncodeBlock(b64, digest, static_cast<int>(size));
    hash = fmt::format(" 'sha256-{}'", std::string_view(reinterpret_cast<char*>(b64), n));
  }
  return "default-src 'none'; script-src" + hash +
         "; style-src 'unsafe-inline'; connect-src 'self'; img-src 'self' data:; "
         "base-uri 'none'; form-action 'none'; frame-ancestors 'none'";
}

// host:port as others reach a server listening on `host`: every address
// (0.0.0.0, ::) is this host's name, which its certificate names too.
std::string ReachableAt(const std::string& listen_host, int port) {
  std::string h = listen_host;
  if (h == "0.0.0.0" || h == "::" || h.empty()) {
    char name[256] = {};
    h = ::gethostname(name, sizeof name - 1) == 0 ? name : "127.0.0.1";
  }
  const std::string host = h.find(':') != std::string::npos && h.front() != '[' ? "[" + h + "]" : h;
  return fmt::format("{}:{}", host, port);
}

// The cookie a browser keeps after `?token=`: derived from the token (a
// browser's cookie store never holds the token itself), accepted instead of it.
std::string SessionValue(const std::string& token) {
  return token.empty() ? "" : HmacSha256Hex(token, "agentrt dashboard session");
}

}  // namespace

struct Dashboard::Impl {
  std::string run_dir;
  DashboardOptions options;
  std::unique_ptr<httplib::Server> server;  // an httplib::SSLServer with TLS
  std::thread thread;
  int port = 0;
  MetricSeries series;
  PlanCache plans;  // plan.json between requests
  std::atomic<bool> stopping{false};
  static constexpr int kMaxStreams = 16;
  std::atomic<int> streams{0};
  std::string targets;  // what this server wrote to prometheus_targets.json ("" if nothing)
  std::string session;  // SessionValue(options.token)
  static constexpr std::string_view kSessionCookie = "agentrt_session";

  explicit Impl(std::string dir) : run_dir(std::move(dir)), series(RunDir(run_dir).MetricsPath()) {}

  static std::optional<long> IntParam(const httplib::Request& req, const char* name) {
    const std::string v = req.get_param_value(name);
    char* end = nullptr;
    errno = 0;
    const long n = std::strtol(v.c_str(), &end, 10);
    if (v.empty() || end != v.c_str() + v.size() || errno == ERANGE || n < INT32_MIN ||
        n > INT32_MAX)
      return std::nullopt;
    return n;
  }

  void Error(httplib::Response& res, int code, const std::string& message) {
    res.status = code;
    Json(res, {{"error", message}});
  }

  void Json(httplib::Response& res, const nlohmann::json& j) {
    res.set_content(j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace),
                    "application/json");
  }

  bool Authorized(const httplib::Request& req, httplib::Response& res) {
    if (options.token.empty()) {
      // Loopback without a token: only pages asking for a loopback name (a
      // DNS-rebinding page names its own host).
      std::string host = req.get_header_value("Host");
      if (!host.empty() && host.front() == '[') {
        host = host.substr(1, host.find(']') == std::string::npos ? 0 : host.find(']') - 1);
      } else if (const auto colon = host.rfind(':'); colon != std::string::npos) {
        host = host.substr(0, colon);
      }
      if (host.empty() || IsLoopbackHost(host)) return true;
      res.status = 403;
      res.set_content("this dashboard answers to loopback names only (Host: " +
                          req.get_header_value("Host") + ")\n",
                      "text/plain");
      return false;
    }
    std::string given;
    const std::string auth = req.get_header_value("Authorization");
    if (auth.rfind("Bearer ", 0) == 0) given = auth.substr(7);
    if (given.empty() && req.has_param("token")) given = req.get_param_value("token");
    if (!given.empty() && TokenMatches(given, options.token)) {
      if (req.has_param("token")) {
        res.set_header("Set-Cookie", std::string(kSessionCookie) + "=" + session +
                                         "; HttpOnly; SameSite=Strict; Path=/" +
                                         (options.tls_cert_file.empty() ? "" : "; Secure"));
      }
      return true;
    }
    if (given.empty()) {
      const std::string cookie = req.get_header_value("Cookie");
      const auto at = cookie.find(std::string(kSessionCookie) + "=");
      if (at != std::string::npos) {
        std::string value = cookie.substr(at + kSessionCookie.size() + 1);
        value = value.substr(0, value.find(';'));
        if (TokenMatches(value, session)) return true;
      }
    }
    res.status = 401;
    res.set_content("this dashboard needs its token (Authorization: Bearer, or ?token=)\n",
                    "text/plain");
    return false;
  }

  // RunView, and whether this dashboard may act (it has a token).
  nlohmann::json View(const RunSnapshot& snap) const {
    nlohmann::json v = RunView(snap, NowUnix());
    v["actions"] = !options.token.empty();
    return v;
  }

  // A stop or restart request for the run's controller (scheduler/control.h).
  void Act(const httplib::Request& req, httplib::Response& res, const std::string& action,
           const std::string& agent) {
    if (options.token.empty()) {
      return Error(res, 403,
                   "this dashboard is read-only: serve it with --token-file to stop the run or "
                   "restart agents");
    }
    if (req.get_header_value("X-Agentrt-Confirm") != "yes") {
      return Error(res, 400,
                   "an action needs the header X-Agentrt-Confirm: yes (the page asks first)");
    }
    auto snap = ReadRunSnapshot(run_dir, &plans);
    if (!snap.ok()) return Error(res, 503, snap.status().message());
    if (!snap->controller_alive || snap->status.state != RunState::kRunning)
      return Error(res, 409, "the run is not running (its controller is gone or it has ended)");
    if (action == "restart" && snap->plan->FindAgent(agent) == nullptr)
      return Error(res, 404, "no agent '" + agent + "' in this run");
    const Status written =
        WriteControlRequest(RunDir(run_dir), {action, agent, "the dashboard", NowUnix(), ""});
    if (!written.ok()) return Error(res, 500, written.message());
    res.status = 202;
    Json(res, {{"accepted", true}, {"action", action}, {"agent", agent}});
  }

  // /api/series?metric=M&agents=a,b&points=N: the metric's curves, decimated.
  void Series(const httplib::Request& req, httplib::Response& res) {
    series.Refresh().IgnoreError();
    size_t points = 1000;
    if (req.has_param("points")) {
      const auto n = IntParam(req, "points");
      if (!n || *n < 10 || *n > 100000) {
        return Error(res, 400,
                     "points must be a whole number in 10..100000, got \"" +
                         req.get_param_value("points") + "\"");
      }
      points = static_cast<size_t>(*n);
    }
    if (req.get_param_value("metric").empty()) return Error(res, 400, "metric= is required");
    Json(res, {{"metric", req.get_param_value("metric")},
               {"series", series.Query(req.get_param_value("metric"),
                                       SplitComma(req.get_param_value("agents")), points)}});
  }

  // /api/logs?agent=A&rank=R&lines=N&q=text: the tail of a rank's log.
  void Logs(const httplib::Request& req, httplib::Response& res) {
    auto plan = ReadPlanFile(RunDir(run_dir).PlanPath());
    if (!plan.ok()) return Error(res, 503, plan.status().message());
    const auto rank = req.has_param("rank") ? IntParam(req, "rank") : std::optional<long>(0);
    const auto lines = req.has_param("lines") ? IntParam(req, "lines") : std::optional<long>(200);
    if (!rank || !lines) return Error(res, 400, "rank= and lines= must be whole numbers");
    auto tail = TailLog(run_dir, *plan, req.get_param_value("agent"), static_cast<int>(*rank),
                        static_cast<int>(*lines), req.get_param_value("q"));
    if (!tail.ok()) {
      return Error(res, tail.status().code() == StatusCode::kNotFound ? 404 : 400,
                   tail.status().message());
    }
    Json(res, {{"agent", req.get_param_value("agent")}, {"rank", *rank}, {"lines", *tail}});
  }

  // /events: server-sent events, one per change of status.json.
  void Events(httplib::Response& res) {
    // Each stream holds a worker of the pool: a bounded number of them, so
    // that the API and /metrics are always served.
    if (streams.fetch_add(1) >= kMaxStreams) {
      streams.fetch_sub(1);
      return Error(res, 503, "too many open event streams; close a dashboard tab");
    }
    const std::string status_path = RunDir(run_dir).StatusPath();
    auto last = std::make_shared<int64_t>(-2);
    res.set_header("Cache-Control", "no-store");
    res.set_chunked_content_provider(
        "text/event-stream",
        [this, status_path, last](size_t, httplib::DataSink& sink) {
          // One event at once, then one per change of status.json; a comment
          // every few seconds keeps proxies from closing the stream.
          for (int i = 0; i < 40 && !stopping.load(); ++i) {
            const int64_t m = FileMTimeNs(status_path);
            if (m != *last) {
              auto snap = ReadRunSnapshot(run_dir, &plans);
              if (snap.ok()) {
                *last = m;
                const std::string data = "event: run\ndata: " + View(*snap).dump() + "\n\n";
                return sink.write(data.data(), data.size());
              }
            }
            std::this_thread::sleep_for(std::chrono::milliseconds(250));
          }
          if (stopping.load()) return false;
          static const std::string ping = ": ping\n\n";
          return sink.write(ping.data(), ping.size());
        },
        [this](bool) { streams.fetch_sub(1); });
  }

  void Routes() {
    server->set_default_headers({{"X-Content-Type-Options", "nosniff"},
                                 {"Content-Security-Policy", PageSecurityPolicy(kDashboardPage)},
                                 {"X-Frame-Options", "DENY"},
                                 {"Referrer-Policy", "no-referrer"}});
    server->set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
      return Authorized(req, res) ? httplib::Server::HandlerResponse::Unhandled
                                  : httplib::Server::HandlerResponse::Handled;
    });
    server->set_error_handler([this](const httplib::Request& req, httplib::Response& res) {
      if (res.status == 404 && res.body.empty())
        Error(res, 404, "no such page: " + req.path + " (see /, /api/run, /metrics)");
    });
    server->Get("/", [](const httplib::Request&, httplib::Response& res) {
      res.set_content(std::string(kDashboardPage), "text/html; charset=utf-8");
    });
    server->Get("/api/run", [this](const httplib::Request&, httplib::Response& res) {
      auto snap = ReadRunSnapshot(run_dir, &plans);
      if (!snap.ok()) {
        res.status = 503;
        Json(res, {{"error", snap.status().message()}});
        return;
      }
      Json(res, View(*snap));
    });
    // Actions, only for a dashboard that has a token (read-only otherwise).
    server->Post("/api/stop", [this](const httplib::Request& req, httplib::Response& res) {
      Act(req, res, "stop", "");
    });
    server->Post("/api/restart", [this](const httplib::Request& req, httplib::Response& res) {
      Act(req, res, "restart", req.get_param_value("agent"));
    });
    server->Get("/api/names", [this](const httplib::Request&, httplib::Response& res) {
      series.Refresh().IgnoreError();
      Json(res, series.Names());
    });
    server->Get("/api/series",
                [this](const httplib::Request& req, httplib::Response& res) { Series(req, res); });
    server->Get("/api/logs",
                [this](const httplib::Request& req, httplib::Response& res) { Logs(req, res); });
    server->Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
      auto snap = ReadRunSnapshot(run_dir, &plans);
      if (!snap.ok()) {
        res.status = 503;
        res.set_content("# " + snap.status().message() + "\n", "text/plain");
        return;
      }
      res.set_content(PrometheusText(*snap, NowUnix()), "text/plain; version=0.0.4");
    });
    server->Get("/events",
                [this](const httplib::Request&, httplib::Response& res) { Events(res); });
  }
};

Dashboard::Dashboard(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Dashboard::~Dashboard() { Stop(); }

Result<std::unique_ptr<Dashboard>> Dashboard::Start(const std::string& run_dir,
                                                    const DashboardOptions& options) {
  if (!IsLoopbackHost(options.host) && options.token.empty()) {
    return InvalidArgument("serving the dashboard on " + options.host +
                           " (not loopback) needs a token: --token-file FILE (mode 0600)");
  }
  auto impl = std::make_unique<Impl>(run_dir);
  if (options.tls_cert_file.empty() != options.tls_key_file.empty())
    return InvalidArgument("dashboard: HTTPS needs a certificate and its key");
  if (!options.tls_cert_file.empty()) {
    auto https = std::make_unique<httplib::SSLServer>(options.tls_cert_file.c_str(),
                                                      options.tls_key_file.c_str());
    if (!https->is_valid()) {
      return InvalidArgument(fmt::format("dashboard: cannot serve HTTPS with {} and {}",
                                         options.tls_cert_file, options.tls_key_file));
    }
    impl->server = std::move(https);
  } else {
    impl->server = std::make_unique<httplib::Server>();
  }
  impl->options = options;
  impl->session = SessionValue(options.token);
  impl->Routes();
  const int port =
      options.port == 0
          ? impl->server->bind_to_any_port(options.host)
          : (impl->server->bind_to_port(options.host, options.port) ? options.port : -1);
  if (port <= 0) {
    return Unavailable(fmt::format("dashboard: cannot listen on {}:{} (in use, or a bad address?)",
                                   options.host, options.port));
  }
  impl->port = port;
  // Enough workers for the event streams and the API beside them.
  impl->server->new_task_queue = [] { return new httplib::ThreadPool(Impl::kMaxStreams + 8); };
  Impl* raw = impl.get();
  impl->thread = std::thread([raw] { raw->server->listen_after_bind(); });
  // stop() does nothing before the server runs: Start returns once it does.
  for (int i = 0; i < 5000 && !impl->server->is_running(); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  // Prometheus finds the run's /metrics through this file (file_sd_configs).
  // An HTTPS dashboard says so in the target's __scheme__ label.
  nlohmann::json labels = {{"agentrt_run_dir", RunDir(run_dir).path()}};
  if (!options.tls_cert_file.empty()) labels["__scheme__"] = "https";
  impl->targets = nlohmann::json::array({{{"targets", {ReachableAt(options.host, port)}},
                                          {"labels", std::move(labels)}}})
                      .dump() +
                  "\n";
  const Status written =
      WriteFileAtomic(RunDir(run_dir).PrometheusTargetsPath(), impl->targets, {.mode = 0644});
  if (!written.ok()) impl->targets.clear();  // a read-only run directory: served all the same
  return std::unique_ptr<Dashboard>(new Dashboard(std::move(impl)));
}

int Dashboard::port() const { return impl_->port; }

std::string Dashboard::url() const {
  return fmt::format("{}://{}/", impl_->options.tls_cert_file.empty() ? "http" : "https",
                     ReachableAt(impl_->options.host, impl_->port));
}

void Dashboard::Stop() {
  if (!impl_ || impl_->stopping.exchange(true)) return;
  impl_->server->stop();
  if (impl_->thread.joinable()) impl_->thread.join();
  // The targets are removed unless another dashboard of the run has written its own since.
  const std::string path = RunDir(impl_->run_dir).PrometheusTargetsPath();
  if (!impl_->targets.empty() && ReadWholeFile(path, 1 << 20).value_or("") == impl_->targets)
    ::unlink(path.c_str());
}

}  // namespace agentrt
