// The payloads of a PackedEntries (bus.proto): each entry its length as a
// varint (protobuf's own coding: io::CodedOutputStream writes it,
// io::CodedInputStream reads it), then its bytes.
// The one writer and reader of that field: the client's async publish packs
// uniform batches with it (and unpacks one that stops being uniform), the
// broker and ValidatePackedEntries read them. Also the reader of a batch's
// answer (AnswerOf: acks, or the run stored first, as the broker answers
// packed entries).
// No allocation beyond the field's own growth.
#pragma once

#include <google/protobuf/io/coded_stream.h>

#include <algorithm>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "comms/proto/bus.pb.h"

namespace agentrt {

// Appends one entry to `p` (payloads and count).
inline void AppendPackedEntry(bus::v1::PackedEntries* p, std::string_view payload) {
  using google::protobuf::io::CodedOutputStream;
  uint8_t len[5];  // a varint of 32 bits
  const uint8_t* end =
      CodedOutputStream::WriteVarint32ToArray(static_cast<uint32_t>(payload.size()), len);
  std::string& out = *p->mutable_payloads();
  out.append(reinterpret_cast<const char*>(len), static_cast<size_t>(end - len));
  out.append(payload.data(), payload.size());
  p->set_count(p->count() + 1);
}

// Reads the entries of a payloads field in order.
class PackedEntryReader {
 public:
  explicit PackedEntryReader(std::string_view bytes)
      : bytes_(bytes),
        in_(reinterpret_cast<const uint8_t*>(bytes.data()),
            static_cast<int>(std::min<size_t>(bytes.size(), INT_MAX))) {}
  PackedEntryReader(const PackedEntryReader&) = delete;
  PackedEntryReader& operator=(const PackedEntryReader&) = delete;

  // The next entry's payload: false at the end, or at a malformed entry
  // (`malformed()` tells which; the reader then stays there).
  bool Next(std::string_view* payload) {
    if (remaining() == 0 || malformed_) return false;
    uint32_t len = 0;
    if (!in_.ReadVarint32(&len) || len > INT_MAX) return Malformed();
    const auto at = static_cast<size_t>(in_.CurrentPosition());
    if (!in_.Skip(static_cast<int>(len))) return Malformed();
    *payload = bytes_.substr(at, len);
    return true;
  }
  bool malformed() const { return malformed_; }
  // Bytes not read yet.
  size_t remaining() const { return bytes_.size() - static_cast<size_t>(in_.CurrentPosition()); }

 private:
  bool Malformed() {
    malformed_ = true;
    return false;
  }
  const std::string_view bytes_;
  google::protobuf::io::CodedInputStream in_;
  bool malformed_ = false;
};

// Removes the first `n` entries of `p` (those the broker answered): the
// sequences move on with them. False, `p` unchanged, if it has fewer or is
// malformed.
inline bool DropPackedEntries(bus::v1::PackedEntries* p, int n) {
  if (n < 0 || n > p->count()) return false;
  PackedEntryReader r(p->payloads());
  std::string_view skipped;
  for (int k = 0; k < n; ++k) {
    if (!r.Next(&skipped)) return false;
  }
  p->mutable_payloads()->erase(0, p->payloads().size() - r.remaining());
  p->set_count(p->count() - n);
  if (p->first_sequence() != 0)
    p->set_first_sequence(p->first_sequence() + static_cast<uint64_t>(n));
  return true;
}

// The answer to one entry of a PublishBatch (its offset; a duplicate's
// names the first), from the acks or the run of entries stored first at
// consecutive offsets (PublishBatchResponse.stored).
struct EntryAnswer {
  int64_t offset = -1;
  bool duplicate = false;
};
// How many entries `resp` answers.
inline int AnsweredEntries(const bus::v1::PublishBatchResponse& resp) {
  return resp.stored() + resp.acks_size();
}
inline EntryAnswer AnswerOf(const bus::v1::PublishBatchResponse& resp, int i) {
  if (i < resp.stored()) return {resp.first_offset() + i, false};
  const bus::v1::PublishResponse& a = resp.acks(i - resp.stored());
  return {a.offset(), a.duplicate()};
}

// A packed batch's entries as messages of the same request, in order (the
// batch is no longer uniform): `req` then carries messages only.
inline void UnpackEntries(bus::v1::PublishBatchRequest* req) {
  const bus::v1::PackedEntries& packed = req->packed();
  PackedEntryReader reader(packed.payloads());
  std::string_view payload;
  uint64_t sequence = packed.first_sequence();
  while (reader.Next(&payload)) {
    bus::v1::PublishRequest* m = req->add_messages();
    m->set_topic(packed.topic());
    m->set_payload(payload.data(), payload.size());
    m->set_content_type(packed.content_type());
    m->set_publisher_id(packed.publisher_id());
    m->set_sequence(sequence == 0 ? 0 : sequence++);
  }
  req->clear_packed();
}

}  // namespace agentrt
