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

std::string ArrayTaskIncarnation(std::string_view job_id, int restart_count) {
  return "slurm-" + std::string(job_id) + "." + std::to_string(restart_count);
}

Result<std::string> LaunchIncarnation(const AgentEnv& env, const EnvLookup& lookup) {
  // An array task's launch has no controller; its id says which task it is.
  std::string array_launch;
  if (env.telemetry.empty()) {
    const std::optional<std::string> job = lookup("SLURM_JOB_ID");
    if (!job || job->empty()) return std::string();
    array_launch = ArrayTaskIncarnation(*job, env.restart_count);
  }
  static std::mutex mu;
  static std::map<std::string, std::string> read;  // checkpoint dir -> the id found first
  std::lock_guard<std::mutex> lock(mu);
  if (auto it = read.find(env.ckpt_dir); it != read.end()) return it->second;
  auto fence = ReadCheckpointFence(env.ckpt_dir);
  if (!fence.ok()) return fence.status().WithContext("checkpoint fence of agent " + env.agent);
  std::string id = fence->value_or(std::string());
  // An array task's own launch, also where a requeue has fenced it meanwhile
  // (then refused); none where no task fenced the directory.
  if (!array_launch.empty() && !id.empty()) id = std::move(array_launch);
  return read.emplace(env.ckpt_dir, std::move(id)).first->second;
}

}  // namespace agentrt
