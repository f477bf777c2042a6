// Generation driver on rank 0 for a fixed set of prompts (the `generate` command): runs them through the
// continuous-batching Scheduler, the same mechanism the server uses, and collects each one's tokens.
#pragma once

#include <cstdint>
#include <vector>

#include "runtime/engine.h"
#include "runtime/sampler.h"

namespace hlm {

struct GenerateOptions {
  int64_t max_new_tokens = 16;
  int64_t step_tokens = 512;  // token budget of one step (prefill chunk size)
  bool stop_at_eos = true;
  SamplingParams sampling;
};

// Generates for every prompt; returns the new tokens of each, in prompt order. A sequence stops after
// max_new_tokens or, with stop_at_eos, after emitting an end-of-sequence id of the model's config.
std::vector<std::vector<int32_t>> generate(Engine& engine, const std::vector<std::vector<int32_t>>& prompts,
                                           const GenerateOptions& options);

}  // namespace hlm
