#include "envs/params.h"

namespace agentrt {

Params::Params(const nlohmann::json& params, std::string owner)
    : params_(params), owner_(std::move(owner)) {}

void Params::Invalid(std::string_view key, std::string_view what) {
  errors_.push_back("parameter '" + std::string(key) + "' " + std::string(what));
}

Status Params::Finish() const {
  if (!params_.is_null() && !params_.is_object()) {
    return InvalidArgument(owner_ + ": parameters must be a mapping, got " + params_.dump());
  }
  if (!errors_.empty()) return InvalidArgument(owner_ + ": " + errors_.front());
  if (params_.is_object()) {
    for (const auto& [key, value] : params_.items()) {
      if (known_.count(key) != 0) continue;
      std::string known;
      for (const auto& k : known_) known += (known.empty() ? "" : ", ") + k;
      return InvalidArgument(owner_ + ": unknown parameter '" + key + "' (known: " + known + ")");
    }
  }
  return Status::Ok();
}

std::string Params::KeyOfError(const Status& error) {
  const std::string& m = error.message();
  for (const char* marker : {"unknown parameter '", "parameter '"}) {
    const size_t at = m.find(marker);
    if (at == std::string::npos) continue;
    const size_t start = at + std::string_view(marker).size();
    const size_t end = m.find('\'', start);
    if (end != std::string::npos) return m.substr(start, end - start);
  }
  return "";
}

}  // namespace agentrt
