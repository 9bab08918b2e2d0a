// Status codes, the thread's last error, strings handed out.
#include <cstdlib>
#include <string>

#include "capi/c_api_internal.h"

namespace agentrt::capi {
namespace {
thread_local std::string g_last_error;
}  // namespace

const char* LastError();

static_assert(static_cast<int>(StatusCode::kUnknown) == AGENTRT_UNKNOWN &&
                  static_cast<int>(StatusCode::kInvalidArgument) == AGENTRT_INVALID_ARGUMENT &&
                  static_cast<int>(StatusCode::kUnauthenticated) == AGENTRT_UNAUTHENTICATED &&
                  kLastStatusCode == AGENTRT_UNAUTHENTICATED,
              "StatusCode and enum agentrt_code share gRPC's numbering");

int CodeOf(StatusCode code) { return static_cast<int>(code); }

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
  // StatusCodeName's views are of string literals, so NUL-terminated.
  return agentrt::StatusCodeName(static_cast<agentrt::StatusCode>(code)).data();
}

void agentrt_free(void* p) { std::free(p); }

}  // extern "C"
