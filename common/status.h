// Status and Result<T>: how agentrt reports errors across module and process
// boundaries. Exceptions are used only while parsing configuration at start-up.
//
// A message says what failed, where (agent, rank, file, port) and, when there
// is one, what to do about it.
#pragma once

#include <cassert>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

namespace agentrt {

// Numbered as gRPC's codes (and the C API's), so converting is a cast.
enum class StatusCode {
  kOk = 0,
  kCancelled = 1,
  kUnknown = 2,
  kInvalidArgument = 3,
  kDeadlineExceeded = 4,
  kNotFound = 5,
  kAlreadyExists = 6,
  kPermissionDenied = 7,
  kResourceExhausted = 8,
  kFailedPrecondition = 9,
  kAborted = 10,
  kOutOfRange = 11,
  kUnimplemented = 12,
  kInternal = 13,
  kUnavailable = 14,
  kDataLoss = 15,
  kUnauthenticated = 16,
};
inline constexpr int kLastStatusCode = 16;

// "INVALID_ARGUMENT"; "UNKNOWN" for a number outside the list. The view is of
// a string literal (NUL-terminated).
std::string_view StatusCodeName(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;  // OK
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status Ok() { return {}; }

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }

  // "INVALID_ARGUMENT: message" (or "OK").
  std::string ToString() const;

  // Returns a copy whose message is prefixed with `context: `.
  Status WithContext(std::string_view context) const;

  // Discards this status on purpose: the caller has nothing to do about a
  // failure (best-effort clean-up, an error already reported elsewhere). Say
  // why next to the call.
  void IgnoreError() const {}

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

inline Status InvalidArgument(std::string m) {
  return {StatusCode::kInvalidArgument, std::move(m)};
}
inline Status NotFound(std::string m) { return {StatusCode::kNotFound, std::move(m)}; }
inline Status FailedPrecondition(std::string m) {
  return {StatusCode::kFailedPrecondition, std::move(m)};
}
inline Status Internal(std::string m) { return {StatusCode::kInternal, std::move(m)}; }
inline Status Unavailable(std::string m) { return {StatusCode::kUnavailable, std::move(m)}; }
inline Status DeadlineExceeded(std::string m) {
  return {StatusCode::kDeadlineExceeded, std::move(m)};
}
inline Status DataLoss(std::string m) { return {StatusCode::kDataLoss, std::move(m)}; }
inline Status PermissionDenied(std::string m) {
  return {StatusCode::kPermissionDenied, std::move(m)};
}
inline Status ResourceExhausted(std::string m) {
  return {StatusCode::kResourceExhausted, std::move(m)};
}
inline Status Aborted(std::string m) { return {StatusCode::kAborted, std::move(m)}; }
inline Status AlreadyExists(std::string m) { return {StatusCode::kAlreadyExists, std::move(m)}; }

// Translates errno into a Status: "<what>: <strerror(err)>".
Status ErrnoStatus(int err, std::string_view what);

// A value or the Status that explains why there is none.
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}        // NOLINT(google-explicit-constructor)
  Result(Status status) : v_(std::move(status)) {  // NOLINT(google-explicit-constructor)
    assert(!std::get<Status>(v_).ok() && "Result built from an OK status");
  }

  bool ok() const { return std::holds_alternative<T>(v_); }
  const Status& status() const {
    static const Status kOk;
    return ok() ? kOk : std::get<Status>(v_);
  }
  T& value() & { return std::get<T>(v_); }
  const T& value() const& { return std::get<T>(v_); }
  T&& value() && { return std::get<T>(std::move(v_)); }
  // The value, or `fallback` when there is none.
  template <typename U>
  T value_or(U&& fallback) const& {
    return ok() ? value() : static_cast<T>(std::forward<U>(fallback));
  }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }

 private:
  std::variant<T, Status> v_;
};

}  // namespace agentrt

#define AGENTRT_CONCAT_IMPL(a, b) a##b
#define AGENTRT_CONCAT(a, b) AGENTRT_CONCAT_IMPL(a, b)

// Returns the Status from the enclosing function when `expr` is not OK.
#define AGENTRT_RETURN_IF_ERROR(expr)                  \
  do {                                                 \
    ::agentrt::Status _agentrt_status = (expr);        \
    if (!_agentrt_status.ok()) return _agentrt_status; \
  } while (false)

// `AGENTRT_ASSIGN_OR_RETURN(auto x, MakeX());` binds the value or returns the Status.
#define AGENTRT_ASSIGN_OR_RETURN(lhs, expr)                     \
  auto AGENTRT_CONCAT(_agentrt_result_, __LINE__) = (expr);     \
  if (!AGENTRT_CONCAT(_agentrt_result_, __LINE__).ok())         \
    return AGENTRT_CONCAT(_agentrt_result_, __LINE__).status(); \
  lhs = std::move(AGENTRT_CONCAT(_agentrt_result_, __LINE__)).value()
