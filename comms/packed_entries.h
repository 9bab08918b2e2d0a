// The payloads of a PackedEntries (bus.proto): each entry its length as a
// base-128 varint (at most 5 bytes, a value below 2^32), then its bytes.
// The one writer and reader of that field: the client's async publish packs
// uniform batches with it (and unpacks one that stops being uniform), the
// broker and ValidatePackedEntries read them. Also the reader of a batch's
// answer (AnswerOf: acks, or the run stored first, as the broker answers
// packed entries).
// No allocation beyond the field's own growth.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "comms/proto/bus.pb.h"

namespace agentrt {

// Appends one entry to `p` (payloads and count).
inline void AppendPackedEntry(bus::v1::PackedEntries* p, std::string_view payload) {
  std::string& out = *p->mutable_payloads();
  char len[5];
  size_t n = 0;
  uint64_t v = payload.size();
  do {
    const auto byte = static_cast<unsigned char>(v & 0x7f);
    v >>= 7;
    len[n++] = static_cast<char>(v != 0 ? (byte | 0x80) : byte);
  } while (v != 0 && n < sizeof(len));
  out.append(len, n);
  out.append(payload.data(), payload.size());
  p->set_count(p->count() + 1);
}

// Reads the entries of a payloads field in order.
class PackedEntryReader {
 public:
  explicit PackedEntryReader(std::string_view bytes) : rest_(bytes) {}

  // The next entry's payload: false at the end, or at a malformed entry
  // (`malformed()` tells which; the reader then stays there).
  bool Next(std::string_view* payload) {
    if (rest_.empty() || malformed_) return false;
    uint64_t len = 0;
    size_t i = 0;
    for (;; ++i) {
      if (i == 5 || i == rest_.size()) return Malformed();
      const auto byte = static_cast<unsigned char>(rest_[i]);
      len |= static_cast<uint64_t>(byte & 0x7f) << (7 * i);
      if ((byte & 0x80) == 0) break;
    }
    if (len > UINT32_MAX || len > rest_.size() - i - 1) return Malformed();
    *payload = rest_.substr(i + 1, len);
    rest_.remove_prefix(i + 1 + len);
    return true;
  }
  bool malformed() const { return malformed_; }
  // Bytes not read yet.
  size_t remaining() const { return rest_.size(); }

 private:
  bool Malformed() {
    malformed_ = true;
    return false;
  }
  std::string_view rest_;
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
