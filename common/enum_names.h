// One table per enum names its values both ways: the word a value is written
// as (logs, JSON, flags) and the value a word reads back as. A name function
// and a parse function over the same table cannot drift apart.
#pragma once

#include <cstddef>
#include <optional>
#include <string_view>

namespace agentrt {

template <typename E>
struct EnumName {
  E value;
  std::string_view name;
};

// The name of `value`; "unknown" for a value the table lacks (a cast from a
// bad integer).
template <typename E, size_t N>
constexpr std::string_view NameIn(const EnumName<E> (&names)[N], E value) {
  for (const EnumName<E>& n : names) {
    if (n.value == value) return n.name;
  }
  return "unknown";
}

// The value named `name`; nullopt for a word the table lacks.
template <typename E, size_t N>
constexpr std::optional<E> ValueIn(const EnumName<E> (&names)[N], std::string_view name) {
  for (const EnumName<E>& n : names) {
    if (n.name == name) return n.value;
  }
  return std::nullopt;
}

// One enum's values as another API's (a data type as NCCL's or MPI's): a table
// of pairs instead of a switch.
template <typename From, typename To>
struct EnumPair {
  From from;
  To to;
};

// The value `from` maps to; `otherwise` for a value the table lacks.
template <typename From, typename To, size_t N>
constexpr To MappedIn(const EnumPair<From, To> (&pairs)[N], From from, To otherwise) {
  for (const EnumPair<From, To>& p : pairs) {
    if (p.from == from) return p.to;
  }
  return otherwise;
}

}  // namespace agentrt
