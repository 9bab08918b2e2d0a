// Loads and validates agents.yaml into a Config (plan/config.h).
//
// Every error is one line: `file:line:column: key 'agents[1].gpus': expected
// ...; did you mean 'gpus'?`. Hostile input is stopped before yaml-cpp sees it
// (yaml-cpp recurses on nesting): a size cap, control bytes, nesting depth and
// anchor/alias counts are checked by a linear pre-scan, and the conversion
// walks at most `max_nodes` YAML nodes so an alias bomb cannot expand.
//
// Thread-safe (no shared state). Blocking file I/O.
#pragma once

#include <cstddef>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "plan/config.h"

namespace agentrt {

struct LoadLimits {
  size_t max_bytes = 1 << 20;  // larger files are rejected before they are read
  int max_depth = 64;          // nesting of maps/sequences (block and flow)
  int max_anchors = 64;        // `&name` occurrences
  int max_aliases = 64;        // `*name` occurrences
  size_t max_nodes = 250000;   // YAML nodes visited while converting (aliases count each time)
};

// What is wrong with an agent's `args`, as its program sees it: the key (""
// when the args as a whole) and the message.
struct ArgsProblem {
  std::string key;
  std::string message;
};
// Checks `args` with the declarations the program itself uses at start-up.
using ArgsValidator = std::function<std::optional<ArgsProblem>(const nlohmann::json& args)>;

struct LoadOptions {
  LoadLimits limits;
  // Command-line overrides `section.key=value` applied to the YAML before it is
  // validated, e.g. `bus.port=21000`, `run.name=test`, `defaults.restart.max_restarts=0`.
  // The value is parsed as YAML (`cluster.ports={first: 21000, last: 21999}`).
  std::vector<std::string> overrides;
  // The folder relative paths in the config (command, workdir) are taken
  // from. LoadConfigFile: the file's folder unless set; strings: the working
  // directory unless set.
  std::string base_dir;
  // Validators of `args` by program name (the basename of the command's first
  // word, e.g. "agent-worker"); a problem fails the load at the key's
  // file:line:column.
  std::map<std::string, ArgsValidator> args_validators;
};

// Reads, pre-scans, parses and validates `path`.
Result<Config> LoadConfigFile(const std::string& path, const LoadOptions& options = {});
// Same for text already in memory; `source` names it in messages.
Result<Config> LoadConfigString(std::string_view text, std::string_view source = "<string>",
                                const LoadOptions& options = {});

// An inventory file (`agentctl plan --cluster FILE`): a YAML file holding a
// `cluster:` block of the agents.yaml shape. Its nodes replace `config`'s, and
// its ports replace `config`'s when it states them.
Status ApplyClusterFile(const std::string& path, Config& config, const LoadLimits& limits = {});

// The linear pre-scan alone (exposed for tests): size, control bytes, nesting
// depth, anchor and alias counts. `source` names the text in messages.
Status PrescanYaml(std::string_view text, std::string_view source, const LoadLimits& limits = {});

// Every setting with its type, default and doc, one per line (`bus.port int 0 ...`),
// for `agentctl validate --settings`.
std::string DescribeSettings();

// Every leaf key the loader accepts, spelled as DescribeSettings spells it
// ("agents[].workdir", "pbt[].hyperparameters.<arg>.min"), from the same key
// lists the loader checks maps against (a test compares the two).
std::vector<std::string> AcceptedSettingKeys();

// The closest of `candidates` to `word` when it is a plausible typo, else "".
std::string ClosestMatch(std::string_view word, const std::vector<std::string>& candidates);

}  // namespace agentrt
