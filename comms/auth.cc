#include "comms/auth.h"

#include <fcntl.h>
#include <fnmatch.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

namespace agentrt {
namespace {

bool GlobMatch(const std::string& pattern, std::string_view name) {
  if (pattern.find('*') == std::string::npos) return pattern == name;
  return fnmatch(pattern.c_str(), std::string(name).c_str(), 0) == 0;
}

bool AnyMatch(const std::vector<std::string>& patterns, std::string_view name) {
  for (const auto& p : patterns) {
    if (GlobMatch(p, name)) return true;
  }
  return false;
}

// Writes `data` to `path` with mode 0600 through a temp file and rename, so a
// reader never sees a partial file.
Status WritePrivateFileAtomically(const std::string& path, std::string_view data) {
  std::string tmp = path + ".tmp." + std::to_string(::getpid());
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return ErrnoStatus(errno, "open " + tmp);
  size_t done = 0;
  while (done < data.size()) {
    ssize_t n = ::write(fd, data.data() + done, data.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      Status s = ErrnoStatus(errno, "write " + tmp);
      ::close(fd);
      ::unlink(tmp.c_str());
      return s;
    }
    done += static_cast<size_t>(n);
  }
  // The umask may have narrowed the mode further; make it exactly 0600.
  if (::fchmod(fd, 0600) != 0 || ::fsync(fd) != 0) {
    Status s = ErrnoStatus(errno, "fchmod/fsync " + tmp);
    ::close(fd);
    ::unlink(tmp.c_str());
    return s;
  }
  ::close(fd);
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    Status s = ErrnoStatus(errno, "rename " + tmp + " to " + path);
    ::unlink(tmp.c_str());
    return s;
  }
  return Status::Ok();
}

Result<std::string> ReadPrivateFile(const std::string& path, std::string_view what) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoStatus(errno, std::string("open ") + std::string(what) + " " + path);
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    Status s = ErrnoStatus(errno, "stat " + path);
    ::close(fd);
    return s;
  }
  if ((st.st_mode & 077) != 0) {
    ::close(fd);
    char mode[8];
    std::snprintf(mode, sizeof mode, "%04o", static_cast<unsigned>(st.st_mode & 07777));
    return PermissionDenied(std::string(what) + " " + path + " has mode " + mode +
                            "; it must be readable by its owner only (chmod 600)");
  }
  std::string data;
  char buf[4096];
  for (;;) {
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0) {
      if (errno == EINTR) continue;
      Status s = ErrnoStatus(errno, "read " + path);
      ::close(fd);
      return s;
    }
    if (n == 0) break;
    data.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  return data;
}

}  // namespace

std::string DeriveAgentToken(std::string_view secret, std::string_view agent) {
  unsigned char mac[EVP_MAX_MD_SIZE];
  unsigned int mac_len = 0;
  HMAC(EVP_sha256(), secret.data(), static_cast<int>(secret.size()),
       reinterpret_cast<const unsigned char*>(agent.data()), agent.size(), mac, &mac_len);
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  out.reserve(mac_len * 2);
  for (unsigned int i = 0; i < mac_len; ++i) {
    out.push_back(kHex[mac[i] >> 4]);
    out.push_back(kHex[mac[i] & 0xf]);
  }
  return out;
}

bool TokenMatches(std::string_view presented, std::string_view expected) {
  if (presented.size() != expected.size()) return false;
  return CRYPTO_memcmp(presented.data(), expected.data(), expected.size()) == 0;
}

Result<std::string> GenerateSecret(size_t bytes) {
  std::string s(bytes, '\0');
  if (RAND_bytes(reinterpret_cast<unsigned char*>(s.data()), static_cast<int>(bytes)) != 1) {
    return Internal("RAND_bytes failed to generate the bus secret");
  }
  return s;
}

Status WriteSecretFile(const std::string& path, std::string_view secret) {
  if (secret.empty()) return InvalidArgument("refusing to write an empty bus secret to " + path);
  return WritePrivateFileAtomically(path, secret);
}

Result<std::string> ReadSecretFile(const std::string& path) {
  AGENTRT_ASSIGN_OR_RETURN(std::string data, ReadPrivateFile(path, "bus secret file"));
  if (data.empty()) return InvalidArgument("bus secret file " + path + " is empty");
  return data;
}

