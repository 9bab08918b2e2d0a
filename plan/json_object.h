// The start every simdjson reader of agentrt shares (a metrics.jsonl line in
// plan/records.cc, a telemetry message in comms/telemetry.cc): one JSON
// object parsed by a parser and a padded buffer the reader keeps, so a
// reader of millions of lines allocates nothing once both are large enough.
// For .cc files that link
// simdjson (a private dependency: no public header includes this one).
#pragma once

#include <simdjson.h>

#include <string>
#include <string_view>

namespace agentrt {

// `text` parsed into *out (which views `parser`'s memory until the next
// parse); false when it is not JSON or not an object. `padded` is the copy
// simdjson reads, with SIMDJSON_PADDING bytes of room after it.
inline bool ParseJsonObject(simdjson::dom::parser& parser, std::string& padded,
                            std::string_view text, simdjson::dom::object* out) {
  if (padded.capacity() < text.size() + simdjson::SIMDJSON_PADDING)
    padded.reserve(text.size() + simdjson::SIMDJSON_PADDING);
  padded.assign(text);
  simdjson::dom::element doc;
  return parser.parse(padded.data(), padded.size(), /*realloc_if_needed=*/false).get(doc) ==
             simdjson::SUCCESS &&
         doc.get_object().get(*out) == simdjson::SUCCESS;
}

}  // namespace agentrt
