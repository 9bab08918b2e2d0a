#include "dashboard/tensorboard.h"

#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <map>

#include "common/crc32c.h"
#include "common/file_util.h"
#include "dashboard/proto/tensorboard_event.pb.h"

namespace agentrt {
namespace {

void PutLe(std::string& out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

// One TFRecord around `record`.
void AppendRecord(std::string& out, const std::string& record) {
  std::string length;
  PutLe(length, record.size(), 8);
  out += length;
  PutLe(out, TfRecordMaskedCrc(length.data(), length.size()), 4);
  out += record;
  PutLe(out, TfRecordMaskedCrc(record.data(), record.size()), 4);
}

std::string HostName() {
  char host[256] = {};
  if (::gethostname(host, sizeof host - 1) != 0) return "localhost";
  return host;
}

}  // namespace

uint32_t TfRecordMaskedCrc(const void* data, size_t size) {
  const uint32_t crc = Crc32c(data, size);
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

Result<TensorBoardExport> WriteTensorBoard(const std::vector<MetricsRecord>& rows,
                                           const std::string& dir) {
  std::map<std::string, std::string> files;  // agent -> file contents
  TensorBoardExport out;
  double first_time = 0;
  for (const MetricsRecord& row : rows) {
    if (row.rank != 0) continue;
    const std::string& agent = row.agent;
    if (agent.empty() || agent.find('/') != std::string::npos || agent.front() == '.') continue;
    const double time = row.time;
    if (first_time == 0) first_time = time;
    std::string& file = files[agent];
    if (file.empty()) {
      tensorboard::Event version;
      version.set_wall_time(time);
      version.set_file_version("brain.Event:2");
      AppendRecord(file, version.SerializeAsString());
    }
    tensorboard::Event event;
    event.set_wall_time(time);
    event.set_step(row.step);
    for (const auto& [name, value] : row.metrics.items()) {
      if (!value.is_number()) continue;
      tensorboard::Summary::Value* v = event.mutable_summary()->add_value();
      v->set_tag(name);
      v->set_simple_value(value.get<float>());
      ++out.scalars;
    }
    if (event.summary().value_size() == 0) continue;
    AppendRecord(file, event.SerializeAsString());
    ++out.events;
  }
  const std::string host = HostName();
  for (const auto& [agent, contents] : files) {
    const std::string folder = dir + "/" + agent;
    std::error_code ec;
    std::filesystem::create_directories(folder, ec);
    if (ec) return Internal("cannot create " + folder + ": " + ec.message());
    const std::string path = folder + "/events.out.tfevents." +
                             std::to_string(static_cast<int64_t>(first_time)) + "." + host +
                             ".agentrt";
    AGENTRT_RETURN_IF_ERROR(WriteFileAtomic(path, contents));
    out.files.push_back(path);
  }
  out.agents = files.size();
  return out;
}

}  // namespace agentrt
