// The loader's pre-scan of a YAML document (PrescanYaml) and its spelling
// hints (ClosestMatch).
#include "scheduler/loader_internal.h"

namespace agentrt {

using namespace loader_internal;  // NOLINT(google-build-using-namespace): its own insides

namespace {

// ---------------------------------------------------------------------------
// The pre-scan: one pass, O(1) memory besides the indentation stack.

bool IsTokenStart(std::string_view text, size_t i) {
  if (i == 0) return true;
  char p = text[i - 1];
  return p == ' ' || p == '\t' || p == '\n' || p == '\r' || p == '[' || p == '{' || p == ',';
}

}  // namespace

Status PrescanYaml(std::string_view text, std::string_view source, const LoadLimits& limits) {
  if (text.size() > limits.max_bytes) {
    return InvalidArgument(fmt::format("{}: file is {} bytes; the limit for a config is {} bytes",
                                       source, text.size(), limits.max_bytes));
  }
  int line = 1;
  size_t line_start = 0;
  int flow_depth = 0;
  int anchors = 0;
  int aliases = 0;
  std::vector<size_t> indents;  // block indentation stack
  enum { kPlain, kSingle, kDouble } quote = kPlain;
  bool at_line_start = true;
  auto fail = [&](size_t i, std::string_view what) {
    return InvalidArgument(
        fmt::format("{}: {}", Location(source, line, static_cast<int>(i - line_start) + 1), what));
  };
  auto depth_check = [&](size_t i) -> Status {
    const int depth = static_cast<int>(indents.size()) + flow_depth;
    if (depth > limits.max_depth) {
      return fail(i, fmt::format("nesting deeper than {} levels; a config never needs that",
                                 limits.max_depth));
    }
    return Status::Ok();
  };
  for (size_t i = 0; i < text.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
    if (c < 0x20 && c != '\n' && c != '\r' && c != '\t') {
      return fail(i, fmt::format("byte 0x{:02x} is not allowed in YAML; is this a text file?", c));
    }
    if (c == '\n') {
      ++line;
      line_start = i + 1;
      at_line_start = true;
      continue;
    }
    if (quote == kSingle) {
      if (c == '\'') quote = kPlain;  // '' (escaped quote) re-enters on the next char
      continue;
    }
    if (quote == kDouble) {
      if (c == '\\') {
        ++i;
      } else if (c == '"') {
        quote = kPlain;
      }
      continue;
    }
    if (at_line_start && flow_depth == 0) {
      // Block structure: the indentation column, plus one level per compact
      // `- ` sequence entry on the same line.
      size_t k = i;
      while (k < text.size() && text[k] == ' ') ++k;
      if (k >= text.size() || text[k] == '\n' || text[k] == '\r' || text[k] == '#') {
        at_line_start = false;
        i = k - 1;
        continue;  // blank or comment-only line
      }
      size_t column = k - line_start;
      while (!indents.empty() && indents.back() > column) indents.pop_back();
      if (indents.empty() || indents.back() < column) indents.push_back(column);
      while (k + 1 < text.size() && text[k] == '-' && (text[k + 1] == ' ' || text[k + 1] == '\t')) {
        k += 2;
        while (k < text.size() && text[k] == ' ') ++k;
        indents.push_back(k - line_start);
      }
      AGENTRT_RETURN_IF_ERROR(depth_check(i));
      at_line_start = false;
      i = k - 1;
      continue;
    }
    at_line_start = false;
    if (c == ']' || c == '}') {
      flow_depth = std::max(0, flow_depth - 1);
      continue;
    }
    if (!IsTokenStart(text, i)) continue;
    switch (c) {
      case '#':
        while (i + 1 < text.size() && text[i + 1] != '\n') ++i;
        break;
      case '\'':
        quote = kSingle;
        break;
      case '"':
        quote = kDouble;
        break;
      case '[':
      case '{':
        ++flow_depth;
        AGENTRT_RETURN_IF_ERROR(depth_check(i));
        break;
      case '&':
        if (++anchors > limits.max_anchors) {
          return fail(i, fmt::format("more than {} anchors (&); refusing a possible alias bomb",
                                     limits.max_anchors));
        }
        break;
      case '*':
        if (++aliases > limits.max_aliases) {
          return fail(i, fmt::format("more than {} aliases (*); refusing a possible alias bomb",
                                     limits.max_aliases));
        }
        break;
      default:
        break;
    }
  }
  return Status::Ok();
}

namespace {

// Levenshtein distance, bounded to short keys.
size_t EditDistance(std::string_view a, std::string_view b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t sub = prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1);
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, sub});
    }
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

}  // namespace

std::string ClosestMatch(std::string_view word, const std::vector<std::string>& candidates) {
  std::string best;
  size_t best_distance = std::max<size_t>(2, word.size() / 3) + 1;
  for (const std::string& candidate : candidates) {
    size_t d = EditDistance(word, candidate);
    if (d < best_distance) {
      best_distance = d;
      best = candidate;
    }
  }
  return best;
}

}  // namespace agentrt
