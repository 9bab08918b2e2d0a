// Status codes, the thread's last error, strings handed out.
#include <cstdlib>
#include <string>

#include "capi/c_api_internal.h"

namespace agentrt::capi {
namespace {
thread_local std::string g_last_error;
}  // namespace

const char* LastError();

int CodeOf(StatusCode code) {
  switch (code) {
    case StatusCode::kOk:
      return AGENTRT_OK;
    case StatusCode::kCancelled:
      return AGENTRT_CANCELLED;
    case StatusCode::kInvalidArgument:
      return AGENTRT_INVALID_ARGUMENT;
    case StatusCode::kDeadlineExceeded:
      return AGENTRT_DEADLINE_EXCEEDED;
    case StatusCode::kNotFound:
      return AGENTRT_NOT_FOUND;
    case StatusCode::kAlreadyExists:
      return AGENTRT_ALREADY_EXISTS;
    case StatusCode::kPermissionDenied:
      return AGENTRT_PERMISSION_DENIED;
    case StatusCode::kResourceExhausted:
      return AGENTRT_RESOURCE_EXHAUSTED;
    case StatusCode::kFailedPrecondition:
      return AGENTRT_FAILED_PRECONDITION;
    case StatusCode::kAborted:
      return AGENTRT_ABORTED;
    case StatusCode::kOutOfRange:
      return AGENTRT_OUT_OF_RANGE;
    case StatusCode::kUnimplemented:
      return AGENTRT_UNIMPLEMENTED;
    case StatusCode::kInternal:
      return AGENTRT_INTERNAL;
    case StatusCode::kUnavailable:
      return AGENTRT_UNAVAILABLE;
    case StatusCode::kDataLoss:
      return AGENTRT_DATA_LOSS;
    case StatusCode::kUnauthenticated:
      return AGENTRT_UNAUTHENTICATED;
  }
  return AGENTRT_UNKNOWN;
}

int Fail(const Status& s) {
  g_last_error = s.message();
  return s.ok() ? AGENTRT_INTERNAL : CodeOf(s.code());
}

int Ok() {
  g_last_error.clear();
  return AGENTRT_OK;
}

char* CopyOut(const std::string& s) {
  char* p = static_cast<char*>(std::malloc(s.size() + 1));
  if (p == nullptr) throw std::bad_alloc();
  std::memcpy(p, s.data(), s.size());
  p[s.size()] = '\0';
  return p;
}

Status ParseJsonArg(const char* text, const char* what, nlohmann::json* out) {
  if (text == nullptr || *text == '\0') {
    *out = nlohmann::json();
    return Status::Ok();
  }
  *out = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (out->is_discarded()) return InvalidArgument(std::string(what) + " is not valid JSON");
  return Status::Ok();
}

const char* LastError() { return g_last_error.c_str(); }

}  // namespace agentrt::capi

extern "C" {

int agentrt_api_version(void) { return AGENTRT_C_API_VERSION; }

const char* agentrt_last_error(void) { return agentrt::capi::LastError(); }

const char* agentrt_code_name(int code) {
  static const char* const kNames[] = {"OK",
                                       "CANCELLED",
                                       "UNKNOWN",
                                       "INVALID_ARGUMENT",
                                       "DEADLINE_EXCEEDED",
                                       "NOT_FOUND",
                                       "ALREADY_EXISTS",
                                       "PERMISSION_DENIED",
                                       "RESOURCE_EXHAUSTED",
                                       "FAILED_PRECONDITION",
                                       "ABORTED",
                                       "OUT_OF_RANGE",
                                       "UNIMPLEMENTED",
                                       "INTERNAL",
                                       "UNAVAILABLE",
                                       "DATA_LOSS",
                                       "UNAUTHENTICATED"};
  return code >= 0 && code <= AGENTRT_UNAUTHENTICATED ? kNames[code] : "UNKNOWN";
}

void agentrt_free(void* p) { std::free(p); }

}  // extern "C"
