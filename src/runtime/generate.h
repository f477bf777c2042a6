// Generation driver on rank 0 for a fixed set of prompts (the `generate` command): runs them through the
// continuous-batching Scheduler, the same mechanism the server uses, and collects each one's tokens.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "runtime/engine.h"
#include "runtime/logits_processor.h"
#include "runtime/sampler.h"

namespace hlm {

struct GenerateOptions {
  int64_t max_new_tokens = 16;
  int64_t step_tokens = 512;  // token budget of one step (prefill chunk size)
  bool stop_at_eos = true;
  SamplingParams sampling;
  LogitsAdjustments adjust;  // penalties and min_p (logits_processor.h)
  // Called for each token of prompt i as soon as it is sampled, so a front end can stream it.
  std::function<void(size_t i, int32_t token)> on_token;
  // Called once when prompt i stops: finished, or failed (see Generation::error). Not called for the
  // prompts still running when stop_requested ends generation.
  std::function<void(size_t i)> on_done;
  // Polled before each step; true ends generation there, every prompt keeping what it has (SIGINT).
  std::function<bool()> stop_requested;
};

// What one prompt produced: its new tokens, and why it stopped early when a step failed for it (empty
// otherwise). A failed sequence does not stop the others.
struct Generation {
  std::vector<int32_t> ids;
  std::string error;
  bool operator==(const Generation&) const = default;
};

// Generates for every prompt; returns each one's result, in prompt order. A sequence stops after
// max_new_tokens, with stop_at_eos after emitting an end-of-sequence id of the model's config, or when its
// logits are not finite (an error for that sequence only, docs in logits_guard.h).
std::vector<Generation> generate(Engine& engine, const std::vector<std::vector<int32_t>>& prompts,
                                 const GenerateOptions& options);

}  // namespace hlm
