#include "common/status.h"

#include <cstring>

namespace agentrt {

std::string_view StatusCodeName(StatusCode code) {
  static constexpr std::string_view kNames[kLastStatusCode + 1] = {
      "OK",
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
      "UNAUTHENTICATED",
  };
  const auto i = static_cast<int>(code);
  return i >= 0 && i <= kLastStatusCode ? kNames[i] : "UNKNOWN";
}

std::string Status::ToString() const {
  if (ok()) return "OK";
  std::string s(StatusCodeName(code_));
  s += ": ";
  s += message_;
  return s;
}

Status Status::WithContext(std::string_view context) const {
  if (ok()) return *this;
  std::string m(context);
  m += ": ";
  m += message_;
  return {code_, std::move(m)};
}

Status ErrnoStatus(int err, std::string_view what) {
  std::string m(what);
  m += ": ";
  char buf[256];
  m += ::strerror_r(err, buf, sizeof buf);  // thread-safe, unlike strerror (GNU variant)
  return {err == ENOENT ? StatusCode::kNotFound : StatusCode::kInternal, std::move(m)};
}

}  // namespace agentrt
