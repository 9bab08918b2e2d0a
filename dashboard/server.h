// The web dashboard of one run directory, served by cpp-httplib (Debian's
// libcpp-httplib-dev), read-only unless it has a token:
//
//   GET /             the page (dashboard/page.html: its own small JS and CSS, no CDN)
//   GET /api/run      RunView (dashboard/views.h) as JSON
//   GET /api/names    metric names per agent
//   GET /api/series?metric=M&agents=a,b&points=N   decimated (step, value) per agent
//   GET /events       server-sent events: the RunView again whenever status.json changes
//   GET /metrics      Prometheus text format
//   POST /api/stop, POST /api/restart?agent=A   with a token only, and the header
//                     X-Agentrt-Confirm: yes: a request to the run's controller
//                     (scheduler/control.h); 202 when it is written
//
// Loopback by default. Another address needs a token (read by the caller from
// a 0600 file); every request must then carry it (`Authorization: Bearer T`,
// or `?token=T` once, which sets a cookie holding a value derived from the
// token, never the token). Every response says `X-Content-Type-Options:
// nosniff`, `Referrer-Policy: no-referrer` and a Content-Security-Policy that
// allows the page's own script (by hash) and requests to this server only,
// and no framing (`frame-ancestors 'none'`). The server reads the run's files
// only when asked (and the event streams look at status.json's mtime every
// 250 ms), so an idle dashboard costs nothing.
//
// Thread-safety: Start and Stop from one thread; requests are served on
// cpp-httplib's pool.
#pragma once

#include <atomic>
#include <memory>
#include <string>

#include "common/net.h"
#include "common/status.h"

namespace agentrt {

struct DashboardOptions {
  std::string host = "127.0.0.1";
  int port = 0;       // 0: any free port
  std::string token;  // required unless host is loopback
  // Both set: HTTPS only, with this certificate and key (PEM files).
  std::string tls_cert_file;
  std::string tls_key_file;
};

class Dashboard {
 public:
  static Result<std::unique_ptr<Dashboard>> Start(const std::string& run_dir,
                                                  const DashboardOptions& options);
  ~Dashboard();
  Dashboard(const Dashboard&) = delete;
  Dashboard& operator=(const Dashboard&) = delete;

  int port() const;
  // http://host:port/ (the token is not in it).
  std::string url() const;
  void Stop();

 private:
  struct Impl;
  explicit Dashboard(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace agentrt
