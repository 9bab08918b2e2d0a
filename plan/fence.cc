#include "plan/fence.h"

#include <cerrno>
#include <map>
#include <mutex>

#include "common/file_util.h"

namespace agentrt {

Status WriteCheckpointFence(const std::string& checkpoint_dir, const std::string& incarnation) {
  return WriteFileAtomic(checkpoint_dir + "/" + kFenceFile, incarnation + "\n", {.mode = 0600})
      .WithContext("cannot fence " + checkpoint_dir);
}

Result<std::optional<std::string>> ReadCheckpointFence(const std::string& checkpoint_dir) {
  auto text = ReadWholeFile(checkpoint_dir + "/" + kFenceFile, 4096);
  if (!text.ok()) {
    if (text.status().code() == StatusCode::kNotFound) return std::optional<std::string>();
    return text.status();
  }
  std::string id = *text;
  while (!id.empty() && (id.back() == '\n' || id.back() == '\r')) id.pop_back();
  return std::optional<std::string>(id);
}

Status CheckCheckpointFence(const std::string& checkpoint_dir, const std::string& incarnation) {
  if (incarnation.empty()) return Status::Ok();
  AGENTRT_ASSIGN_OR_RETURN(const std::optional<std::string> fence,
                           ReadCheckpointFence(checkpoint_dir));
  if (!fence || *fence == incarnation) return Status::Ok();
  return FailedPrecondition("fenced: incarnation " + incarnation + " may no longer write to " +
                            checkpoint_dir + "; a newer one (" + *fence +
                            ") has been launched in its place");
}

Result<std::string> LaunchIncarnation(const AgentEnv& env) {
  if (env.telemetry.empty()) return std::string();
  static std::mutex mu;
  static std::map<std::string, std::string> read;  // checkpoint dir -> the id found first
  std::lock_guard<std::mutex> lock(mu);
  if (auto it = read.find(env.ckpt_dir); it != read.end()) return it->second;
  auto fence = ReadCheckpointFence(env.ckpt_dir);
  if (!fence.ok()) return fence.status().WithContext("checkpoint fence of agent " + env.agent);
  return read.emplace(env.ckpt_dir, fence->value_or(std::string())).first->second;
}

}  // namespace agentrt
