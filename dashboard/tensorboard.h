// TensorBoard event files from a run's metrics (`agentctl export RUN_DIR
// --tensorboard DIR`): one folder per agent (TensorBoard's "run"), holding
// events.out.tfevents.<unix time>.<host>.agentrt, one Event per metrics line
// of rank 0 with every numeric metric as a scalar tagged by its name.
//
// The file is TFRecord framing (u64 length, u32 masked crc32c of the length,
// the record, u32 masked crc32c of the record; little-endian; mask: rotate
// right by 15, add 0xa282ead8) around Event messages
// (dashboard/proto/tensorboard_event.proto).
#pragma once

#include <string>
#include <vector>

#include "common/status.h"
#include "plan/records.h"

namespace agentrt {

struct TensorBoardExport {
  size_t agents = 0;
  size_t events = 0;
  size_t scalars = 0;
  std::vector<std::string> files;
};

// `rows`: a run's metrics.jsonl records in file order. Writes each agent's file
// atomically under `dir` (created).
Result<TensorBoardExport> WriteTensorBoard(const std::vector<MetricsRecord>& rows,
                                           const std::string& dir);

// The TFRecord checksum of `data`: crc32c, masked.
uint32_t TfRecordMaskedCrc(const void* data, size_t size);

}  // namespace agentrt
