#include "scheduler/hostlist.h"

#include <fmt/format.h>

#include <cctype>
#include <charconv>
#include <map>

namespace agentrt {
namespace {

// One piece of a host pattern: either literal text or a bracket group.
struct Part {
  std::string literal;
  std::vector<std::string> choices;  // expanded bracket contents when not literal
  bool is_group = false;
};

bool IsDigits(std::string_view s) {
  if (s.empty()) return false;
  for (char c : s) {
    if (!std::isdigit(static_cast<unsigned char>(c))) return false;
  }
  return true;
}

Status Malformed(std::string_view expr, size_t offset, std::string_view what) {
  return InvalidArgument(
      fmt::format("malformed hostlist '{}' at character {}: {}", expr, offset + 1, what));
}

// Expands the inside of one bracket group: `01-04,07`.
Status ExpandGroup(std::string_view expr, size_t offset, std::string_view body,
                   std::vector<std::string>& out) {
  if (body.empty()) return Malformed(expr, offset, "empty []");
  size_t start = 0;
  while (start <= body.size()) {
    size_t comma = body.find(',', start);
    if (comma == std::string_view::npos) comma = body.size();
    std::string_view item = body.substr(start, comma - start);
    size_t dash = item.find('-');
    std::string_view lo = item.substr(0, dash);
    std::string_view hi = dash == std::string_view::npos ? lo : item.substr(dash + 1);
    if (!IsDigits(lo) || !IsDigits(hi) || lo.size() > 9 || hi.size() > 9) {
      return Malformed(
          expr, offset + 1 + start,
          fmt::format("expected a number or range like 01-04 inside [], got '{}'", item));
    }
    unsigned long a = 0, b = 0;
    std::from_chars(lo.data(), lo.data() + lo.size(), a);
    std::from_chars(hi.data(), hi.data() + hi.size(), b);
    if (b < a)
      return Malformed(expr, offset + 1 + start, fmt::format("range {} runs backwards", item));
    if (out.size() + (b - a + 1) > kMaxHostlistNames) {
      return Malformed(expr, offset,
                       fmt::format("expands to more than {} names", kMaxHostlistNames));
    }
    const int width = lo.size() > 1 && lo[0] == '0' ? static_cast<int>(lo.size()) : 0;
    for (unsigned long v = a; v <= b; ++v) out.push_back(fmt::format("{:0{}}", v, width));
    start = comma + 1;
  }
  return Status::Ok();
}

bool IsHostChar(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.';
}

}  // namespace

Result<std::vector<std::string>> ExpandHostlist(std::string_view expr) {
  std::vector<std::string> names;
  if (expr.empty()) return Malformed(expr, 0, "empty");
  size_t i = 0;
  while (i < expr.size()) {
    // One host pattern runs to the next comma outside brackets.
    std::vector<Part> parts;
    const size_t pattern_start = i;
    while (i < expr.size() && expr[i] != ',') {
      if (expr[i] == '[') {
        size_t close = expr.find(']', i);
        if (close == std::string_view::npos) return Malformed(expr, i, "'[' without ']'");
        if (expr.substr(i + 1, close - i - 1).find('[') != std::string_view::npos) {
          return Malformed(expr, i, "nested '['");
        }
        Part part;
        part.is_group = true;
        AGENTRT_RETURN_IF_ERROR(
            ExpandGroup(expr, i, expr.substr(i + 1, close - i - 1), part.choices));
        parts.push_back(std::move(part));
        i = close + 1;
      } else if (expr[i] == ']') {
        return Malformed(expr, i, "']' without '['");
      } else if (IsHostChar(expr[i])) {
        if (parts.empty() || parts.back().is_group) parts.emplace_back();
        parts.back().literal += expr[i];
        ++i;
      } else {
        return Malformed(expr, i, fmt::format("unexpected character '{}'", expr[i]));
      }
    }
    if (parts.empty()) return Malformed(expr, pattern_start, "empty host name");
    // Cartesian product of the parts, leftmost varying slowest.
    std::vector<std::string> expanded = {""};
    for (const Part& part : parts) {
      std::vector<std::string> next;
      if (!part.is_group) {
        for (std::string& s : expanded) s += part.literal;
        continue;
      }
      if (expanded.size() * part.choices.size() + names.size() > kMaxHostlistNames) {
        return Malformed(expr, pattern_start,
                         fmt::format("expands to more than {} names", kMaxHostlistNames));
      }
      next.reserve(expanded.size() * part.choices.size());
      for (const std::string& prefix : expanded) {
        for (const std::string& choice : part.choices) next.push_back(prefix + choice);
      }
      expanded = std::move(next);
    }
    for (std::string& s : expanded) names.push_back(std::move(s));
    if (i < expr.size()) {
      ++i;  // the comma
      if (i == expr.size()) return Malformed(expr, i - 1, "trailing ','");
    }
  }
  return names;
}

std::string CompressHostlist(const std::vector<std::string>& names) {
  // Group by (prefix, digit width) of a trailing number; keep first-seen order.
  struct Group {
    std::string prefix;
    int width = 0;
    std::vector<unsigned long> numbers;
  };
  std::vector<Group> groups;
  std::map<std::pair<std::string, int>, size_t> index;
  std::vector<std::string> out_items;
  std::vector<std::pair<bool, size_t>> order;  // (is_group, index into groups or out_items)
  for (const std::string& name : names) {
    size_t d = name.size();
    while (d > 0 && std::isdigit(static_cast<unsigned char>(name[d - 1]))) --d;
    if (d == name.size() || name.size() - d > 9) {
      order.emplace_back(false, out_items.size());
      out_items.push_back(name);
      continue;
    }
    std::string digits = name.substr(d);
    int width = digits.size() > 1 && digits[0] == '0' ? static_cast<int>(digits.size()) : 0;
    auto key = std::make_pair(name.substr(0, d), width);
    auto it = index.find(key);
    if (it == index.end()) {
      it = index.emplace(key, groups.size()).first;
      groups.push_back({key.first, width, {}});
      order.emplace_back(true, it->second);
    }
    groups[it->second].numbers.push_back(std::stoul(digits));
  }
  std::string out;
  for (auto [is_group, i] : order) {
    if (!out.empty()) out += ',';
    if (!is_group) {
      out += out_items[i];
      continue;
    }
    const Group& g = groups[i];
    if (g.numbers.size() == 1) {
      out += fmt::format("{}{:0{}}", g.prefix, g.numbers[0], g.width);
      continue;
    }
    std::string body;
    for (size_t k = 0; k < g.numbers.size();) {
      size_t e = k;
      while (e + 1 < g.numbers.size() && g.numbers[e + 1] == g.numbers[e] + 1) ++e;
      if (!body.empty()) body += ',';
      body += e == k ? fmt::format("{:0{}}", g.numbers[k], g.width)
                     : fmt::format("{:0{}}-{:0{}}", g.numbers[k], g.width, g.numbers[e], g.width);
      k = e + 1;
    }
    out += fmt::format("{}[{}]", g.prefix, body);
  }
  return out;
}

}  // namespace agentrt
