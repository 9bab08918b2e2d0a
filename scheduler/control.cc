#include "scheduler/control.h"

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "common/file_util.h"

namespace agentrt {
Status WriteControlRequest(const RunDir& dir, const ControlRequest& r) {
  if (r.action != "stop" && r.action != "restart")
    return InvalidArgument("unknown control action '" + r.action + "' (stop or restart)");
  if (r.action == "restart" && r.agent.empty())
    return InvalidArgument("a restart request names its agent");
  std::error_code ec;
  std::filesystem::create_directories(dir.ControlDir(), ec);
  if (ec) return Internal("cannot create " + dir.ControlDir() + ": " + ec.message());
  const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                      std::chrono::system_clock::now().time_since_epoch())
                      .count();
  const nlohmann::json j = {
      {"action", r.action}, {"agent", r.agent}, {"by", r.by}, {"time", r.time}};
  return WriteFileAtomic(dir.ControlDir() + "/" + std::to_string(ns) + "-" + r.action + ".json",
                         j.dump() + "\n", {.mode = 0600, .sync_dir = false});
}

std::vector<ControlRequest> TakeControlRequests(const RunDir& dir,
                                                std::vector<std::string>* refused) {
  std::vector<std::string> names;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir.ControlDir(), ec)) {
    const std::string name = e.path().filename().string();
    // A writer's temporary (name.<pid>.tmp) is not a request yet.
    if (name.size() > 5 && name.compare(name.size() - 5, 5, ".json") == 0) names.push_back(name);
  }
  std::sort(names.begin(), names.end());  // the time prefix: oldest first
  std::vector<ControlRequest> out;
  for (const std::string& name : names) {
    const std::string path = dir.ControlDir() + "/" + name;
    Result<std::string> text = ReadWholeFile(path, 1 << 16);
    std::filesystem::remove(path, ec);
    if (!text.ok()) continue;  // taken by another reader
    const nlohmann::json j = nlohmann::json::parse(*text, nullptr, /*allow_exceptions=*/false);
    if (!j.is_object() || !j.contains("action") || !j["action"].is_string()) {
      if (refused != nullptr) refused->push_back(path + ": not a control request");
      continue;
    }
    ControlRequest r;
    r.action = j["action"].get<std::string>();
    r.agent = j.value("agent", "");
    r.by = j.value("by", "");
    r.time = j.value("time", 0.0);
    r.file = path;
    out.push_back(std::move(r));
  }
  return out;
}

}  // namespace agentrt
