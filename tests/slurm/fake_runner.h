// A CommandRunner that replays scripted outputs in order and records every
// command line it got: SLURM's commands without SLURM.
#pragma once

#include <deque>
#include <string>
#include <vector>

#include "slurm/command_runner.h"

namespace agentrt::slurm::testing {

class FakeRunner final : public CommandRunner {
 public:
  void Push(CommandOutput out) { outputs_.push_back(std::move(out)); }
  Result<CommandOutput> Run(const std::vector<std::string>& argv, double) override {
    calls.push_back(FormatCommand(argv));
    if (outputs_.empty()) return Internal("FakeRunner: no output scripted for " + calls.back());
    CommandOutput out = outputs_.front();
    outputs_.pop_front();
    return out;
  }
  std::vector<std::string> calls;

 private:
  std::deque<CommandOutput> outputs_;
};

}  // namespace agentrt::slurm::testing
