#include "comms/grpc_log.h"

#include <grpc/support/log.h>

#include <cstdio>
#include <cstring>
#include <mutex>
#include <string>

#include "comms/bus_validate.h"

namespace agentrt {
namespace {

void LogLine(gpr_log_func_args* args) {
  const char* severity = args->severity == GPR_LOG_SEVERITY_ERROR  ? "error"
                         : args->severity == GPR_LOG_SEVERITY_INFO ? "info"
                                                                   : "debug";
  const char* file = args->file != nullptr ? std::strrchr(args->file, '/') : nullptr;
  file = file != nullptr ? file + 1 : (args->file != nullptr ? args->file : "?");
  const std::string message = Printable(args->message != nullptr ? args->message : "", 500);
  std::fprintf(stderr, "agentrt: grpc %s (%s:%d): %s\n", severity, file, args->line,
               message.c_str());
}

}  // namespace

void RouteGrpcLogging() {
  static std::once_flag once;
  std::call_once(once, [] { gpr_set_log_function(LogLine); });
}

}  // namespace agentrt