Status WriteTokenFile(const std::string& path, std::string_view agent, std::string_view token) {
  if (agent.empty() || token.empty()) {
    return InvalidArgument("token file " + path + ": agent and token must not be empty");
  }
  nlohmann::json j = {{"agent", std::string(agent)}, {"token", std::string(token)}};
  return WritePrivateFileAtomically(path, j.dump() + "\n");
}

Result<Credential> ReadTokenFile(const std::string& path) {
  AGENTRT_ASSIGN_OR_RETURN(std::string data, ReadPrivateFile(path, "bus token file"));
  nlohmann::json j = nlohmann::json::parse(data, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return InvalidArgument("bus token file " + path + " is not a JSON object {\"agent\", \"token\"}");
  }
  Credential c;
  auto agent = j.find("agent");
  auto token = j.find("token");
  if (agent == j.end() || !agent->is_string() || agent->get<std::string>().empty()) {
    return InvalidArgument("bus token file " + path + ": missing string field \"agent\"");
  }
  if (token == j.end() || !token->is_string() || token->get<std::string>().empty()) {
    return InvalidArgument("bus token file " + path + ": missing string field \"token\"");
  }
  c.agent = agent->get<std::string>();
  c.token = token->get<std::string>();
  return c;
}

bool BusAcl::IsAgent(std::string_view agent) const {
  if (open) return true;
  for (const auto& a : agents) {
    if (a == agent) return true;
  }
  return false;
}

bool BusAcl::MayPublish(std::string_view agent, std::string_view topic) const {
  if (open) return true;
  for (const auto& c : channels) {
    if (GlobMatch(c.topic, topic) && AnyMatch(c.publishers, agent)) return true;
  }
  return false;
}

bool BusAcl::MaySubscribe(std::string_view agent, std::string_view topic) const {
  if (open) return true;
  for (const auto& c : channels) {
    if (GlobMatch(c.topic, topic) && AnyMatch(c.subscribers, agent)) return true;
  }
  return false;
}

Result<BusAcl> ParseAclFromPlanJson(std::string_view json, std::string_view source_name) {
  const std::string src(source_name);
  nlohmann::json j = nlohmann::json::parse(json, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return InvalidArgument(src + ": not valid JSON");
  if (!j.is_object()) return InvalidArgument(src + ": the plan must be a JSON object");
  BusAcl acl;
  auto agents = j.find("agents");
  if (agents == j.end() || !agents->is_array()) {
    return InvalidArgument(src + ": missing array \"agents\"");
  }
  for (size_t i = 0; i < agents->size(); ++i) {
    const auto& a = (*agents)[i];
    auto name = a.is_object() ? a.find("name") : a.end();
    if (!a.is_object() || name == a.end() || !name->is_string() || name->get<std::string>().empty()) {
      return InvalidArgument(src + ": agents[" + std::to_string(i) + "] has no string \"name\"");
    }
    acl.agents.push_back(name->get<std::string>());
  }
  auto channels = j.find("channels");
  if (channels != j.end() && !channels->is_null()) {
    if (!channels->is_array()) return InvalidArgument(src + ": \"channels\" must be an array");
    for (size_t i = 0; i < channels->size(); ++i) {
      const auto& c = (*channels)[i];
      const std::string where = src + ": channels[" + std::to_string(i) + "]";
      if (!c.is_object()) return InvalidArgument(where + " must be an object");
      BusChannel ch;
      auto topic = c.find("topic");
      if (topic == c.end() || !topic->is_string() || topic->get<std::string>().empty()) {
        return InvalidArgument(where + " has no string \"topic\"");
      }
      ch.topic = topic->get<std::string>();
      for (const char* field : {"publishers", "subscribers"}) {
        auto list = c.find(field);
        std::vector<std::string>& out = std::string(field) == "publishers" ? ch.publishers : ch.subscribers;
        if (list == c.end() || list->is_null()) continue;
        if (!list->is_array()) return InvalidArgument(where + "." + field + " must be an array of agent names");
        for (size_t k = 0; k < list->size(); ++k) {
          if (!(*list)[k].is_string()) {
            return InvalidArgument(where + "." + field + "[" + std::to_string(k) + "] must be a string");
          }
          out.push_back((*list)[k].get<std::string>());
        }
      }
      acl.channels.push_back(std::move(ch));
    }
  }
  return acl;
}

Result<BusAcl> LoadAclFromPlanFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return NotFound("cannot read plan file " + path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ParseAclFromPlanJson(ss.str(), path);
}

}  // namespace agentrt
