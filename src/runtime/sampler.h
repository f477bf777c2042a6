// Sampler: the sampling state of one sequence. Greedy when temperature is 0 (or below
// kGreedyBelowTemperature), else temperature / top-k / top-p sampling (SampleParams in ops/ops.h). The random
// draw of each token is a pure function of (seed, sequence index, tokens sampled so far), so a sequence's
// tokens depend neither on what else is in the batch nor on the backend that samples them.
#pragma once

#include <cstdint>

#include "base/tensor.h"
#include "ops/ops.h"

namespace hlm {

struct SamplingParams {
  float temperature = 0.0f;
  int64_t top_k = 0;   // 0: no limit
  float top_p = 1.0f;  // 1: no nucleus cut
  uint64_t seed = 0;
};

// Temperatures below this sample greedily (vLLM's rule too): 1 / T overflows fp32 as T nears the denormals,
// and well before that the softmax of logits / T is a one-hot of the maximum anyway.
inline constexpr float kGreedyBelowTemperature = 1e-5f;

// Checks ranges (temperature >= 0, top_k >= 0, 0 < top_p <= 1) with messages naming the flag.
void validate(const SamplingParams& p);

// Index of the largest value; the lowest index on ties (as torch.argmax).
int32_t argmax(const float* logits, int64_t n);

class Sampler {
 public:
  Sampler(const SamplingParams& params, uint64_t stream);
  // The parameters of the sequence's next token (for a backend's sample op); advances the counter.
  SampleParams next();
  // Samples the next token on the host from logits: host F32 [vocab]; -1 if they are not finite.
  int32_t sample(const Tensor& logits);

 private:
  SamplingParams params_;
  uint64_t stream_;
  uint64_t counter_ = 0;
};

}  // namespace hlm
