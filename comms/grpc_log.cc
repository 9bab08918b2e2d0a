#include "comms/grpc_log.h"

#include <grpc/support/log.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>

#include "comms/bus_validate.h"

namespace agentrt {
namespace {

// One burst: lines from one site closer together than this.
constexpr double kBurstWindowS = 10.0;

// Never destroyed: gRPC's threads may still log while the process exits.
std::mutex& Mu() {
  static auto* mu = new std::mutex;
  return *mu;
}
LogBurstLimiter& Limiter() {  // guarded by Mu()
  static auto* limiter = new LogBurstLimiter(kBurstWindowS);
  return *limiter;
}

double MonotonicSeconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

void SayHeldBack(const std::string& site, int held) {
  std::fprintf(stderr, "agentrt: grpc (%s): %d more line%s like the last from here\n", site.c_str(),
               held, held == 1 ? "" : "s");
}

void FlushHeldBack() {
  std::lock_guard<std::mutex> lock(Mu());
  for (const auto& [site, held] : Limiter().TakeHeldBack()) SayHeldBack(site, held);
}

void LogLine(gpr_log_func_args* args) {
  const char* severity = args->severity == GPR_LOG_SEVERITY_ERROR  ? "error"
                         : args->severity == GPR_LOG_SEVERITY_INFO ? "info"
                                                                   : "debug";
  const char* file = args->file != nullptr ? std::strrchr(args->file, '/') : nullptr;
  file = file != nullptr ? file + 1 : (args->file != nullptr ? args->file : "?");
  const std::string site = std::string(file) + ":" + std::to_string(args->line);
  const std::string message = Printable(args->message != nullptr ? args->message : "", 500);
  std::lock_guard<std::mutex> lock(Mu());
  if (args->severity != GPR_LOG_SEVERITY_DEBUG) {
    int held = 0;
    const bool print = Limiter().Admit(site, MonotonicSeconds(), &held);
    if (held > 0) SayHeldBack(site, held);
    if (!print) return;
  }
  std::fprintf(stderr, "agentrt: grpc %s (%s): %s\n", severity, site.c_str(), message.c_str());
}

}  // namespace

bool LogBurstLimiter::Admit(std::string_view site, double now_s, int* held_back) {
  *held_back = 0;
  auto it = sites_.find(site);
  if (it == sites_.end()) {
    sites_.emplace(std::string(site), Site{now_s, 0});
    return true;
  }
  Site& s = it->second;
  if (now_s - s.printed_s < window_s_) {
    ++s.held;
    return false;
  }
  *held_back = s.held;
  s = Site{now_s, 0};
  return true;
}

std::vector<std::pair<std::string, int>> LogBurstLimiter::TakeHeldBack() {
  std::vector<std::pair<std::string, int>> out;
  for (auto& [site, s] : sites_) {
    if (s.held > 0) out.emplace_back(site, s.held);
    s.held = 0;
  }
  return out;
}

void RouteGrpcLogging() {
  static std::once_flag once;
  std::call_once(once, [] {
    gpr_set_log_function(LogLine);
    std::atexit(FlushHeldBack);
  });
}

}  // namespace agentrt
