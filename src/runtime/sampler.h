// Sampler: greedy when temperature is 0, else temperature / top-k / top-p sampling. Each sequence has its
// own random stream seeded from (seed, sequence index), so a sequence's tokens do not depend on what
// else is in the batch.
#pragma once

#include <cstdint>
#include <random>

#include "base/tensor.h"

namespace hlm {

struct SamplingParams {
  float temperature = 0.0f;
  int64_t top_k = 0;   // 0: no limit
  float top_p = 1.0f;  // 1: no nucleus cut
  uint64_t seed = 0;
};

// Checks ranges (temperature >= 0, top_k >= 0, 0 < top_p <= 1) with messages naming the flag.
void validate(const SamplingParams& p);

// Index of the largest value; the lowest index on ties (as torch.argmax).
int32_t argmax(const float* logits, int64_t n);

class Sampler {
 public:
  Sampler(const SamplingParams& params, uint64_t stream);
  // logits: host F32 [vocab].
  int32_t sample(const Tensor& logits);

 private:
  SamplingParams params_;
  std::mt19937_64 rng_;
};

}  // namespace hlm
