#include "runtime/logits_processor.h"

#include <algorithm>
#include <cmath>

#include "base/error.h"
#include "runtime/sampler.h"

namespace hlm {

bool LogitsAdjustments::shapes_every_draw() const {
  return repetition_penalty != 1.0f || frequency_penalty != 0.0f || presence_penalty != 0.0f ||
         min_p > 0.0f || !logit_bias.empty() || static_cast<bool>(constraint);
}

void validate(const LogitsAdjustments& a, int64_t vocab) {
  HLM_CHECK(std::isfinite(a.repetition_penalty) && a.repetition_penalty > 0.0f,
            "--repetition-penalty must be > 0 (got {})", a.repetition_penalty);
  HLM_CHECK(std::isfinite(a.frequency_penalty), "--frequency-penalty must be finite (got {})",
            a.frequency_penalty);
  HLM_CHECK(std::isfinite(a.presence_penalty), "--presence-penalty must be finite (got {})",
            a.presence_penalty);
  HLM_CHECK(a.min_p >= 0.0f && a.min_p <= 1.0f, "--min-p must be in [0, 1] (got {})", a.min_p);
  HLM_CHECK(a.min_tokens >= 0, "min_tokens must be >= 0 (got {})", a.min_tokens);
  validate(a.constraint, vocab);
  for (const auto& [id, bias] : a.logit_bias) {
    HLM_CHECK(id >= 0 && id < vocab, "logit_bias: token id {} is outside the vocabulary [0, {})", id, vocab);
    HLM_CHECK(std::isfinite(bias), "logit_bias: the bias of token {} must be finite (got {})", id, bias);
  }
}

LogitsProcessor::LogitsProcessor(const LogitsAdjustments& a, const std::vector<int32_t>& prompt,
                                 std::vector<int32_t> end_ids)
    : a_(a), active_(a.active()), end_ids_(std::move(end_ids)) {
  if (a_.constraint) constraint_.emplace(a_.constraint, end_ids_);
  if (a_.repetition_penalty != 1.0f) seen_.insert(prompt.begin(), prompt.end());
}

void LogitsProcessor::observe(int32_t id) {
  ++generated_;
  if (!active_) return;
  seen_.insert(id);
  ++counts_[id];
  if (constraint_) constraint_->observe(id);
}

void LogitsProcessor::apply(float* x, int64_t vocab, float temperature) const {
  if (constraint_) constraint_->mask(x, vocab, kMaskedLogit);
  for (const auto& [id, bias] : a_.logit_bias) {
    if (x[id] != kMaskedLogit) x[id] += bias;
  }
  if (generated_ < a_.min_tokens) {
    for (int32_t id : end_ids_) {
      if (id >= 0 && id < vocab) x[id] = kMaskedLogit;
    }
  }
  if (a_.repetition_penalty != 1.0f) {
    for (int32_t id : seen_) {
      if (x[id] == kMaskedLogit) continue;
      x[id] = x[id] > 0.0f ? x[id] / a_.repetition_penalty : x[id] * a_.repetition_penalty;
    }
  }
  for (const auto& [id, n] : counts_) {
    if (x[id] == kMaskedLogit) continue;
    x[id] -= a_.frequency_penalty * static_cast<float>(n) + a_.presence_penalty;
  }
  // p_i < min_p · p_max at temperature T  <=>  x_i < x_max + T · ln(min_p).
  if (a_.min_p > 0.0f && temperature >= kGreedyBelowTemperature) {
    const float top = *std::max_element(x, x + vocab);
    const float cut = top + temperature * std::log(a_.min_p);
    for (int64_t i = 0; i < vocab; ++i) {
      if (x[i] < cut) x[i] = kMaskedLogit;
    }
  }
}

}  // namespace hlm
