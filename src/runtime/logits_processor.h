// LogitsProcessor: what a request asks done to its logits before the draw, on the host, in vLLM's order:
// the output constraint (output_constraint.h), logit_bias and min_tokens (the end ids held back), then the
// repetition, frequency and presence penalties, then min_p, a cut relative to the likeliest token at the
// sampling temperature (top-k and top-p follow in the sampler). A sequence that asks for any of these is
// sampled on the host (the scheduler's host path, where the step returns its logits), so no device kernel
// needs them, and its draws stay the same on every backend. Log-probabilities stay those of the raw logits,
// as vLLM reports them.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "runtime/output_constraint.h"

namespace hlm {

struct LogitsAdjustments {
  // > 0; 1: none. A token of the prompt or the output so far: its logit x becomes x / r if x > 0, else
  // x · r (HF's and vLLM's repetition penalty).
  float repetition_penalty = 1.0f;
  float frequency_penalty = 0.0f;  // subtracted once per occurrence of the token in the output so far
  float presence_penalty = 0.0f;   // subtracted once if the token occurs in the output so far
  float min_p = 0.0f;              // [0, 1]: tokens less likely than min_p times the likeliest are cut
  int64_t min_tokens = 0;          // the end ids (eos, stop ids) are held back until this many tokens
  std::vector<std::pair<int32_t, float>> logit_bias;  // (token id, added to its logit)
  // Set: every id that cannot continue the output is cut, and once it is complete only the end ids remain.
  OutputConstraint constraint;

  // Something that changes every draw (all but min_tokens, which stops mattering once reached).
  bool shapes_every_draw() const;
  bool active() const { return shapes_every_draw() || min_tokens > 0; }
};

// Checks ranges (repetition_penalty > 0, min_p in [0, 1], min_tokens >= 0, finite values, bias ids in
// [0, vocab)) with messages naming the command-line flag where there is one (the server checks its fields
// first, by their names).
void validate(const LogitsAdjustments& a, int64_t vocab);

// Below this, an adjusted logit is out of the draw: the host sampler takes only finite logits, and the
// weight exp((x - max) / T) of this one is 0 at any temperature.
inline constexpr float kMaskedLogit = -1e30f;

class LogitsProcessor {
 public:
  // end_ids: the ids that would end the sequence (min_tokens holds them back).
  LogitsProcessor(const LogitsAdjustments& a, const std::vector<int32_t>& prompt,
                  std::vector<int32_t> end_ids);

  // Whether the next draw needs apply(): min_tokens alone stops mattering once reached.
  bool needed() const { return a_.shapes_every_draw() || generated_ < a_.min_tokens; }
  // A token the sequence produced.
  void observe(int32_t id);
  // logits: host F32 [vocab], finite, adjusted in place. temperature: the sequence's sampling temperature
  // (min_p compares probabilities at it; greedy sampling leaves min_p out, the likeliest being kept).
  void apply(float* logits, int64_t vocab, float temperature) const;

 private:
  LogitsAdjustments a_;
  bool active_ = false;
  std::vector<int32_t> end_ids_;
  std::unordered_set<int32_t> seen_;             // ids of the prompt and of the output so far
  std::unordered_map<int32_t, int64_t> counts_;  // occurrences in the output so far
  int64_t generated_ = 0;
  std::optional<ConstrainedOutput> constraint_;
};

}  // namespace hlm
