// `agentctl validate --settings`: every setting the loader accepts, with its
// type, default and doc (DescribeSettings, AcceptedSettingKeys).
#include <type_traits>

#include "scheduler/loader_internal.h"

namespace agentrt {

using namespace loader_internal;  // NOLINT(google-build-using-namespace): its own insides

namespace {

// The type a setting's line in `validate --settings` names.
template <typename T>
std::string TypeName() {
  if constexpr (std::is_same_v<T, bool>) {
    return "bool";
  } else if constexpr (std::is_integral_v<T>) {
    return "int";
  } else if constexpr (std::is_floating_point_v<T>) {
    return "float";
  } else if constexpr (std::is_same_v<T, std::string>) {
    return "string";
  } else {
    static_assert(std::is_same_v<T, std::vector<std::string>>, "a setting of another type");
    return "list";
  }
}

std::string Show(const std::string& v) { return fmt::format("\"{}\"", v); }
std::string Show(const std::vector<std::string>& v) {
  return fmt::format("[{}]", fmt::join(v, ", "));
}
std::string Show(bool v) { return v ? "true" : "false"; }
template <typename T>
std::string Show(const T& v) {
  return fmt::format("{}", v);
}

}  // namespace

std::string DescribeSettings() {
  std::string out;
  auto line = [&out](const std::string& key, const std::string& type, const std::string& def,
                     const char* doc) {
    out += fmt::format("{:<34} {:<7} {:<14} {}\n", key, type, def, doc);
  };
  // One settings block: its X-macro list, the struct holding its defaults, its key prefix.
#define AGENTRT_LINE(type, name, default_value, doc) \
  line(prefix + #name, TypeName<type>(), Show(d.name), doc);
#define AGENTRT_BLOCK(Type, LIST, key_prefix) \
  {                                           \
    const Type d;                             \
    const std::string prefix = key_prefix;    \
    LIST(AGENTRT_LINE)                        \
  }
  AGENTRT_SETTING_BLOCKS(AGENTRT_BLOCK)
#undef AGENTRT_BLOCK
#undef AGENTRT_LINE
  // The list blocks: the same for keys that are declared beside their struct's members.
#define AGENTRT_LINE(name, type, default_value, doc) line(prefix + #name, type, default_value, doc);
#define AGENTRT_BLOCK(LIST, key_prefix)    \
  {                                        \
    const std::string prefix = key_prefix; \
    LIST(AGENTRT_LINE)                     \
  }
  AGENTRT_LIST_KEY_BLOCKS(AGENTRT_BLOCK)
#undef AGENTRT_BLOCK
#undef AGENTRT_LINE
  return out;
}

std::vector<std::string> AcceptedSettingKeys() {
  std::vector<std::string> keys;
  auto add = [&keys](const std::string& prefix, const std::vector<std::string>& names) {
    for (const std::string& name : names) keys.push_back(prefix + name);
  };
#define AGENTRT_ADD_BLOCK(Type, LIST, prefix) add(prefix, {LIST(AGENTRT_KEY_NAME)});
  AGENTRT_SETTING_BLOCKS(AGENTRT_ADD_BLOCK)
#undef AGENTRT_ADD_BLOCK
#define AGENTRT_ADD_LIST(LIST, prefix) add(prefix, {LIST(AGENTRT_LISTED_KEY)});
  AGENTRT_LIST_KEY_BLOCKS(AGENTRT_ADD_LIST)
#undef AGENTRT_ADD_LIST
  return keys;
}

}  // namespace agentrt
