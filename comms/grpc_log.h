// gRPC's own log lines go through agentrt: escaped (no raw peer bytes on a
// terminal: a handshake error may quote what a stranger sent to the port),
// cut to a sane length, prefixed with where they come from, on stderr, and
// rate-limited: a burst of error or info lines from one place in gRPC (a
// scanner, or a dozen clients without TLS at a TLS bus, each failing its
// handshake) prints its first line, then one line with the count of the
// rest. Debug lines (GRPC_VERBOSITY=debug, asked for) all pass.
#pragma once

#include <map>
#include <string>
#include <string_view>
#include <vector>

namespace agentrt {

// Installs the log function once per process (idempotent, thread-safe). The
// bus server and client call it before they start gRPC.
void RouteGrpcLogging();

// The rate limit, per call site ("file:line"): a line passes when its site
// has printed nothing for `window_s`; the others of the burst are held back
// and counted. Plain logic on a caller's clock; not synchronised.
class LogBurstLimiter {
 public:
  explicit LogBurstLimiter(double window_s) : window_s_(window_s) {}

  // Whether a line from `site` at `now_s` is printed. `held_back` is set to
  // the lines of the site's previous burst that were not (0: none): the
  // caller says so before the line.
  bool Admit(std::string_view site, double now_s, int* held_back);

  // Every site with lines held back since its last printed one, and the
  // count, which it zeroes (at exit, so no burst goes unsaid).
  std::vector<std::pair<std::string, int>> TakeHeldBack();

 private:
  struct Site {
    double printed_s = 0;
    int held = 0;
  };
  double window_s_;
  std::map<std::string, Site, std::less<>> sites_;
};

}  // namespace agentrt
