// Corridor: a user-defined environment, written against the installed agentrt
// headers exactly as one would in one's own project (see envs/dummy.h in
// agentrt for the commented tutorial of the Env interface).
//
// The agent stands in cell 0 of a corridor of `length` cells. Actions:
// Discrete(2), 0 = step left, 1 = step right (a wall stops it at cell 0). The
// episode terminates with reward +1 when it reaches the last cell; every step
// costs `step_cost`; the episode is truncated after `max_steps` steps.
// Observation: one-hot of the current cell, Box({length}, 0, 1).
//
// A random walk needs ~length^2 steps to reach the end, so with length 16 and
// max_steps 64 it rarely does; a learner that works reaches it in length - 1.
// `step_us` makes every step take that long, standing in for a real
// simulator's cost (the corridor itself steps in nanoseconds).
#pragma once

#include <memory>
#include <nlohmann/json.hpp>

#include "common/status.h"
#include "envs/env.h"

class Corridor final : public agentrt::Env {
 public:
  Corridor(int length, int max_steps, float step_cost, int step_us = 0);

  const agentrt::Space& observation_space() const override { return observation_space_; }
  const agentrt::Space& action_space() const override { return action_space_; }
  void Reset(std::optional<uint64_t> seed, std::span<float> obs) override;
  agentrt::StepResult Step(std::span<const float> action, std::span<float> obs) override;

  int position() const { return position_; }
  int length() const { return length_; }

 private:
  void Observe(std::span<float> obs) const;

  int length_;
  int max_steps_;
  float step_cost_;
  int step_us_;
  agentrt::Space observation_space_;
  agentrt::Space action_space_;
  int position_ = 0;
  int elapsed_ = 0;
};

// {"length": 16, "max_steps": 64, "step_cost": 0.01, "step_us": 0}; errors name the key.
agentrt::Result<std::unique_ptr<agentrt::Env>> MakeCorridor(const nlohmann::json& params);
