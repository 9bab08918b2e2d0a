// SLURM hostlist expressions: `gpu[01-04,07],cpu1` ⇄ gpu01 gpu02 gpu03 gpu04 gpu07 cpu1.
// Several bracket groups multiply (`r[1-2]n[1-2]` → r1n1 r1n2 r2n1 r2n2); zero
// padding follows the width of the range's lower bound, as in SLURM.
// Pure functions; thread-safe.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace agentrt {

// Upper bound on the names one expression may produce (a typo such as
// `n[1-99999999]` fails instead of exhausting memory).
inline constexpr size_t kMaxHostlistNames = 1 << 20;

// Expands `expr`. Errors say what is malformed and at which character offset.
Result<std::vector<std::string>> ExpandHostlist(std::string_view expr);

// The shortest common form of `names` for sbatch --nodelist / display; names
// that differ only in a trailing number are folded into one bracket group.
// Order of first appearance is kept.
std::string CompressHostlist(const std::vector<std::string>& names);

}  // namespace agentrt
