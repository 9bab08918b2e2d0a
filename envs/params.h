// agentrt::Params — reads named, typed settings with defaults out of a JSON
// object (a plan's `args`, or an env's parameters), and refuses names it was
// never asked for, so a typo fails at start-up instead of being ignored.
//
//   Params p(args, "env pursuit");
//   int size = p.Get("size", 8);
//   float lr = p.Get("lr", 3e-4f);
//   AGENTRT_RETURN_IF_ERROR(p.Finish());   // type errors and unknown keys
//
// Errors name the owner and key: "env pursuit: parameter 'size' must be an
// integer, got \"big\"", "env pursuit: unknown parameter 'sise' (known: ...)".
#pragma once

#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "common/status.h"

namespace agentrt {

// A settings struct declared once by an X-macro list of X(type, name, default_value, doc):
// LIST(AGENTRT_PARAM_FIELD) declares the members with their defaults, and
// LIST(AGENTRT_PARAM_READ) reads each from the Params `p` into the struct `out`.
#define AGENTRT_PARAM_FIELD(type, name, default_value, doc) type name = default_value;
#define AGENTRT_PARAM_READ(type, name, default_value, doc) out.name = p.Get(#name, out.name);

class Params {
 public:
  // `params` may be null (no settings) or an object; `owner` prefixes messages.
  Params(const nlohmann::json& params, std::string owner);

  // The value of `key`, or `fallback` when absent. On a type mismatch the
  // fallback is returned and Finish() reports the error.
  template <typename T>
  T Get(std::string_view key, T fallback) {
    known_.insert(std::string(key));
    if (!params_.is_object()) return fallback;
    auto it = params_.find(key);
    if (it == params_.end() || it->is_null()) return fallback;
    if constexpr (std::is_same_v<T, bool>) {
      if (it->is_boolean()) return it->template get<bool>();
      return Fail(key, "a boolean", *it, fallback);
    } else if constexpr (std::is_integral_v<T>) {
      if (it->is_number_integer()) return it->template get<T>();
      if (it->is_number_float() && it->template get<double>() == static_cast<double>(static_cast<T>(
                                                                     it->template get<double>()))) {
        return static_cast<T>(it->template get<double>());  // 1e5 is an integer too
      }
      return Fail(key, "an integer", *it, fallback);
    } else if constexpr (std::is_floating_point_v<T>) {
      if (it->is_number()) return it->template get<T>();
      return Fail(key, "a number", *it, fallback);
    } else if constexpr (std::is_same_v<T, std::string>) {
      if (it->is_string()) return it->template get<std::string>();
      return Fail(key, "a string", *it, fallback);
    } else {
      static_assert(std::is_same_v<T, nlohmann::json>, "unsupported parameter type");
      return *it;
    }
  }
  std::string Get(std::string_view key, const char* fallback) {
    return Get<std::string>(key, std::string(fallback));
  }

  // Marks `key` as known without reading it (it is consumed elsewhere).
  void Allow(std::string_view key) { known_.insert(std::string(key)); }

  // Records a range error found by the caller: "owner: parameter 'key' <what>".
  void Invalid(std::string_view key, std::string_view what);

  // OK, or the first error: a type mismatch, a caller-reported range error, or
  // an unknown key (listing the known ones).
  Status Finish() const;

  // The key an error of Finish() is about ("" when it is about no one key), so
  // a caller holding the source (agentctl validate) can point at its line.
  static std::string KeyOfError(const Status& error);

 private:
  template <typename T>
  T Fail(std::string_view key, std::string_view expected, const nlohmann::json& got, T fallback) {
    errors_.push_back("parameter '" + std::string(key) + "' must be " + std::string(expected) +
                      ", got " + got.dump());
    return fallback;
  }

  const nlohmann::json& params_;
  std::string owner_;
  std::set<std::string, std::less<>> known_;
  std::vector<std::string> errors_;
};

}  // namespace agentrt
