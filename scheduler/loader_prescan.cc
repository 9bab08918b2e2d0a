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

namespace {

// One pass over a document, O(1) memory besides the indentation stack:
// control bytes, nesting depth, anchors and aliases, before yaml-cpp sees it.
class Prescanner {
 public:
  Prescanner(std::string_view text, std::string_view source, const LoadLimits& limits)
      : text_(text), source_(source), limits_(limits) {}

  Status Run() {
    for (size_t i = 0; i < text_.size(); ++i) {
      const unsigned char c = static_cast<unsigned char>(text_[i]);
      if (c < 0x20 && c != '\n' && c != '\r' && c != '\t') {
        return Fail(i,
                    fmt::format("byte 0x{:02x} is not allowed in YAML; is this a text file?", c));
      }
      if (c == '\n') {
        ++line_;
        line_start_ = i + 1;
        at_line_start_ = true;
        continue;
      }
      if (quote_ == kSingle) {
        if (c == '\'') quote_ = kPlain;  // '' (escaped quote) re-enters on the next char
        continue;
      }
      if (quote_ == kDouble) {
        if (c == '\\') {
          ++i;
        } else if (c == '"') {
          quote_ = kPlain;
        }
        continue;
      }
      if (at_line_start_ && flow_depth_ == 0) {
        AGENTRT_ASSIGN_OR_RETURN(i, LineStart(i));
        continue;
      }
      at_line_start_ = false;
      if (c == ']' || c == '}') {
        flow_depth_ = std::max(0, flow_depth_ - 1);
        continue;
      }
      if (IsTokenStart(text_, i)) AGENTRT_RETURN_IF_ERROR(Token(i, c));
    }
    return Status::Ok();
  }

 private:
  Status Fail(size_t i, std::string_view what) const {
    return InvalidArgument(fmt::format(
        "{}: {}", Location(source_, line_, static_cast<int>(i - line_start_) + 1), what));
  }

  Status DepthCheck(size_t i) const {
    const int depth = static_cast<int>(indents_.size()) + flow_depth_;
    if (depth > limits_.max_depth) {
      return Fail(i, fmt::format("nesting deeper than {} levels; a config never needs that",
                                 limits_.max_depth));
    }
    return Status::Ok();
  }

  // Block structure at the start of a line: the indentation column, plus one
  // level per compact `- ` sequence entry on the same line. Where the scan
  // goes on (the last byte it took).
  Result<size_t> LineStart(size_t i) {
    size_t k = i;
    while (k < text_.size() && text_[k] == ' ') ++k;
    at_line_start_ = false;
    if (k >= text_.size() || text_[k] == '\n' || text_[k] == '\r' || text_[k] == '#') {
      return k - 1;  // blank or comment-only line
    }
    size_t column = k - line_start_;
    while (!indents_.empty() && indents_.back() > column) indents_.pop_back();
    if (indents_.empty() || indents_.back() < column) indents_.push_back(column);
    while (k + 1 < text_.size() && text_[k] == '-' &&
           (text_[k + 1] == ' ' || text_[k + 1] == '\t')) {
      k += 2;
      while (k < text_.size() && text_[k] == ' ') ++k;
      indents_.push_back(k - line_start_);
    }
    AGENTRT_RETURN_IF_ERROR(DepthCheck(i));
    return k - 1;
  }

  // A token that starts at `i`: a comment, a quote, a flow collection, an
  // anchor or an alias.
  Status Token(size_t& i, unsigned char c) {
    switch (c) {
      case '#':
        while (i + 1 < text_.size() && text_[i + 1] != '\n') ++i;
        break;
      case '\'':
        quote_ = kSingle;
        break;
      case '"':
        quote_ = kDouble;
        break;
      case '[':
      case '{':
        ++flow_depth_;
        return DepthCheck(i);
      case '&':
        if (++anchors_ > limits_.max_anchors) {
          return Fail(i, fmt::format("more than {} anchors (&); refusing a possible alias bomb",
                                     limits_.max_anchors));
        }
        break;
      case '*':
        if (++aliases_ > limits_.max_aliases) {
          return Fail(i, fmt::format("more than {} aliases (*); refusing a possible alias bomb",
                                     limits_.max_aliases));
        }
        break;
      default:
        break;
    }
    return Status::Ok();
  }

  const std::string_view text_;
  const std::string_view source_;
  const LoadLimits& limits_;
  int line_ = 1;
  size_t line_start_ = 0;
  int flow_depth_ = 0;
  int anchors_ = 0;
  int aliases_ = 0;
  std::vector<size_t> indents_;  // block indentation stack
  enum { kPlain, kSingle, kDouble } quote_ = kPlain;
  bool at_line_start_ = true;
};

}  // namespace

Status PrescanYaml(std::string_view text, std::string_view source, const LoadLimits& limits) {
  if (text.size() > limits.max_bytes) {
    return InvalidArgument(fmt::format("{}: file is {} bytes; the limit for a config is {} bytes",
                                       source, text.size(), limits.max_bytes));
  }
  return Prescanner(text, source, limits).Run();
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
